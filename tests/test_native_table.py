"""The C++ expression table (``constrain._core.ExprCore``) against its Python twin
(``constrain.derivatives.ExprTable``): the same byte automaton, state by state.

Expression ids differ between the two (interning order differs), so states are compared by what
they mean, following the same bytes from both start states: acceptance, which bytes lead on,
shortest completions, liveness, forced text, whether the state is a union or a split. Random IR
with intersections and complements, random regexes, the built-in grammars and real schemas fed
their real instances; then masks on a real vocabulary through the public compiler, errors, and
threads sharing one grammar."""

from __future__ import annotations

import itertools
import json
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.walks import expressions, grammars, regexes

import constrain
from constrain.budget import BudgetExceededError, CompileBudget
from constrain.cache import Signatures
from constrain.compiler import GrammarCompiler
from constrain.derivatives import ExprTable, StateLimitError
from constrain.grammars import ir
from constrain.grammars.analysis import MAX_NESTING, MAX_REPEAT
from constrain.grammars.builtin import builtin_grammar, names
from constrain.grammars.errors import GrammarError
from constrain.grammars.json_schema import json_schema_to_grammar
from constrain.grammars.regex import regex_to_ir
from constrain.native_derivatives import NativeExprTable, available
from constrain.testing.corpus import DEFAULT_DATA, expand_subsets, load_cases
from constrain.tokenizers import tekken

pytestmark = pytest.mark.skipif(not available(), reason="constrain._core is not built")


def twins(grammar: ir.Grammar, **options) -> tuple[ExprTable, NativeExprTable]:
    """The two tables of ``grammar``, their structure ids from one ``Signatures``."""
    signatures = Signatures()
    return (ExprTable(grammar, signatures=signatures, **options),
            NativeExprTable(grammar, signatures=signatures, **options))


def check_state(py: ExprTable, nat: NativeExprTable, a: int, b: int, where: bytes) -> np.ndarray:
    """States ``a`` (Python) and ``b`` (C++), reached by the same bytes ``where``, mean the same."""
    assert py.nullable(a) == nat.nullable(b), where
    assert py.is_live(a) == nat.is_live(b), where
    ra, rb = py.row(a), nat.row(b)
    assert np.array_equal(ra != 0, rb != 0), where
    assert py.min_completion(a) == nat.min_completion(b), where
    assert py.forced_bytes(a, 64) == nat.forced_bytes(b, 64), where
    assert (py.alternatives(a) is None) == (nat.alternatives(b) is None), where
    split_a, split_b = py.split(a), nat.split(b)
    assert (split_a is None) == (split_b is None), where
    if split_a is not None and split_b is not None:  # a head shared across grammars is one structure
        assert py.signature(split_a[0]) == nat.signature(split_b[0]), where
    assert py.is_framed(a) == nat.is_framed(b), where
    for x in np.nonzero(ra)[0][:4].tolist():  # a row entry is the derivative, live
        assert nat.step_bytes(b, bytes([x])) == rb[x] and py.step_bytes(a, bytes([x])) == ra[x], where
    return ra


def random_walks(py: ExprTable, nat: NativeExprTable, rng: random.Random, walks: int, steps: int) -> int:
    """Follow random live bytes from both starts; the number of states compared."""
    seen = 0
    for _ in range(walks):
        a, b, where = py.start, nat.start, b""
        for _ in range(steps):
            row = check_state(py, nat, a, b, where)
            seen += 1
            live = np.nonzero(row)[0]
            if not len(live):
                break
            x = int(rng.choice(live))
            where += bytes([x])
            a, b = int(row[x]), int(nat.row(b)[x])
    return seen


def feed(py: ExprTable, nat: NativeExprTable, data: bytes) -> bool:
    """Both tables along ``data`` byte by byte; whether they accept it."""
    a, b = py.start, nat.start
    for i, x in enumerate(data):
        check_state(py, nat, a, b, data[:i])
        a, b = py.step_bytes(a, bytes([x])), nat.step_bytes(b, bytes([x]))
        assert (a == 0) == (b == 0), data[: i + 1]
        if a == 0:
            return False
    check_state(py, nat, a, b, data)
    return py.nullable(a)


