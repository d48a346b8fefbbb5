"""JSON numbers as byte-level IR, exact at their bounds.

Ranges are built digit by digit (the classic numeric-range-to-regex construction), so
``minimum: 3, maximum: 117`` admits exactly 3..117 and ``exclusiveMinimum: 0.5`` admits 0.51 but
not 0.5 or 0.50. ``multipleOf`` is a remainder automaton over the digits, written as right-linear
rules (regular, expanded lazily by the compiler).

Bounded numbers and numbers with ``multipleOf`` are written without an exponent: checking
``1.5e3 <= 2000`` digit by digit is not worth its IR, and admitting fewer spellings never lets a
value out of bounds. Integers never have a fraction or exponent (``2``, not ``2.0``). Neither
spells negative zero.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from constrain.grammars.ir import EMPTY, NOTHING, Node, alt, byte_set, intersect, literal, optional, ref, repeat, seq

__all__ = ["Bound", "ANY_NUMBER", "ANY_INTEGER", "integer_ir", "number_ir", "multiple_of_rules", "to_decimal"]

DIGIT = byte_set(b"0123456789")
NONZERO = byte_set(b"123456789")
MINUS = literal("-")
DOT = literal(".")
EXPONENT = seq(byte_set(b"eE"), optional(byte_set(b"+-")), repeat(DIGIT, 1))
NATURAL = alt(literal("0"), seq(NONZERO, repeat(DIGIT)))  # 0 | [1-9][0-9]*
FRACTION = seq(DOT, repeat(DIGIT, 1))
ANY_INTEGER = seq(optional(MINUS), NATURAL)
ANY_NUMBER = seq(optional(MINUS), NATURAL, optional(FRACTION), optional(EXPONENT))
# A number with a fraction that is all zeros (or none): an integer value, spelled as JSON allows.
INTEGRAL_FRACTION = optional(seq(DOT, repeat(literal("0"), 1)))


@dataclass(frozen=True)
class Bound:
    """One side of a numeric range: ``value`` and whether the value itself is allowed."""

    value: Decimal
    inclusive: bool = True


def to_decimal(x: object) -> Decimal:
    """The exact decimal a JSON number denotes (floats through their shortest repr)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, Decimal)):
        raise TypeError(f"not a number: {x!r}")
    try:
        d = Decimal(repr(x)) if isinstance(x, float) else Decimal(x)
    except InvalidOperation as exc:  # pragma: no cover - repr of a float is always a decimal
        raise TypeError(f"not a number: {x!r}") from exc
    if not d.is_finite():
        raise TypeError(f"not a finite number: {x!r}")
    return d


def _digit(lo: int, hi: int) -> Node:
    return byte_set(range(0x30 + lo, 0x30 + hi + 1))


def _fixed_width(lo: int, hi: int, width: int) -> Node:
    """Decimal digit strings of exactly ``width`` digits with value lo..hi."""
    if width == 1:
        return _digit(lo, hi)
    unit = 10 ** (width - 1)
    (a0, ar), (b0, br) = divmod(lo, unit), divmod(hi, unit)
    if a0 == b0:
        return seq(_digit(a0, a0), _fixed_width(ar, br, width - 1))
    parts: list[Node] = []
    if ar != 0:
        parts.append(seq(_digit(a0, a0), _fixed_width(ar, unit - 1, width - 1)))
        a0 += 1
    tail = None
    if br != unit - 1:
        tail = seq(_digit(b0, b0), _fixed_width(0, br, width - 1))
        b0 -= 1
    if a0 <= b0:
        parts.append(seq(_digit(a0, b0), repeat(DIGIT, width - 1, width - 1)))
    if tail is not None:
        parts.append(tail)
    return alt(*parts)


def natural_range(lo: int, hi: int | None) -> Node:
    """Canonical decimal naturals (no leading zeros) in lo..hi; ``hi=None`` is unbounded."""
    lo = max(lo, 0)
    if hi is not None and hi < lo:
        return NOTHING
    parts: list[Node] = []
    width = len(str(lo))
    top = len(str(hi)) if hi is not None else width
    for w in range(width, top + 1):
        a = max(lo, 10 ** (w - 1) if w > 1 else 0)
        b = 10**w - 1 if hi is None else min(hi, 10**w - 1)
        if a <= b:
            parts.append(_fixed_width(a, b, w))
    if hi is None:
        parts.append(seq(NONZERO, repeat(DIGIT, width)))  # every longer natural
    return alt(*parts)


