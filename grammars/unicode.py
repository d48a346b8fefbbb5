"""Character classes over Unicode code points, compiled to UTF-8 byte-level IR.

Front ends speak of characters; the IR speaks of bytes. ``char_class`` bridges them: a set of
code-point ranges becomes an alternation of byte-range sequences that matches exactly the UTF-8
encodings of those code points (surrogates D800-DFFF are never produced: they are not valid UTF-8).
"""

from __future__ import annotations

from collections.abc import Iterable

from constrain.grammars.ir import NOTHING, Bytes, Node, alt, seq

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

# Code point bounds of each UTF-8 encoding length.
_LENGTH_BOUNDS = ((0x0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT))

Ranges = list[tuple[int, int]]


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, merged, inclusive ranges."""
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def negate(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """All code points (0..0x10FFFF) not in ``ranges``."""
    out: Ranges = []
    nxt = 0
    for lo, hi in normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


def subtract(ranges: Iterable[tuple[int, int]], minus: Iterable[tuple[int, int]]) -> Ranges:
    """``ranges`` without ``minus``."""
    return intersect_ranges(ranges, negate(minus))


def intersect_ranges(a: Iterable[tuple[int, int]], b: Iterable[tuple[int, int]]) -> Ranges:
    """Code points in both."""
    a, b = normalize(a), normalize(b)
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _byte_range(lo: int, hi: int) -> Node:
    return Bytes(((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1))


def _encode(cp: int, length: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass") if length > 1 else bytes([cp])


def _same_length(lo: int, hi: int, length: int) -> list[Node]:
    """Byte sequences for code points lo..hi, all of one UTF-8 length."""
    if length == 1:
        return [_byte_range(lo, hi)]
    a, b = _encode(lo, length), _encode(hi, length)
    return _split(a, b)


def _split(a: bytes, b: bytes) -> list[Node]:
    """Byte-range sequences matching every byte string between a and b (same length, UTF-8 tails)."""
    if len(a) == 1:
        return [_byte_range(a[0], b[0])]
    if a[0] == b[0]:
        return [seq(_byte_range(a[0], a[0]), tail) for tail in _split(a[1:], b[1:])]
    n = len(a) - 1
    low_tail, high_tail = bytes([0x80] * n), bytes([0xBF] * n)
    out: list[Node] = []
    first = a[0]
    if a[1:] != low_tail:
        out += [seq(_byte_range(first, first), t) for t in _split(a[1:], high_tail)]
        first += 1
    last = b[0]
    tail_end: list[Node] = []
    if b[1:] != high_tail:
        tail_end = [seq(_byte_range(last, last), t) for t in _split(low_tail, b[1:])]
        last -= 1
    if first <= last:
        out.append(seq(_byte_range(first, last), *([_byte_range(0x80, 0xBF)] * n)))
    return out + tail_end


def char_class(ranges: Iterable[tuple[int, int]]) -> Node:
    """One character whose code point lies in ``ranges``, as UTF-8 bytes (surrogates excluded)."""
    parts: list[Node] = []
    for lo, hi in subtract(ranges, [SURROGATES]):
        for length, (blo, bhi) in enumerate(_LENGTH_BOUNDS, start=1):
            l, h = max(lo, blo), min(hi, bhi)
            if l <= h:
                parts += _same_length(l, h, length)
    return alt(*parts) if parts else NOTHING


def any_char() -> Node:
    """Any single Unicode scalar value, UTF-8 encoded."""
    return char_class([(0, MAX_CODE_POINT)])