@settings(max_examples=300, deadline=None)
@given(expressions)
def test_random_expressions_with_intersections_and_complements(node: ir.Node) -> None:
    py, nat = twins(ir.Grammar.of(node))
    for n in range(5):
        for s in itertools.product(b"ab", repeat=n):
            feed(py, nat, bytes(s))


@settings(max_examples=300, deadline=None)
@given(grammars())
def test_rule_lengths_of_random_rules_match(grammar: ir.Grammar) -> None:
    """The rules' shortest strings, measured in C++ (both passes, components in order), are the
    twin's; so is which grammars are empty by their structure alone; so are the states."""
    tables, errors = [], []
    for table in (ExprTable, NativeExprTable):
        try:
            tables.append(table(grammar))
        except GrammarError as e:
            errors.append(str(e))
    if errors:  # left recursion met while searching an exact length: which twin meets it first may differ
        assert len(set(errors)) == 1 and (len(errors) == 2 or "left-recursive" in errors[0]), errors
        return
    py, nat = tables
    assert nat.rule_lengths == py.rule_lengths
    assert nat.empty_by_structure == py.empty_by_structure == (grammar.start not in grammar.min_lengths)
    for n in range(4):
        for s in itertools.product(b"ab", repeat=n):
            try:
                feed(py, nat, bytes(s))
            except GrammarError as e:  # (which twin raises first is test_errors_are_the_twins_errors')
                assert "left-recursive" in str(e)
                return


@settings(max_examples=150, deadline=None)
@given(regexes(), regexes(), st.randoms(use_true_random=False))
def test_random_regexes_in_two_rules(head: str, tail: str, rng: random.Random) -> None:
    """``head* tail`` as two rules: states are frames and sequences across rules."""
    grammar = ir.Grammar({"start": ir.seq(ir.repeat(ir.ref("head"), 0, None), ir.ref("tail")),
                          "head": regex_to_ir(head), "tail": regex_to_ir(tail)})
    signatures = Signatures()
    try:
        py = ExprTable(grammar, signatures=signatures)
    except GrammarError as e:
        with pytest.raises(GrammarError, match=str(e)[:30]):
            NativeExprTable(grammar)
        return
    random_walks(py, NativeExprTable(grammar, signatures=signatures), rng, walks=4, steps=30)


@pytest.mark.parametrize("name", names())
def test_builtin_grammars(name: str) -> None:
    py, nat = twins(builtin_grammar(name))
    assert random_walks(py, nat, random.Random(name), walks=12, steps=120) > 100


def dev_schemas(every: int) -> list:
    cases = load_cases(DEFAULT_DATA, expand_subsets("jsb", DEFAULT_DATA), "dev")
    return cases[::every]


@pytest.mark.parametrize("case", dev_schemas(60), ids=lambda c: c.id)
def test_real_schemas_fed_their_instances(case) -> None:
    """Every valid instance accepted by both, every state on the way alike (strict and default
    options, as extraction and validation use them)."""
    for options in ({}, {"strict_properties": True, "property_order": "declared"}):
        try:
            grammar = json_schema_to_grammar(case.schema, **options)
        except GrammarError:
            continue
        try:
            py, nat = twins(grammar)
        except BudgetExceededError:
            continue
        for test in case.tests[:3]:
            data = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False).encode()
            accepted = feed(py, nat, data)
            if not options:  # full semantics: the grammar is the schema
                assert accepted == test["valid"], (case.id, data[:80])
        random_walks(py, nat, random.Random(case.id), walks=2, steps=60)


