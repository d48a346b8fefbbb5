"""The derivative engine against a brute-force set semantics of the IR on short strings."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from support.walks import expressions

from constrain.cache import Signatures
from constrain.derivatives import SIGNATURE_REFS, ExprTable, matches
from constrain.grammars import ir

ALPHABET = b"ab"
MAX_LEN = 4
UNIVERSE = frozenset(
    bytes(p) for n in range(MAX_LEN + 1) for p in itertools.product(ALPHABET, repeat=n)
)


def language(node: ir.Node) -> frozenset[bytes]:
    """Strings of length <= MAX_LEN over ALPHABET in the language of ``node`` (exact)."""
    if isinstance(node, ir.Bytes):
        return frozenset(bytes([b]) for b in ALPHABET if (node.mask >> b) & 1)
    if isinstance(node, ir.Seq):
        out = frozenset([b""])
        for item in node.items:
            lang = language(item)
            out = frozenset(u + v for u in out for v in lang if len(u) + len(v) <= MAX_LEN)
        return out
    if isinstance(node, ir.Alt):
        return frozenset().union(*(language(i) for i in node.items))
    if isinstance(node, ir.And):
        out = UNIVERSE
        for item in node.items:
            out &= language(item)
        return out
    if isinstance(node, ir.Not):
        return UNIVERSE - language(node.item)
    if isinstance(node, ir.Repeat):
        item = language(node.item)
        out, layer = set(), {b""}
        if node.min == 0:
            out.add(b"")
        for count in range(1, MAX_LEN + 2 if node.max is None else node.max + 1):
            layer = {u + v for u in layer for v in item if len(u) + len(v) <= MAX_LEN}
            if count >= node.min:
                out |= layer
            if not layer:
                break
        return frozenset(out)
    raise TypeError(node)




@settings(max_examples=300, deadline=None)
@given(expressions)
def test_membership_matches_set_semantics(node: ir.Node) -> None:
    expected = language(node)
    for s in UNIVERSE:
        assert matches(node, s) == (s in expected), (node, s)


@settings(max_examples=200, deadline=None)
@given(expressions)
def test_transition_rows_agree_with_derivatives_and_liveness(node: ir.Node) -> None:
    """A row entry is non-dead exactly when some completion exists after that byte."""
    table = ExprTable(ir.Grammar.of(node))
    lang = language(node)
    row = table.row(table.start)
    for b in ALPHABET:
        # Any accepted string of bounded length starting with b proves liveness; the converse
        # is checked only where the language is fully visible (no strings longer than MAX_LEN).
        if any(s[:1] == bytes([b]) for s in lang):
            assert row[b] != 0, (node, b)
        if row[b] == 0:
            assert not any(s[:1] == bytes([b]) for s in lang)


def has_complement(node: ir.Node) -> bool:
    if isinstance(node, (ir.Not, ir.Repeat)):
        return isinstance(node, ir.Not) or has_complement(node.item)
    return any(has_complement(c) for c in getattr(node, "items", ()))


@settings(max_examples=300, deadline=None)
@given(expressions)
def test_shortest_completions_and_their_bounds_agree_with_set_semantics(node: ir.Node) -> None:
    """``min_completion`` is the shortest member's length and ``_min_bound`` never exceeds it.

    A complement also holds strings of other bytes than ``ALPHABET``, which may be shorter, so
    there it is only checked to be no longer than the shortest string seen."""
    from constrain.derivatives import INFINITE

    table = ExprTable(ir.Grammar.of(node))
    lang = language(node)
    bound, exact = table._min_bound(table.start), table.min_completion(table.start)
    assert bound <= exact, node
    if lang:
        shortest = min(len(s) for s in lang)
        if has_complement(node):
            assert exact <= shortest, node
        else:
            assert exact == shortest, node
    elif exact < INFINITE:
        assert exact > MAX_LEN or has_complement(node), node


def test_recursive_rules_expand_lazily_to_any_depth() -> None:
    g = ir.Grammar({"start": ir.alt(ir.literal("x"), ir.seq(ir.literal("["), ir.ref("start"), ir.literal("]")))})
    assert matches(g, b"[" * 3000 + b"x" + b"]" * 3000)
    assert not matches(g, b"[" * 3000 + b"x" + b"]" * 2999)


def test_left_recursion_is_reported() -> None:
    from constrain.grammars.errors import GrammarError

    g = ir.Grammar({"start": ir.alt(ir.literal("x"), ir.seq(ir.ref("start"), ir.literal("y")))})
    with pytest.raises(GrammarError, match="left-recursive"):
        matches(g, b"xy")


def test_counted_repeat_is_one_node_and_exact() -> None:
    node = ir.repeat(ir.literal("a"), 0, 100_000)
    assert matches(node, b"a" * 100_000)
    assert not matches(node, b"a" * 100_001)


def test_liveness_learnt_from_earlier_searches_equals_fresh_searches() -> None:
    """Searches record live paths and dead regions; every later answer must equal a search
    from scratch in a table that never asked about liveness."""
    from constrain.derivatives import INFINITE, NOTHING
    from constrain.grammars.regex import regex_to_ir

    node = ir.alt(ir.intersect(regex_to_ir(r"[a-d]*abc[a-d]*"), regex_to_ir(r"([a-d][a-d])*"),
                               ir.complement(regex_to_ir(r".*dd.*")), regex_to_ir(r"[a-c]*d?[a-c]*")),
                  ir.seq(ir.literal("e"), ir.intersect(regex_to_ir(r"[a-e]*c"), regex_to_ir(r"[a-e]*d"))))
    learnt, fresh = ExprTable(ir.Grammar.of(node)), ExprTable(ir.Grammar.of(node))
    dead = 0
    for n in range(6):
        for text in itertools.product(b"abcde", repeat=n):
            s, f = learnt.start, fresh.start
            for b in text:
                s, f = learnt.derive(s, b), fresh.derive(f, b)
            if s == NOTHING:
                continue
            expected = fresh._search_min(f) != INFINITE
            assert learnt.is_live(s) == expected, bytes(text)
            dead += not expected
    assert dead > 0  # some prefixes can never be completed: the dead branch is exercised


GRAMMARS_WITH_BOUNDS = [
    # an unsatisfiable intersection in a cycle, a rule using it, and rules that never meet one
    'start: a | b c\na: "x" a | x_and\nx_and: /(?![a-c]{2})[a-c]{2}/ "y"\nb: "q"+ | c\nc: "(" b ")" | "z"',
    {"type": "object", "properties": {"n": {"type": "string", "pattern": "^a+$", "maxLength": 0},
                                      "m": {"type": "array", "items": {"$ref": "#"}}, "k": {"type": "integer"}},
     "required": ["k"], "additionalProperties": {"type": "string", "minLength": 2, "pattern": "^b?$"}},
    {"anyOf": [{"type": "string", "format": "date"}, {"type": "array", "items": {"$ref": "#"}, "minItems": 1}]},
]


@pytest.mark.parametrize("source", GRAMMARS_WITH_BOUNDS)
def test_exact_rule_lengths_measure_only_the_bounded_rules_again(source) -> None:
    """The compiler's exact pass reuses the front end's lengths where no bound was taken: equal to
    measuring every rule again."""
    from constrain.grammars.analysis import measure_rules, rule_min_lengths
    from constrain.grammars.json_schema import json_schema_to_grammar
    from constrain.grammars.lark_frontend import lark_to_grammar

    grammar = lark_to_grammar(source) if isinstance(source, str) else json_schema_to_grammar(source)
    table = ExprTable(grammar)
    again = measure_rules(grammar.rules, table._exact_min, grammar.rule_lengths)
    assert again.lengths == rule_min_lengths(grammar.rules, table._exact_min) == table._rule_min
    assert grammar.rule_lengths.bounded, "no rule took a bound: nothing was measured again"
    assert not again.bounded


def chain(n: int, name: str) -> ir.Grammar:
    """``a{n-1} z`` as ``n`` rules named ``name0`` .. , each referring to the next."""
    rules: dict[str, ir.Node] = {"start": ir.ref(f"{name}0")}
    for i in range(n):
        rules[f"{name}{i}"] = ir.seq(ir.literal("a"), ir.ref(f"{name}{i + 1}")) if i < n - 1 else ir.literal("z")
    return ir.Grammar(rules)


def test_a_rule_that_does_not_recur_has_its_bodys_signature() -> None:
    signatures = Signatures()
    x, y, longer = (ExprTable(g, signatures=signatures) for g in (chain(3, "x"), chain(3, "y"), chain(4, "x")))
    assert x.signature(x.start) is not None
    assert x.signature(x.start) == y.signature(y.start) != longer.signature(longer.start)


def test_a_recursive_rule_or_a_long_chain_of_rules_has_no_signature() -> None:
    nested = ir.Grammar({"start": ir.alt(ir.seq(ir.literal("("), ir.ref("start"), ir.literal(")")), ir.literal("x"))})
    table = ExprTable(nested)
    assert table.signature(table.start) is None
    assert table.signature(table.step_bytes(table.start, b"(")) is None
    deep = ExprTable(chain(3000, "r"))  # no RecursionError: references past SIGNATURE_REFS go unread
    assert deep.signature(deep.start) is None
    assert deep.signature(deep.step_bytes(deep.start, b"a" * (3000 - SIGNATURE_REFS // 2))) is not None

