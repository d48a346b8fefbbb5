"""Code-point sets behind regex class escapes, case folding and ``\\p{..}``.

Python's ``re`` defines ``\\d \\w \\s`` through ``str`` predicates (Unicode-aware unless ``(?a)``);
ECMA-262 defines them as fixed ASCII-ish sets. Both are read off here as sorted ranges, computed
once per process from the running interpreter's Unicode data so they agree with its ``re``.
Case-insensitive matching follows ``re``'s rule (a character matches when its simple lowercase
is the lowercase of a pattern character, plus ``re``'s extra equivalences such as ``s``/``ſ``).
"""

from __future__ import annotations

import bisect
import functools
import unicodedata
from collections.abc import Callable
from functools import lru_cache

from constrain.grammars.unicode import MAX_CODE_POINT, Ranges, negate, normalize, subtract

__all__ = [
    "python_class", "ecma_class", "fold_python", "fold_ascii", "general_category",
    "ECMA_LINE_TERMINATORS", "UnknownProperty",
]

ASCII_DIGIT: Ranges = [(0x30, 0x39)]
ASCII_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
ASCII_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20)]  # Python's (?a)\s: [ \t\n\r\f\v]
# ECMA-262 WhiteSpace + LineTerminator (the set \s matches).
ECMA_SPACE: Ranges = normalize([
    (0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
    (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF),
])
ECMA_LINE_TERMINATORS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]


def _ranges_where(pred: Callable[[str], bool]) -> Ranges:
    """Ranges of all code points whose character satisfies ``pred`` (one pass, ~0.2 s)."""
    out: Ranges = []
    start = -1
    for cp in range(MAX_CODE_POINT + 2):
        hit = cp <= MAX_CODE_POINT and pred(chr(cp))
        if hit and start < 0:
            start = cp
        elif not hit and start >= 0:
            out.append((start, cp - 1))
            start = -1
    return out


@functools.cache
def _unicode_set(name: str) -> tuple[tuple[int, int], ...]:
    preds: dict[str, Callable[[str], bool]] = {
        "d": str.isdecimal,
        "w": lambda ch: ch.isalnum() or ch == "_",
        "s": str.isspace,
    }
    return tuple(_ranges_where(preds[name]))


def python_class(letter: str, ascii_only: bool) -> Ranges:
    """Ranges for Python's ``\\d \\w \\s \\D \\W \\S`` (``ascii_only``: the ``(?a)`` flag)."""
    base = letter.lower()
    if ascii_only:
        ranges = {"d": ASCII_DIGIT, "w": ASCII_WORD, "s": ASCII_SPACE}[base]
    else:
        ranges = list(_unicode_set(base))
    return negate(ranges) if letter.isupper() else list(ranges)


def ecma_class(letter: str) -> Ranges:
    """Ranges for ECMA-262's ``\\d \\w \\s \\D \\W \\S`` (ASCII digits/word chars, Unicode spaces)."""
    ranges = {"d": ASCII_DIGIT, "w": ASCII_WORD, "s": ECMA_SPACE}[letter.lower()]
    return negate(ranges) if letter.isupper() else list(ranges)


# --- case folding ------------------------------------------------------------------------------

try:  # CPython's own lowercase/cased tables, the ones `re` uses.
    from _sre import unicode_iscased as _iscased
    from _sre import unicode_tolower as _tolower
except ImportError:  # pragma: no cover - other interpreters
    def _tolower(cp: int) -> int:
        low = chr(cp).lower()
        return ord(low) if len(low) == 1 else cp

    def _iscased(cp: int) -> bool:
        ch = chr(cp)
        return ch.lower() != ch or ch.upper() != ch

try:
    from re._casefix import _EXTRA_CASES as _EXTRA
except ImportError:  # pragma: no cover - older/other interpreters
    _EXTRA = {}


@lru_cache(maxsize=1)
def _cased() -> tuple[list[int], list[int], Ranges]:
    """All cased code points (sorted), their simple lowercase, and those that lowercase elsewhere."""
    cps = [cp for cp in range(MAX_CODE_POINT + 1) if _iscased(cp)]
    lows = [_tolower(cp) for cp in cps]
    return cps, lows, normalize((cp, cp) for cp, low in zip(cps, lows) if low != cp)


def _contains(ranges: Ranges, cp: int) -> bool:
    i = bisect.bisect_right(ranges, (cp, MAX_CODE_POINT + 1)) - 1
    return i >= 0 and ranges[i][0] <= cp <= ranges[i][1]


