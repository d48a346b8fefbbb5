"""JSON arrays: positional items, the rest, length bounds, ``contains`` and ``uniqueItems``.

``contains`` is a second array language intersected with the first (at least n elements also
match the contained schema; at most m when ``maxContains`` asks, using its negation).
``uniqueItems`` is enforceable when the items come from a small finite set of values: the set of
values already used is then the state of an automaton, emitted as rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from constrain.grammars.errors import SchemaError
from constrain.grammars.ir import EMPTY, NOTHING, Node, alt, intersect, optional, ref, repeat, seq
from constrain.grammars.json_schema.document import Sub
from constrain.grammars.json_schema.literals import dedupe_values
from constrain.grammars.json_schema.shapes import Shape

if TYPE_CHECKING:
    from constrain.grammars.json_schema.building import Layout, RuleSink, Values

__all__ = ["array_ir"]

MAX_UNIQUE_VALUES = 10


def _list(lay: Layout, first: Node, rest: Node, lo: int, hi: int | None, *, leading: bool) -> Node:
    """``lo..hi`` elements; ``leading``: no element came before (so no comma before the first)."""
    if hi is not None and hi < lo:
        return NOTHING
    more = seq(lay.comma, rest)
    if not leading:
        return repeat(more, lo, hi)
    if hi == 0:
        return EMPTY
    body = seq(first, repeat(more, max(lo - 1, 0), None if hi is None else hi - 1))
    return body if lo > 0 else optional(body)


def _wrap(lay: Layout, sink: RuleSink, body: Node) -> Node:
    return lay.container("[", body, "]", sink.surely_nonempty)


def array_ir(t: Values, lay: Layout, sink: RuleSink, sh: Shape) -> Node:
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
            extra_conj.append(t.doc.negation(c.sub))
    position_subs: list[list[Sub]] = []
    for i in range(width):
        declared = [a.prefix[i] if i < len(a.prefix) else a.items for a in sh.arrays]
        position_subs.append([s for s in declared if s is not None] + extra_conj)
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
    body = _list(lay, rest, rest, max(lo - n, 0), None if hi is None else hi - n, leading=(n == 0)) if (hi is None or hi > n) else (EMPTY if lo <= n else NOTHING)
    for i in range(n - 1, -1, -1):
        sep = lay.comma if i > 0 else EMPTY
        step = seq(sep, elems[i], body)
        body = step if i < lo else optional(step)
    node = _wrap(lay, sink, body)
    parts = [node]
    for c in sh.contains:
        if (c.min == 0 and c.max is None) or c.max == 0:
            continue
        parts.append(_contains(t, lay, sink, sh, c, rest_subs, width))
    if sh.unique and (hi is None or hi > 1):
        parts.append(_unique(t, lay, sink, sh, position_subs, rest_subs))
    return intersect(*parts) if len(parts) > 1 else node


def _contains(t: Values, lay: Layout, sink: RuleSink, sh: Shape, c: Any, rest_subs: list[Sub], width: int) -> Node:
    """Arrays with ``c.min``..``c.max`` elements matching ``c.sub`` (elements otherwise as ``items``)."""
    if width:
        raise SchemaError("'contains' together with prefixItems is not supported", c.sub.pointer, "contains")
    hit = t.value_rule(rest_subs + [c.sub], c.sub.pointer)
    if c.max is None:
        other = t.value_rule(rest_subs, sh.pointer + "/items")
    else:
        other = t.value_rule(rest_subs + [t.doc.negation(c.sub)], c.sub.pointer)
    others_after = repeat(seq(lay.comma, other))

    def at_least(m: int, more_max: int | None) -> Node:
        group = seq(lay.comma, hit, others_after)
        return seq(repeat(seq(other, lay.comma)), hit, others_after, repeat(group, m - 1, more_max))

    if c.min >= 1:
        body = at_least(c.min, None if c.max is None else c.max - 1)
    else:
        body = alt(optional(seq(other, others_after)), at_least(1, c.max - 1))
    return _wrap(lay, sink, body)


MAX_UNIQUE_STATES = 4096
MAX_INTEGER_SPAN = 32


def _finite_values(t: Values, subs: list[Sub]) -> list[Any] | None:
    """Every value satisfying all of ``subs`` when they are few and known (None otherwise)."""
    values: list[Any] = []
    for shape in t.shapes_of(subs):
        if shape.enums:
            got = t.norm.values(shape)
        elif shape.types <= {"null", "boolean"}:
            got = [v for v in (None, True, False) if t.norm.valid_shape(v, shape) is True]
        elif shape.types == {"integer"} and shape.lo is not None and shape.hi is not None \
                and shape.hi.value - shape.lo.value <= MAX_INTEGER_SPAN:
            lo, hi = int(shape.lo.value.to_integral_value("ROUND_FLOOR")), int(shape.hi.value.to_integral_value("ROUND_CEILING"))
            got = [v for v in range(lo, hi + 1) if t.norm.valid_shape(v, shape) is True]
        else:
            return None
        if got is None or len(got) > MAX_UNIQUE_VALUES * 4:
            return None
        values += got
    return dedupe_values(values)


def _unique(t: Values, lay: Layout, sink: RuleSink, sh: Shape, position_subs: list[list[Sub]], rest_subs: list[Sub]) -> Node:
    """Arrays whose elements are pairwise distinct, or a ``SchemaError`` where that is undecidable here.

    Elements at positions with a finite set of values (enum, const, booleans, small integer
    ranges) are tracked in the state (the set of values used so far); an element at any other
    position must provably differ from every other element (disjoint schemas: types, ranges...),
    and such a position may occur once only. The language written here is intersected with the
    array's own, so it only has to say "distinct", not "valid".
    """
    where = sh.unique[0]
    width = len(position_subs)
    hi = sh.max_items
    positions = position_subs + ([rest_subs] if hi is None or hi > width else [])
    rest_repeats = len(positions) > width and (hi is None or hi > width + 1)
    finite = [_finite_values(t, subs) for subs in positions]
    why = None
    if rest_repeats and finite[-1] is None:
        why = "the items beyond the prefix are not a small finite set of values"
    else:
        shapes = [t.shapes_of(subs) if f is None else None for subs, f in zip(positions, finite)]
        for i in range(len(positions)):
            for j in range(i + 1, len(positions)):
                if finite[i] is not None and finite[j] is not None:
                    continue
                a = shapes[i] or t.shapes_of(positions[i])
                b = shapes[j] or t.shapes_of(positions[j])
                if any(t.norm.overlap(x, y) for x in a for y in b):
                    why = f"items {i} and {j} may be equal and are not a small finite set of values"
                    break
            if why:
                break
    values = dedupe_values([v for f in finite if f is not None for v in f])
    if why is None and len(values) > 16:
        why = f"{len(values)} distinct values are too many to track"
    if why is None:
        node = _unique_automaton(t, lay, sink, where, positions, finite, values)
        if node is not None:
            return node
        why = "tracking the values already used needs too many states"
    if t.options.lenient:
        t.note(f"relaxed uniqueItems at {where}")
        return _wrap(lay, sink, t.any_list())
    raise SchemaError(f"cannot enforce 'uniqueItems': {why}; pass lenient=True to relax it", where, "uniqueItems")


def _unique_automaton(t: Values, lay: Layout, sink: RuleSink, where: str, positions: list[list[Sub]], finite: list[list[Any] | None],
                      values: list[Any]) -> Node | None:
    """Rules over states (position, values used); None when more than MAX_UNIQUE_STATES are reachable."""
    from constrain.grammars.json_schema.literals import hashable

    index = {hashable(v): i for i, v in enumerate(values)}
    spell = [t.value_literal(v, depth=lay.depth + 1) for v in values]
    allowed = [None if f is None else [index[hashable(v)] for v in f] for f in finite]
    last = len(positions) - 1
    prefix = sink.fresh_name(where + "#unique")
    name = lambda pos, mask: f"{prefix}@{pos},{mask}"
    todo = [(0, 0)]
    seen = {(0, 0)}
    rules: dict[str, Node] = {}
    while todo:
        pos, mask = todo.pop()
        if len(seen) > MAX_UNIQUE_STATES:
            return None
        options: list[Node] = [EMPTY]
        sep = lay.comma if pos or mask else EMPTY  # something came before
        nxt_pos = min(pos + 1, last)
        if pos <= last:
            values_here = allowed[pos]
            steps = ([(t.any_value(), mask)] if values_here is None else
                     [(spell[i], mask | 1 << i) for i in values_here if not mask >> i & 1])
            for elem, nxt_mask in steps:
                nxt = (nxt_pos if pos < last else last + 1 if allowed[pos] is None else last, nxt_mask)
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
                options.append(seq(sep, elem, ref(name(*nxt))))
        rules[name(pos, mask)] = alt(*options)
    for k, v in rules.items():
        sink.define(k, v)
    return _wrap(lay, sink, ref(name(0, 0)))
