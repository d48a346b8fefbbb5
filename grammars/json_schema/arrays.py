"""JSON arrays: positional items, the rest, length bounds, ``contains`` and ``uniqueItems``.

``contains`` is a second array language intersected with the first (at least n elements also
match the contained schema; at most m when ``maxContains`` asks, using its negation).
``uniqueItems`` is enforceable when the items come from a small finite set of values: the set of
values already used is then the state of an automaton, emitted as rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grammars.errors import SchemaError
from grammars.ir import EMPTY, NOTHING, Node, alt, intersect, literal, optional, ref, repeat, seq
from grammars.json_schema.document import Sub
from grammars.json_schema.literals import dedupe_values
from grammars.json_schema.shapes import Shape

if TYPE_CHECKING:
    from grammars.json_schema.translate import Translator

__all__ = ["array_ir"]

MAX_UNIQUE_VALUES = 10


def _list(t: "Translator", first: Node, rest: Node, lo: int, hi: int | None, *, leading: bool) -> Node:
    """``lo..hi`` elements; ``leading``: no element came before (so no comma before the first)."""
    if hi is not None and hi < lo:
        return NOTHING
    more = seq(t.comma, rest)
    if not leading:
        return repeat(more, lo, hi)
    if hi == 0:
        return EMPTY
    body = seq(first, repeat(more, max(lo - 1, 0), None if hi is None else hi - 1))
    return body if lo > 0 else optional(body)


def _wrap(t: "Translator", body: Node) -> Node:
    return seq(literal("["), t.ws, body, t.ws, literal("]"))


def array_ir(t: "Translator", sh: Shape) -> Node:
    """The IR of arrays satisfying the array keywords of ``sh``."""
    p = sh.pointer
    width = max((len(a.prefix) for a in sh.arrays), default=0)
    lo, hi = sh.min_items, sh.max_items
    extra_conj: list[Sub] = []
    for c in sh.contains:
        if c.max is not None and c.max < c.min:
            t.unsat(f"minContains {c.min} > maxContains {c.max}", c.sub.pointer)
            return NOTHING
        if c.max == 0:
            extra_conj.append(Sub({"not": c.sub.schema}, c.sub.base, c.sub.pointer))
    position_subs: list[list[Sub]] = []
    for i in range(width):
        subs = [a.prefix[i] if i < len(a.prefix) else a.items for a in sh.arrays]
        position_subs.append([s for s in subs if s is not None] + extra_conj)
    rest_subs = [a.items for a in sh.arrays if a.items is not None] + extra_conj
    for i, subs in enumerate(position_subs):
        if any(s.schema is False for s in subs):
            hi = i if hi is None else min(hi, i)
            break
    if any(s.schema is False for s in rest_subs):
        hi = width if hi is None else min(hi, width)
    if hi is not None and lo > hi:
        t.unsat(f"arrays need at least {lo} items but at most {hi} are allowed", p)
        return NOTHING
    elems = [t.value_rule(s, f"{p}/prefixItems/{i}") for i, s in enumerate(position_subs[: hi if hi is not None else width])]
    rest = t.value_rule(rest_subs, p + "/items")
    # Build from the end: positions beyond the prefix, then the prefix positions.
    n = len(elems)
    body = _list(t, rest, rest, max(lo - n, 0), None if hi is None else hi - n, leading=(n == 0)) if (hi is None or hi > n) else (EMPTY if lo <= n else NOTHING)
    for i in range(n - 1, -1, -1):
        sep = t.comma if i > 0 else EMPTY
        step = seq(sep, elems[i], body)
        body = step if i < lo else optional(step)
    node = _wrap(t, body)
    parts = [node]
    for c in sh.contains:
        if (c.min == 0 and c.max is None) or c.max == 0:
            continue
        parts.append(_contains(t, sh, c, rest_subs, width))
    if sh.unique and (hi is None or hi > 1):
        parts.append(_unique(t, sh, position_subs, rest_subs))
    return intersect(*parts) if len(parts) > 1 else node


def _contains(t: "Translator", sh: Shape, c: Any, rest_subs: list[Sub], width: int) -> Node:
    """Arrays with ``c.min``..``c.max`` elements matching ``c.sub`` (elements otherwise as ``items``)."""
    if width:
        raise SchemaError("'contains' together with prefixItems is not supported", c.sub.pointer, "contains")
    hit = t.value_rule(rest_subs + [c.sub], c.sub.pointer)
    if c.max is None:
        other = t.value_rule(rest_subs, sh.pointer + "/items")
    else:
        other = t.value_rule(rest_subs + [Sub({"not": c.sub.schema}, c.sub.base, c.sub.pointer)], c.sub.pointer)
    others_after = repeat(seq(t.comma, other))

    def at_least(m: int, more_max: int | None) -> Node:
        group = seq(t.comma, hit, others_after)
        return seq(repeat(seq(other, t.comma)), hit, others_after, repeat(group, m - 1, more_max))

    if c.min >= 1:
        body = at_least(c.min, None if c.max is None else c.max - 1)
    else:
        body = alt(optional(seq(other, others_after)), at_least(1, c.max - 1))
    return _wrap(t, body)


def _finite_values(t: "Translator", subs: list[Sub]) -> list[Any] | None:
    values: list[Any] = []
    for shape in t.shapes_of(subs):
        if shape.enums:
            got = t.norm.values(shape)
        elif shape.types <= {"null", "boolean"}:
            got = [v for v in (None, True, False) if t.norm.valid_shape(v, shape) is True]
        else:
            return None
        if got is None:
            return None
        values += got
    return dedupe_values(values)


def _unique(t: "Translator", sh: Shape, position_subs: list[list[Sub]], rest_subs: list[Sub]) -> Node:
    where = sh.unique[0]
    values = None if position_subs else _finite_values(t, rest_subs)
    if values is None or len(values) > MAX_UNIQUE_VALUES:
        if t.options.lenient:
            t.note(f"relaxed uniqueItems at {where}")
            return _wrap(t, t.any_list())
        why = "more than 10 distinct values" if values is not None else "not a small finite set of values"
        raise SchemaError(f"cannot enforce 'uniqueItems': the items are {why}; pass lenient=True to relax it",
                          where, "uniqueItems")
    spell = [t.value_literal(v) for v in values]
    k = len(values)
    prefix = t.fresh_name(where + "#unique")
    for mask in range((1 << k) - 1, -1, -1):
        options = [EMPTY]
        for i in range(k):
            if not mask >> i & 1:
                sep = t.comma if mask else EMPTY
                options.append(seq(sep, spell[i], ref(f"{prefix}@{mask | 1 << i}")))
        t.rules[f"{prefix}@{mask}"] = alt(*options)
    return _wrap(t, ref(f"{prefix}@0"))