def fold_python(ranges: Ranges) -> Ranges:
    """Every code point ``re`` (Unicode, IGNORECASE) matches against the set ``ranges``.

    ``re`` lowercases both sides: ``ch`` matches when ``tolower(ch)`` is in
    ``L = tolower(set) | extra(tolower(set))``. Only cased characters change under ``tolower``,
    so the work is proportional to the ~3000 cased code points, not to the size of the set.
    Memoised: case-insensitive literals fold the same few letters over and over.
    """
    return list(_fold_python(tuple(normalize(ranges))))


@functools.lru_cache(maxsize=4096)
def _fold_python(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    given = list(ranges)
    cps, lows, moved = _cased()
    lowered: set[int] = set()
    for cp, low in zip(cps, lows):
        if _contains(given, cp):
            lowered.add(low)
            lowered.update(_EXTRA.get(low, ()))
    # L: the set with each character replaced by its lowercase (uncased ones stay put).
    members = normalize(subtract(given, moved) + [(c, c) for c in lowered])
    # Result: members of L that are their own lowercase, plus characters lowering into L.
    extra = [(cp, cp) for cp, low in zip(cps, lows) if low != cp and _contains(members, low)]
    return tuple(normalize(subtract(members, moved) + extra))


def fold_ascii(ranges: Ranges) -> Ranges:
    """Case closure over ASCII letters only (``re`` with ``(?ai)``)."""
    ranges = normalize(ranges)
    extra = [(cp ^ 0x20, cp ^ 0x20) for cp in range(0x41, 0x7B)
             if chr(cp).isalpha() and _contains(ranges, cp)]
    return normalize(ranges + extra)


# --- \p{...} (ECMA) ----------------------------------------------------------------------------

class UnknownProperty(ValueError):
    """A ``\\p{..}`` name this module does not support."""


_GC_LONG = {
    "Letter": "L", "Cased_Letter": "LC", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
    "Mark": "M", "Combining_Mark": "M", "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc",
    "Enclosing_Mark": "Me", "Number": "N", "Decimal_Number": "Nd", "digit": "Nd",
    "Letter_Number": "Nl", "Other_Number": "No", "Punctuation": "P", "punct": "P",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
    "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf",
    "Other_Punctuation": "Po", "Symbol": "S", "Math_Symbol": "Sm", "Currency_Symbol": "Sc",
    "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Separator": "Z", "Space_Separator": "Zs",
    "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Other": "C", "Control": "Cc",
    "cntrl": "Cc", "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
}
_GC_SHORT = set(_GC_LONG.values()) | {"L", "M", "N", "P", "S", "Z", "C"}


@lru_cache(maxsize=1)
def _categories() -> dict[str, Ranges]:
    """Two-letter general category -> ranges, from ``unicodedata`` (one pass, built on first use)."""
    table: dict[str, Ranges] = {}
    prev, start = "", 0
    for cp in range(MAX_CODE_POINT + 2):
        cat = unicodedata.category(chr(cp)) if cp <= MAX_CODE_POINT else ""
        if cat != prev:
            if prev:
                table.setdefault(prev, []).append((start, cp - 1))
            prev, start = cat, cp
    return table


def general_category(name: str) -> Ranges:
    """Ranges for ``\\p{name}``: a General_Category value (short or long, optionally ``gc=``),
    or ``Any``/``ASCII``/``Assigned``. Scripts and other properties raise ``UnknownProperty``."""
    key, _, value = name.partition("=")
    if value:
        if key not in ("gc", "General_Category"):
            raise UnknownProperty(f"Unicode property {key!r} is not supported (only General_Category)")
        name = value
    elif name == "Any":
        return [(0, MAX_CODE_POINT)]
    elif name == "ASCII":
        return [(0, 0x7F)]
    elif name == "Assigned":
        return negate(_categories().get("Cn", []))
    short = _GC_LONG.get(name, name)
    if short not in _GC_SHORT:
        raise UnknownProperty(f"unknown or unsupported Unicode property {name!r}")
    table = _categories()
    if short == "LC":
        parts = ["Lu", "Ll", "Lt"]
    elif len(short) == 1:
        parts = [cat for cat in table if cat[0] == short]
    else:
        parts = [short]
    return normalize(r for cat in parts for r in table.get(cat, []))