def test_masks_on_a_real_vocabulary_match_the_python_core() -> None:
    """The public compiler with the C++ core and with the Python twin (``native=False``): the same
    masks along the same tokens of real instances."""
    vocab = tekken()
    native, python = GrammarCompiler(native=True), GrammarCompiler(native=False)
    by_bytes = {t: i for i, t in enumerate(vocab.token_bytes) if t}
    compared = 0
    for case in dev_schemas(300):
        try:
            gn, gp = native.compile_json_schema(case.schema, vocab), python.compile_json_schema(case.schema, vocab)
        except GrammarError:
            continue
        for test in case.tests[:2]:
            if not test["valid"]:
                continue
            data = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False).encode()
            sn, sp, i = gn.initial_state, gp.initial_state, 0
            while i < len(data) and sn >= 0:
                assert np.array_equal(gn.state_mask(sn), gp.state_mask(sp)), (case.id, data[:i])
                compared += 1
                j = next(j for j in range(min(len(data), i + 16), i, -1) if data[i:j] in by_bytes)
                sn, sp = gn.next_state(sn, by_bytes[data[i:j]]), gp.next_state(sp, by_bytes[data[i:j]])
                assert (sn < 0) == (sp < 0)
                i = j
            if sn >= 0:
                assert gn.is_accepting(sn) == gp.is_accepting(sp)
    assert compared > 200


def test_an_empty_rule_inside_an_intersection_empties_it_in_both_twins() -> None:
    """``hit`` is empty (``a+`` and not ``a*``), which only a search finds; ``start`` needs it
    inside another intersection, which both twins must measure with ``hit``'s exact length (a
    lower bound kept ``start`` productive: every mask then searched its way to a budget)."""
    grammar = ir.Grammar({
        "start": ir.alt(ir.literal("n"), ir.intersect(ir.seq(ir.literal("["), ir.ref("hit"), ir.literal("]")),
                                                      ir.seq(ir.literal("["), ir.repeat(ir.byte_set(b"ab")), ir.literal("]")))),
        "hit": ir.intersect(ir.repeat(ir.literal("a"), 1), ir.complement(ir.repeat(ir.literal("a")))),
    })
    for t in twins(grammar):
        assert t.min_completion(t.start) == 1
        assert t.derive(t.start, ord("[")) == 0  # NOTHING: no way into the empty branch
        assert t.derive(t.start, ord("n")) != 0


def raise_the_same_error(grammar: ir.Grammar, match: str) -> None:
    """Both tables refuse ``grammar`` when built, with one message."""
    messages = set()
    for table in (ExprTable, NativeExprTable):
        with pytest.raises(GrammarError, match=match) as got:
            table(grammar)
        messages.add(str(got.value))
    assert len(messages) == 1


