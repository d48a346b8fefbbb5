"""Characters of JSON strings as byte-level IR: a code point may be written raw or escaped.

A JSON Schema speaks of decoded characters (``minLength`` counts code points, ``pattern`` sees the
decoded text), while the document holds their JSON spelling. ``json_char`` maps a set of code
points to every spelling of each: raw UTF-8 where JSON allows it, the short escapes, ``\\uXXXX``
in either hex case, and surrogate pairs for astral characters. One spelled character is one unit
of the IR, so ``repeat(json_char(...), min, max)`` counts decoded characters exactly.

``canonical_char`` admits a single spelling per character (the one ``json.dumps(...,
ensure_ascii=False)`` writes); object keys use it so that "not a declared key" is a plain
complement of the declared spellings and no key can appear twice under two spellings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from constrain.grammars.ir import NOTHING, Node, alt, byte_set, literal, repeat, seq
from constrain.grammars.unicode import MAX_CODE_POINT, char_class, intersect_ranges, normalize, subtract

__all__ = ["json_char", "canonical_char", "char_spellings", "ANY_JSON_CHAR", "string_body", "string_literal", "json_text"]

_SHORT_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x2F: b"\\/", 0x08: b"\\b", 0x0C: b"\\f",
                  0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
# Characters that may not appear raw inside a JSON string.
_NOT_RAW = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_SURROGATE = re.compile("[\ud800-\udfff]")
# A string json.dumps(ensure_ascii=False) writes as it is, between quotes: no quote, backslash,
# control character or lone surrogate (most keys and enum values).
_PLAIN = re.compile(r'[^"\\\x00-\x1f\ud800-\udfff]*')
_HIGH = (0xD800, 0xDBFF)
_LOW = (0xDC00, 0xDFFF)


def _hex_digit(lo: int, hi: int, upper: bool = True) -> Node:
    """One hex digit with value in lo..hi, either case unless ``upper`` is False (lowercase only)."""
    chars = set()
    for v in range(lo, hi + 1):
        chars.add(ord(f"{v:x}"))
        if upper:
            chars.add(ord(f"{v:X}"))
    return byte_set(chars)


def _fixed_width(lo: int, hi: int, width: int, base: int, digit) -> list[Node]:
    """Fixed-width digit strings (most significant first) whose value lies in lo..hi."""
    if width == 1:
        return [digit(lo, hi)]
    unit = base ** (width - 1)
    a, b = divmod(lo, unit), divmod(hi, unit)
    if a[0] == b[0]:
        return [seq(digit(a[0], a[0]), x) for x in _fixed_width(a[1], b[1], width - 1, base, digit)]
    out: list[Node] = []
    first, last = a[0], b[0]
    if a[1] != 0:
        out += [seq(digit(first, first), x) for x in _fixed_width(a[1], unit - 1, width - 1, base, digit)]
        first += 1
    tail: list[Node] = []
    if b[1] != unit - 1:
        tail = [seq(digit(last, last), x) for x in _fixed_width(0, b[1], width - 1, base, digit)]
        last -= 1
    if first <= last:
        out.append(seq(digit(first, last), *([digit(0, base - 1)] * (width - 1))))
    return out + tail


def _u_escape(ranges: Iterable[tuple[int, int]], upper: bool = True) -> Node:
    """``\\uXXXX`` spelling code units in ``ranges`` (each a 16-bit value)."""
    parts = []
    for lo, hi in ranges:
        parts += _fixed_width(lo, hi, 4, 16, lambda a, b: _hex_digit(a, b, upper))
    return seq(literal(b"\\u"), alt(*parts)) if parts else NOTHING


def _surrogate_pairs(lo: int, hi: int) -> Node:
    """``\\uHHHH\\uLLLL`` for astral code points lo..hi."""
    parts = []
    a, b = lo - 0x10000, hi - 0x10000
    ha, la = 0xD800 + (a >> 10), 0xDC00 + (a & 0x3FF)
    hb, lb = 0xD800 + (b >> 10), 0xDC00 + (b & 0x3FF)
    if ha == hb:
        return seq(_u_escape([(ha, ha)]), _u_escape([(la, lb)]))
    if la != 0xDC00:
        parts.append(seq(_u_escape([(ha, ha)]), _u_escape([(la, 0xDFFF)])))
        ha += 1
    if lb != 0xDFFF:
        parts.append(seq(_u_escape([(hb, hb)]), _u_escape([(0xDC00, lb)])))
        hb -= 1
    if ha <= hb:
        parts.append(seq(_u_escape([(ha, hb)]), _u_escape([_LOW])))
    return alt(*parts)


@lru_cache(maxsize=4096)
def _json_char(ranges: tuple[tuple[int, int], ...]) -> Node:
    parts = [char_class(subtract(ranges, _NOT_RAW))]
    for cp, esc in _SHORT_ESCAPES.items():
        if intersect_ranges(ranges, [(cp, cp)]):
            parts.append(literal(esc))
    bmp = subtract(intersect_ranges(ranges, [(0, 0xFFFF)]), [(0xD800, 0xDFFF)])
    parts.append(_u_escape(bmp))
    for lo, hi in intersect_ranges(ranges, [(0x10000, MAX_CODE_POINT)]):
        parts.append(_surrogate_pairs(lo, hi))
    return alt(*parts)


def json_char(ranges: Iterable[tuple[int, int]]) -> Node:
    """One decoded character whose code point is in ``ranges``, in any JSON spelling."""
    return _json_char(tuple(normalize(ranges)))


@lru_cache(maxsize=4096)
def _canonical_char(ranges: tuple[tuple[int, int], ...]) -> Node:
    parts = [char_class(subtract(ranges, _NOT_RAW))]
    for cp, esc in _SHORT_ESCAPES.items():
        if cp != 0x2F and intersect_ranges(ranges, [(cp, cp)]):
            parts.append(literal(esc))
    controls = subtract(intersect_ranges(ranges, [(0, 0x1F)]), [(c, c) for c in _SHORT_ESCAPES])
    parts.append(_u_escape(controls, upper=False))
    return alt(*parts)


def canonical_char(ranges: Iterable[tuple[int, int]]) -> Node:
    """One character in ``ranges`` spelled only as ``json.dumps(..., ensure_ascii=False)`` would."""
    return _canonical_char(tuple(normalize(ranges)))


ANY_JSON_CHAR: Node = json_char([(0, MAX_CODE_POINT)])
ANY_CANONICAL_CHAR: Node = canonical_char([(0, MAX_CODE_POINT)])


def string_body(min_length: int = 0, max_length: int | None = None, *, canonical: bool = False) -> Node:
    """The inside of a JSON string (no quotes) holding ``min_length..max_length`` characters."""
    return repeat(ANY_CANONICAL_CHAR if canonical else ANY_JSON_CHAR, min_length, max_length)


def json_text(value: Any, **dumps_options: Any) -> bytes:
    """``json.dumps(value, ensure_ascii=False)`` as UTF-8, with lone surrogates escaped (``\\ud83d``):
    they have no UTF-8 encoding, and their raw bytes are not JSON text."""
    if type(value) is str and not dumps_options and _PLAIN.fullmatch(value):
        return b'"' + value.encode("utf-8") + b'"'  # (json.dumps would make an encoder: 5x the time)
    text = json.dumps(value, ensure_ascii=False, **dumps_options)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def string_literal(text: str) -> Node:
    """The canonical spelling of ``text`` as a JSON string, quotes included."""
    return literal(json_text(text))


def char_spellings(cp: int) -> Node:
    """Every spelling of the one character ``cp``; a lone surrogate only as its ``\\uXXXX`` escape."""
    if _HIGH[0] <= cp <= _LOW[1]:
        return _u_escape([(cp, cp)])
    return json_char([(cp, cp)])
