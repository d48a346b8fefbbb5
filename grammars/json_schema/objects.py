"""JSON objects: members in any order (an ``Unordered`` node), or in declaration order.

Keys beyond the declared ones are split by which ``patternProperties`` they match, and can never
spell a declared key (canonical spelling + complement), so no key repeats.

In declaration order (``property_order="declared"``, and objects that must hold an additional
member to satisfy a negated schema), optional members make the comma placement depend on
whether anything came before, and ``minProperties``/``maxProperties`` on how many came before;
both are the state of a small automaton over the declared properties (state = members written so
far, capped), emitted as rules; additional members come last.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from constrain.grammars.errors import SchemaError
from constrain.grammars.ir import (
    EMPTY,
    NOTHING,
    Node,
    alt,
    complement,
    intersect,
    literal,
    optional,
    ref,
    repeat,
    seq,
    unordered,
)
from constrain.grammars.json_schema.document import Sub
from constrain.grammars.json_schema.json_strings import ANY_CANONICAL_CHAR
from constrain.grammars.json_schema.shapes import Shape, Witness

if TYPE_CHECKING:
    from constrain.grammars.json_schema.building import Layout, RuleSink, Values

__all__ = ["object_ir"]

MAX_PATTERN_CLASSES = 64
MAX_COUNT_STATES = 20_000
MAX_WITNESSES = 3
INLINE_MEMBERS = 24


def object_ir(t: Values, lay: Layout, sink: RuleSink, sh: Shape) -> Node:
    """The IR of objects satisfying the object keywords of ``sh``."""
    order: dict[str, None] = {}
    required: set[str] = set()
    for part in sh.objects:
        for k, _ in part.properties:
            order.setdefault(k)
    for part in sh.objects:
        required.update(part.required)
        for k in part.required:
            order.setdefault(k)
    finite = _listed_names(sh)
    for k in finite or ():
        order.setdefault(k)  # every possible key declared: no key can repeat, counts stay exact
    members: list[tuple[str, list[Sub], Node, bool]] = []  # key, schemas, `"key":value`, required
    for k in order:
        subs = t.norm.property_subs(sh, k)
        if subs is not None and not all(t.norm.valid(k, part.names) is True for part in sh.objects if part.names):
            subs = None
        if subs is None:
            if k in required:
                t.unsat(f"required property {k!r} is not allowed (its schema, additionalProperties or "
                        "propertyNames forbids it)", sh.pointer)
                return NOTHING
            continue
        value = t.value_rule(subs, sh.pointer + "/properties/" + k)
        if value == NOTHING:
            if k in required:
                return NOTHING
            continue
        members.append((k, subs, seq(t.key_literal(k), lay.colon, value), k in required))
    extra = NOTHING if finite is not None else _additional_member(t, lay, sink, sh, list(order))
    witnesses = sh.witnesses
    # Additional members may repeat a key, and a repeated key is one property: counted as members
    # they could meet minProperties with fewer properties. In declaration order they come last and
    # count at most once.
    recounted = sh.min_props > 1 and extra != NOTHING
    if t.options.property_order == "any" and not witnesses and not recounted:
        body = unordered([(member, req) for _, _, member, req in members], extra,
                         first=lay.first, sep=lay.comma, last=lay.last, min=sh.min_props, max=sh.max_props)
        return lay.braces(body)
    if t.options.property_order == "any":
        why = ("an additional member must witness a negated schema" if witnesses else
               "additional members count once toward minProperties, since they may repeat a key")
        t.note(f"{sh.pointer}: members come in declaration order here ({why})")
    if recounted and len(members) < sh.min_props - 1:
        raise SchemaError(f"cannot enforce minProperties {sh.min_props}: with {len(members)} declared properties it "
                          "needs several additional ones, and their keys may repeat (one property, not several)",
                          sh.pointer, "minProperties")
    if len(witnesses) > MAX_WITNESSES:
        raise SchemaError(f"more than {MAX_WITNESSES} negated additionalProperties/patternProperties apply here",
                          sh.pointer, "not")
    if witnesses and (sh.min_props or sh.max_props is not None):
        raise SchemaError("a negated additionalProperties/patternProperties next to minProperties/maxProperties "
                          "is not supported", sh.pointer, "not")
    # an additional member may serve as several witnesses at once: one variant per set of them
    witness_extras = {mask: _additional_member(t, lay, sink, sh, list(order),
                                               [w for i, w in enumerate(witnesses) if mask >> i & 1])
                      for mask in range(1, 1 << len(witnesses))}
    return lay.braces(_members(t, lay, sink, sh, members, extra, witness_extras, sh.min_props, sh.max_props,
                               sh.pointer))


def _listed_names(sh: Shape) -> list[str] | None:
    """The only keys an object may have, when a ``propertyNames`` lists them (``enum``/``const``).

    Additional members repeat freely (their keys are a language, not a set), and a repeated key
    counts once for ``minProperties``; listed keys are declared instead, each at most once."""
    for part in sh.objects:
        schema = part.names.schema if part.names is not None else None
        if isinstance(schema, dict) and ("const" in schema or "enum" in schema):
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if isinstance(values, list):
                return [v for v in values if isinstance(v, str)]
    return None


def _additional_member(t: Values, lay: Layout, sink: RuleSink, sh: Shape, declared: list[str],
                       witnesses: Sequence[Witness] = ()) -> Node:
    """One ``key: value`` member whose key is not declared, or NOTHING when none may appear.

    With ``witnesses``: only members that serve as every one of them (key conditions and values)."""
    patterns = [(pat, sub, i) for i, part in enumerate(sh.objects) for pat, sub in part.patterns]
    if not patterns and any(p.additional is not None and p.additional.schema is False for p in sh.objects):
        return NOTHING
    if t.options.strict_properties and not patterns and all(p.additional is None for p in sh.objects):
        return NOTHING
    not_declared = complement(alt(*[t.key_body_literal(k) for k in declared])) if declared else None
    names = [t.property_names_ir(p.names) for p in sh.objects if p.names is not None]
    out: list[Node] = []
    may_overlap = [[i == j or _may_overlap(patterns[i][0], patterns[j][0]) for j in range(len(patterns))]
                   for i in range(len(patterns))]
    for chosen in _cliques(may_overlap, sh.pointer):
        subs: list[Sub] = []
        for i, part in enumerate(sh.objects):
            mine = [patterns[j][1] for j in chosen if patterns[j][2] == i]
            if mine:
                subs += mine
            elif part.additional is not None:
                subs.append(part.additional)
        if any(s.schema is False for s in subs):
            continue
        key_parts = [repeat(sink.shared("json-key-char", ANY_CANONICAL_CHAR))]
        for j, (pat, _, _i) in enumerate(patterns):
            if j not in chosen and not all(may_overlap[j][c] for c in chosen):
                continue  # disjoint from a chosen pattern: excluded already
            where = f"{sh.pointer}/patternProperties"
            node = t.pattern_ir(pat, where, canonical=True)
            key_parts.append(node if j in chosen else complement(node))
        if not_declared is not None:
            key_parts.append(not_declared)
        key_parts += names
        for witness in witnesses:
            key_parts += _witness_key(t, witness, sh.pointer)
            subs = subs + [witness.value]
        value = t.value_rule(subs, sh.pointer + "/additionalProperties")
        if value == NOTHING:
            continue
        key = seq(literal('"'), intersect(*key_parts), literal('"'))
        out.append(seq(key, lay.colon, value))
    return alt(*out)


def _witness_key(t: Values, w: Witness, pointer: str) -> list[Node]:
    """Key-body conditions of a witness member (canonical spelling)."""
    where = f"{pointer}/patternProperties"
    parts: list[Node] = []
    if w.names:
        parts.append(complement(alt(*[t.key_body_literal(k) for k in w.names])))
    parts += [complement(t.pattern_ir(p, where, canonical=True)) for p in w.patterns]
    if w.include is not None:
        parts.append(t.pattern_ir(w.include, where, canonical=True))
    return parts


def _members(t: Values, lay: Layout, sink: RuleSink, sh: Shape, members: list[tuple[str, list[Sub], Node, bool]],
             extra: Node, witness_extras: dict[int, Node], lo: int, hi: int | None, pointer: str) -> Node:
    """Members in order with commas, optional ones skippable, total count in [lo, hi], and every
    witness of ``sh`` present (state: members written so far, capped; witnesses seen)."""
    n = len(members)
    counting = lo > 0 or hi is not None
    cap = max(1, hi + 1 if hi is not None else lo) if counting else 1
    witnesses = sh.witnesses
    full = (1 << len(witnesses)) - 1
    if counting and n * cap > MAX_COUNT_STATES:
        raise SchemaError("minProperties/maxProperties with this many optional properties is too large to enforce",
                          pointer, "maxProperties")
    use_rules = counting or n > INLINE_MEMBERS or bool(witnesses)
    prefix = sink.fresh_name(pointer + "#members")
    memo: dict[tuple[int, int, int], Node] = {}

    def tail(c: int, w: int) -> Node:
        """Additional members when ``c`` members came before and witnesses ``w`` were seen."""
        if w != full:
            return _witness_tail(lay, sink, prefix, extra, witness_extras, c > 0, w, full)
        need = max(lo - c, 0) if counting else 0
        room = None if hi is None else hi - c
        if room is not None and room < need:
            return NOTHING
        if extra == NOTHING:
            return (lay.last if c > 0 else EMPTY) if need == 0 else NOTHING
        if need > 1:  # additional keys may repeat: all of them together count as one property
            return NOTHING
        more = seq(lay.comma, extra)
        if c > 0:
            return seq(repeat(more, need, room), lay.last)
        if room == 0:
            return EMPTY if need == 0 else NOTHING
        first = seq(lay.first, extra, repeat(more, max(need - 1, 0), None if room is None else room - 1), lay.last)
        return first if need > 0 else optional(first)

    def variants(j: int) -> list[tuple[Node, int]]:
        """Member ``j`` written plainly, or as a witness of some of ``witnesses`` (value conjoined)."""
        key, subs, member, _ = members[j]
        out = [(member, 0)]
        covers = [i for i, wt in enumerate(witnesses) if wt.covers(key)]
        for mask in range(1, 1 << len(covers)):
            chosen = [covers[b] for b in range(len(covers)) if mask >> b & 1]
            extra_subs = [witnesses[i].value for i in chosen]
            value = t.value_rule(subs + extra_subs, pointer + "/properties/" + key)
            if value != NOTHING:
                out.append((seq(t.key_literal(key), lay.colon, value), sum(1 << i for i in chosen)))
        return out

    # Bottom-up over j so recursion depth stays constant.
    masks = range(full, -1, -1)
    for j in range(n, -1, -1):
        forms = variants(j) if j < n else []
        for c in range(min(j, cap), -1, -1):
            for w in masks:
                if j == n:
                    memo[(j, c, w)] = tail(c, w)
                    continue
                take: list[Node] = []
                if hi is None or c + 1 <= hi:
                    sep = lay.comma if c > 0 else lay.first
                    take = [seq(sep, node, _link(sink, prefix, j + 1, min(c + 1, cap), w | bits, memo, use_rules))
                            for node, bits in forms]
                skip = NOTHING if members[j][3] else _link(sink, prefix, j + 1, c, w, memo, use_rules)
                memo[(j, c, w)] = alt(*take, skip)
    return memo[(0, 0, 0)]


def _witness_tail(lay: Layout, sink: RuleSink, prefix: str, extra: Node, witness_extras: dict[int, Node],
                  after: bool, w: int, full: int) -> Node:
    """Additional members (no count bounds) that include a witness for every bit missing from ``w``."""
    name = f"{prefix}@extra,{int(after)},{w}"
    if name in sink:
        return ref(name)
    sink.define(name, NOTHING)  # a placeholder while building (cycles go through refs)
    sep = lay.comma if after else lay.first
    options: list[Node] = [lay.last if after else EMPTY] if w == full else []
    if extra != NOTHING:
        options.append(seq(sep, extra, _witness_tail(lay, sink, prefix, extra, witness_extras, True, w, full)))
    for mask, wx in witness_extras.items():
        if not w & mask and wx != NOTHING:
            options.append(seq(sep, wx, _witness_tail(lay, sink, prefix, extra, witness_extras, True, w | mask, full)))
    return sink.define(name, alt(*options))


def _link(sink: RuleSink, prefix: str, j: int, c: int, w: int, memo: dict, use_rules: bool) -> Node:
    """A reference to state (j, c, w): inline for small objects, a rule otherwise."""
    node = memo[(j, c, w)]
    if not use_rules or node in (NOTHING, EMPTY):
        return node
    return sink.shared(f"{prefix}@{j},{c},{w}", node)


_META = re.compile(r"[\\.\[\](){}*+?|^$]")


def _literal_prefix(pattern: str) -> str | None:
    """The literal text an anchored pattern must start with (None: not anchored)."""
    if not pattern.startswith("^"):
        return None
    m = _META.search(pattern, 1)
    body = pattern[1:m.start()] if m else pattern[1:]
    if m and pattern[m.start()] in "*+?{" and body:
        body = body[:-1]  # the last character is quantified
    return body


def _literal_suffix(pattern: str) -> str | None:
    """The literal text a ``$``-anchored pattern must end with (None: not anchored)."""
    if not pattern.endswith("$") or pattern.endswith("\\$"):
        return None
    i = len(pattern) - 1
    while i > 0 and not _META.match(pattern[i - 1]):
        i -= 1
    body = pattern[i:-1]
    if i > 0 and pattern[i - 1] == "\\":
        body = body[1:]  # its first character is part of an escape
    return body


def _may_overlap(a: str, b: str) -> bool:
    """False when no key can match both patterns (incompatible anchored literal prefixes or suffixes)."""
    pa, pb = _literal_prefix(a), _literal_prefix(b)
    if pa is not None and pb is not None and pa[:min(len(pa), len(pb))] != pb[:min(len(pa), len(pb))]:
        return False
    sa, sb = _literal_suffix(a), _literal_suffix(b)
    if sa is not None and sb is not None:
        n = min(len(sa), len(sb))
        if n and sa[-n:] != sb[-n:]:
            return False
    return True


def _cliques(may_overlap: list[list[bool]], pointer: str) -> list[tuple[int, ...]]:
    """Sets of patterns a single key might match together (all pairwise overlapping), () included."""
    out: list[tuple[int, ...]] = [()]
    stack: list[tuple[int, ...]] = [(i,) for i in range(len(may_overlap) - 1, -1, -1)]
    while stack:
        c = stack.pop()
        out.append(c)
        if len(out) > MAX_PATTERN_CLASSES:
            raise SchemaError(
                f"patternProperties here may overlap in more than {MAX_PATTERN_CLASSES} ways; keys matching "
                "several of them cannot be told apart", pointer, "patternProperties")
        for j in range(len(may_overlap) - 1, c[-1], -1):
            if all(may_overlap[j][i] for i in c):
                stack.append(c + (j,))
    return out