def test_errors_are_the_twins_errors() -> None:
    left = ir.Grammar({"start": ir.alt(ir.seq(ir.ref("start"), ir.literal("x")), ir.literal("y"))})
    for table in (ExprTable, NativeExprTable):
        t = table(left)
        with pytest.raises(GrammarError, match="left-recursive"):
            t.row(t.start)
    # ``start: !r``, ``r: "" & start``: is "" in start? only if it is not (hypothesis found it)
    paradox = ir.Grammar({"start": ir.Not(ir.ref("r")), "r": ir.And((ir.EMPTY, ir.ref("start")))})
    raise_the_same_error(paradox, "rule 'start' refers to rule 'r' inside a complement")
    undefined = ir.Grammar({"start": ir.alt(ir.literal("b"), ir.seq(ir.literal("a"), ir.ref("nowhere")))})
    messages = set()
    for table in (ExprTable, NativeExprTable):
        t = table(undefined)
        with pytest.raises(GrammarError, match="undefined rule 'nowhere'") as got:
            t.derive(t.start, ord("a"))
        messages.add(str(got.value))
    assert len(messages) == 1
    deep = ir.literal("x")
    for _ in range(MAX_NESTING + 5):
        deep = ir.seq(ir.literal("("), ir.alt(deep, ir.literal("y")), ir.literal(")"))
    for table in (ExprTable, NativeExprTable):
        with pytest.raises(GrammarError, match="nests more than"):
            t = table(ir.Grammar.of(deep))
            t.row(t.start)
    many = json_schema_to_grammar({"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(40)}})
    for table in (ExprTable, NativeExprTable):
        with pytest.raises(StateLimitError) as got:
            t = table(many, budget=CompileBudget(max_states=50))
            t.row(t.start)
        assert got.value.budget == "max_states" and got.value.limit == 50
    huge = ir.Grammar({"start": ir.alt(ir.literal("x"), ir.ref("r")), "r": ir.repeat(ir.literal("a"), MAX_REPEAT + 1)})
    raise_the_same_error(huge, "MAX_REPEAT")
    with pytest.raises(TypeError, match="native"):
        GrammarCompiler(native="yes")  # type: ignore[arg-type]


def test_threads_sharing_one_grammar_get_the_masks_of_one_thread() -> None:
    """Masks of many states asked from 8 threads at once (rows filled, rules read, states created
    concurrently) equal those asked from one thread of a fresh compiler."""
    vocab = tekken()
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
                                               "n": {"type": "integer", "minimum": -5}},
              "required": ["name"]}
    texts = [json.dumps({"name": "x" * i, "tags": ["a", "bb"][: i % 3], "n": i}, separators=(",", ":")) for i in range(24)]

    def states(g: constrain.CompiledGrammar, text: str) -> list[bytes]:
        m, data, out = g.matcher(), text.encode(), []
        for i in range(0, len(data), 3):
            out.append(g.state_mask(m.state).tobytes())
            assert m.accept_bytes(data[i:i + 3])
        out.append(g.state_mask(m.state).tobytes())
        return out

    shared = GrammarCompiler(native=True).compile_json_schema(schema, vocab)
    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(lambda t: states(shared, t), texts))
    alone = GrammarCompiler(native=True).compile_json_schema(schema, vocab)
    assert concurrent == [states(alone, t) for t in texts]


def test_a_compiled_grammar_lets_go_of_its_ir() -> None:
    """The C++ table reads every rule body and keeps no IR object (a cached grammar's IR would
    weigh on every garbage collection): no reference to a rule body outlives the compile, and the
    grammar still allows what its schema allows."""
    import sys

    from constrain.tokenizers import tekken

    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
              "required": ["a"], "additionalProperties": False, "$defs": {"n": {"type": "integer", "minimum": 3}}}
    grammar = json_schema_to_grammar(schema)
    bodies = list(grammar.rules.values())
    counts = [sys.getrefcount(b) for b in bodies]
    compiled = GrammarCompiler().compile_grammar(grammar, tekken())
    assert [sys.getrefcount(b) for b in bodies] == counts
    for doc, ok in ((b'{"a":3,"b":[4,5]}', True), (b'{"a":2}', False), (b'{"b":[3]}', False)):
        m = compiled.matcher()
        assert (m.accept_bytes(doc) and m.is_accepting()) == ok, doc


def test_alt_is_the_union_of_its_members_in_both_twins() -> None:
    """``alt`` (what a union mask walks its keys with) accepts what any member accepts, alike in
    both tables; no members: nothing."""
    grammar = ir.Grammar.of(ir.alt(ir.literal("ab"), ir.literal("bab"), ir.repeat(ir.literal("a"), 2, 3)))
    for table in twins(grammar):
        members = [table.step_bytes(table.start, b"a"), table.step_bytes(table.start, b"b")]
        union = table.alt(members)
        for n in range(5):
            for s in itertools.product(b"ab", repeat=n):
                data = bytes(s)
                want = any(m and (x := table.step_bytes(m, data)) and table.nullable(x) for m in members)
                got = table.step_bytes(union, data)
                assert bool(got and table.nullable(got)) == want, (type(table).__name__, data)
        assert not table.is_live(table.alt([]))