def integer_ir(lo: int | None, hi: int | None) -> Node:
    """JSON integers (``-?(0|[1-9][0-9]*)``) with value in lo..hi (None: unbounded side)."""
    parts: list[Node] = []
    if lo is None or lo < 0:  # negative part: -1 .. lo, i.e. "-" + naturals 1..-lo
        top = None if lo is None else -lo
        bottom = 1 if hi is None or hi >= -1 else -hi
        if top is None or bottom <= top:
            parts.append(seq(MINUS, natural_range(bottom, top)))
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo, 0) if lo is not None else 0, hi))
    return alt(*parts)


def _split(d: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    sign, digits, exp = d.normalize().as_tuple()
    assert isinstance(exp, int), d  # finite: to_decimal refuses the rest
    text = "".join(map(str, digits))
    if exp >= 0:
        return int(text + "0" * exp), ""
    text = text.rjust(-exp + 1, "0")
    return int(text[:exp]), text[exp:].rstrip("0")


def _fraction_at_least(digits: str, inclusive: bool) -> Node:
    """``(\\.[0-9]+)?`` whose value 0.F is >= 0.digits (> when not inclusive)."""
    if not digits:
        rest_nonzero = seq(repeat(DIGIT), NONZERO, repeat(DIGIT))
        return optional(FRACTION) if inclusive else seq(DOT, rest_nonzero)
    # After the dot: walk digits; bigger digit -> anything; same digit -> continue.
    tail: Node = seq(repeat(DIGIT), NONZERO, repeat(DIGIT)) if not inclusive else repeat(DIGIT)
    for d in reversed(digits):
        k = int(d)
        bigger = seq(_digit(k + 1, 9), repeat(DIGIT)) if k < 9 else NOTHING
        tail = alt(bigger, seq(_digit(k, k), tail))
    return seq(DOT, tail)  # no fraction (value 0) is < 0.digits


def _fraction_at_most(digits: str, inclusive: bool) -> Node:
    """``(\\.[0-9]+)?`` whose value 0.F is <= 0.digits (< when not inclusive)."""
    if not digits:
        return INTEGRAL_FRACTION if inclusive else NOTHING
    # After the dot: smaller digit -> anything; same digit -> continue (may stop: 0.F < 0.digits).
    tail: Node = repeat(literal("0")) if inclusive else NOTHING
    for i in range(len(digits) - 1, -1, -1):
        k = int(digits[i])
        smaller = seq(_digit(0, k - 1), repeat(DIGIT)) if k > 0 else NOTHING
        stop_ok = EMPTY if i + 1 < len(digits) else NOTHING  # 0.d1..di < 0.digits: later digits non-zero
        same = seq(_digit(k, k), alt(stop_ok, tail)) if i + 1 < len(digits) else seq(_digit(k, k), tail)
        tail = alt(smaller, same)
    return alt(EMPTY, seq(DOT, tail))


def _nonneg_number(lo: Bound | None, hi: Bound | None) -> Node:
    """Non-negative numbers ``I(.F)?`` in [lo, hi] (lo >= 0 or None meaning 0 inclusive)."""
    any_frac = optional(FRACTION)
    lo = lo or Bound(Decimal(0), True)
    li, lf = _split(lo.value)
    parts: list[Node] = []
    if hi is None:
        parts.append(seq(natural_range(li + 1, None), any_frac))
        parts.append(seq(natural_range(li, li), _fraction_at_least(lf, lo.inclusive)))
    else:
        ui, uf = _split(hi.value)
        if ui > li:
            parts.append(seq(natural_range(li + 1, ui - 1), any_frac))
            parts.append(seq(natural_range(li, li), _fraction_at_least(lf, lo.inclusive)))
            parts.append(seq(natural_range(ui, ui), _fraction_at_most(uf, hi.inclusive)))
        elif ui == li:
            both = intersect(_fraction_at_least(lf, lo.inclusive), _fraction_at_most(uf, hi.inclusive))
            parts.append(seq(natural_range(li, li), both))
    return alt(*parts)


def _negate(b: Bound | None) -> Bound | None:
    return None if b is None else Bound(-b.value, b.inclusive)


def number_ir(lo: Bound | None, hi: Bound | None, *, integer: bool = False) -> Node:
    """JSON numbers in [lo, hi]; exponents only when both sides are unbounded.

    ``integer`` restricts to integral values written without a fraction or exponent.
    """
    if lo is not None and hi is not None:
        if lo.value > hi.value or (lo.value == hi.value and not (lo.inclusive and hi.inclusive)):
            return NOTHING
    if integer:
        ilo = None if lo is None else _ceil_int(lo)
        ihi = None if hi is None else _floor_int(hi)
        if ilo is not None and ihi is not None and ilo > ihi:
            return NOTHING
        return integer_ir(ilo, ihi)
    if lo is None and hi is None:
        return ANY_NUMBER
    parts: list[Node] = []
    zero = Decimal(0)
    # Non-negative side: [max(lo, 0), hi].
    if hi is None or hi.value > zero or (hi.value == zero and hi.inclusive):
        nlo = lo if lo is not None and lo.value >= zero else None
        parts.append(_nonneg_number(nlo, hi))
    # Negative side: -y with y in (0, -lo] ∩ [-hi, ...).
    if lo is None or lo.value < zero:
        ylo = Bound(zero, False) if hi is None or hi.value >= zero else _negate(hi)
        parts.append(seq(MINUS, _nonneg_number(ylo, _negate(lo))))  # ylo > 0: no -0
    return alt(*parts)


def _ceil_int(b: Bound) -> int:
    v = b.value
    n = int(v.to_integral_value(rounding="ROUND_CEILING"))
    return n + 1 if n == v and not b.inclusive else n


def _floor_int(b: Bound) -> int:
    v = b.value
    n = int(v.to_integral_value(rounding="ROUND_FLOOR"))
    return n - 1 if n == v and not b.inclusive else n


def multiple_of_rules(step: Decimal, prefix: str) -> tuple[dict[str, Node], Node] | None:
    """Right-linear rules for unsigned ``I(.F)?`` spellings whose value is a multiple of ``step``.

    With ``step = p / 10**q`` a value is a multiple when the digits of I followed by the first q
    digits of F (padded with zeros) spell a multiple of p and every later digit of F is 0: a
    remainder automaton modulo p. Returns (rules, start), or None when it would be too big.
    """
    _, digits, exp = step.normalize().as_tuple()
    assert isinstance(exp, int), step  # finite: to_decimal refuses the rest
    p = int("".join(map(str, digits))) * (10 ** exp if exp > 0 else 1)
    q = max(-exp, 0)
    if p * (q + 2) > 20_000:
        return None
    name: Callable[..., str] = lambda *k: prefix + "_".join(map(str, k))
    rules: dict[str, Node] = {}
    zeros = repeat(literal("0"), 1)
    for r in range(p):
        after_dot = ref(name("f", r, 0)) if q else (zeros if r == 0 else NOTHING)
        rules[name("i", r)] = alt(
            *[seq(_digit(d, d), ref(name("i", (10 * r + d) % p))) for d in range(10)],
            EMPTY if (r * 10**q) % p == 0 else NOTHING,
            seq(DOT, after_dot),
        )
        for j in range(q):
            def nxt(d: int, r: int = r, j: int = j) -> Node:
                r2 = (10 * r + d) % p
                return ref(name("f", r2, j + 1)) if j + 1 < q else (repeat(literal("0")) if r2 == 0 else NOTHING)
            done = j > 0 and (r * 10 ** (q - j)) % p == 0
            rules[name("f", r, j)] = alt(*[seq(_digit(d, d), nxt(d)) for d in range(10)], EMPTY if done else NOTHING)
    return rules, ref(name("i", 0))
