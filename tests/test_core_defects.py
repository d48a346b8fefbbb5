"""The automaton core's correctness defects found by fuzzing (issue 11), each as the case that
exposed it: masks must agree with ``accept_token``, dead ends must never be offered, the
budget-aware close must always be able to finish, and resource use is bounded with clear errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import constrain
import constrain.derivatives
from constrain.budget import BudgetExceededError, CompileBudget
from constrain.derivatives import ExprTable
from constrain.grammars import ir
from constrain.grammars.regex import regex_to_ir
from constrain.tokenizers import tekken

BYTES = constrain.Vocabulary.from_token_bytes([bytes([i]) for i in range(256)] + [None], eos_token_ids=[256])
EOS = 256


def refused_by_accept(matcher: constrain.Matcher) -> list[int]:
    """Tokens of the mask that ``accept_token`` refuses (on a fork each)."""
    return [t for t in matcher.allowed_token_ids().tolist() if not matcher.fork().accept_token(t)]


def matcher_after(compiled: constrain.CompiledGrammar, prefix: bytes) -> constrain.Matcher:
    m = compiled.matcher()
    assert m.accept_bytes(prefix)
    return m


@pytest.mark.parametrize("prefix", [b'"', b'"a', b'"ab', b'"abc'])
def test_pattern_and_max_length_mask_agrees_with_accept(prefix: bytes) -> None:
    compiled = constrain.compile_json_schema({"type": "string", "pattern": "^[ab]*c$", "maxLength": 3}, BYTES)
    m = matcher_after(compiled, prefix)
    assert m.allowed_token_ids().size
    assert refused_by_accept(m) == []


def test_lookahead_with_counted_tail_mask_agrees_with_accept() -> None:
    compiled = constrain.compile_regex("(?=.*a).{0,3}", BYTES)
    m = matcher_after(compiled, b"xy")
    assert m.allowed_token_ids().tolist() == [ord("a")]


def test_long_token_at_max_length_is_refused_by_mask_too() -> None:
    """tekken's longest token is 76 dashes: after one dash, 76 more overrun ``maxLength``."""
    vocab = tekken()
    dashes = vocab.token_bytes.index(b"-" * 76)
    compiled = constrain.compile_json_schema({"type": "string", "pattern": "^-*$", "maxLength": 76}, vocab)
    m = matcher_after(compiled, b'"-')
    assert dashes not in m.allowed_token_ids().tolist()
    assert refused_by_accept(m) == []
    assert dashes in matcher_after(compiled, b'"').allowed_token_ids().tolist()


DEAD_STRING = {"type": "string", "pattern": "^a$", "minLength": 2}


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": DEAD_STRING, "minItems": 1},
    {"type": "object", "properties": {"p": DEAD_STRING, "q": {"type": "integer"}}, "required": ["p"]},
    {"type": "object", "properties": {"p": {"type": "string", "format": "date", "pattern": "^x"}}, "required": ["p"]},
])
def test_unsatisfiable_subschema_where_required_is_refused(schema: dict) -> None:
    with pytest.raises(constrain.GrammarError, match="unsatisfiable"):
        constrain.compile_json_schema(schema, BYTES)


def test_unsatisfiable_optional_subschema_is_never_offered() -> None:
    array = constrain.compile_json_schema({"type": "array", "items": DEAD_STRING}, BYTES)
    assert matcher_after(array, b"[").allowed_token_ids().tolist() == [ord("]")]
    obj = constrain.compile_json_schema(
        {"type": "object", "properties": {"p": DEAD_STRING, "q": {"type": "integer"}},
         "additionalProperties": False}, BYTES)
    assert matcher_after(obj, b'{"').allowed_token_ids().tolist() == [ord("q")]


PATTERN_OBJECT = {"type": "object", "properties": {"r": {"type": "string", "pattern": "^abcdefghij$"}},
                  "required": ["r"]}


def test_min_completion_counts_intersections() -> None:
    compiled = constrain.compile_json_schema(PATTERN_OBJECT, BYTES)
    assert compiled.matcher().min_completion_bytes() == len(b'{"r":"abcdefghij"}')
    assert matcher_after(compiled, b'{"xxxxxxx":0,"r":').min_completion_bytes() == len(b'"abcdefghij"}')


@pytest.mark.parametrize("schema", [
    PATTERN_OBJECT,
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[a-c]+$", "minLength": 4, "maxLength": 6},
                                      "n": {"type": "integer", "exclusiveMinimum": 10}}, "required": ["s", "n"]},
])
def test_budget_close_never_leaves_an_empty_mask(schema: dict) -> None:
    """Random walks that follow the budget-aware masks from the start always end in a document."""
    compiled = constrain.compile_json_schema(schema, BYTES)
    bits = constrain.allocate_token_bitmask(1, BYTES.vocab_size)
    rng = np.random.default_rng(5)
    for budget in (20, 30, 40):
        for _ in range(8):
            m, used = compiled.matcher(), 0
            while not m.is_terminated():
                m.fill_next_token_bitmask(bits, 0, tokens_left=budget - used)
                ids = np.nonzero(np.unpackbits(bits.numpy().view(np.uint8), bitorder="little"))[0]
                assert len(ids), f"empty mask after {used} tokens with budget {budget}"
                non_eos = ids[ids != EOS]
                assert m.accept_token(int(rng.choice(non_eos)) if len(non_eos) and rng.random() < 0.9 else int(ids[-1]))
                used += 1
            assert used <= budget


def test_huge_required_repetition_is_refused_at_compile_time() -> None:
    with pytest.raises(constrain.GrammarError, match="MAX_REPEAT"):
        ExprTable(ir.Grammar.of(ir.repeat(ir.literal("a"), 1_000_000, 1_000_000)))
    table = ExprTable(ir.Grammar.of(ir.repeat(ir.literal("a"), 0, 1_000_000)))  # an upper bound is free
    assert table.nullable(table.derive_bytes(table.start, b"aaa"))


def test_many_lookaheads_end_within_the_time_budget() -> None:
    # The start state's row alone takes ~0.7 s of CPU on a 2-core box, each later one up to as
    # much: a budget well below that must end the work however fast the machine (1 s did not,
    # once the box was idle: every unit of work stayed under it).
    pattern = "".join(f"(?=.*{chr(97 + i)})" for i in range(16)) + ".{0,40}"
    budget = CompileBudget(seconds=0.1)
    with pytest.raises(BudgetExceededError, match=r"CompileBudget\.seconds"):
        table = ExprTable(ir.Grammar.of(regex_to_ir(pattern)), budget=budget)
        for state in set(table.row(table.start).tolist()) - {0}:
            table.row(state)


def test_state_and_memory_budgets_name_themselves() -> None:
    grammar = ir.Grammar.of(ir.repeat(ir.byte_set(b"ab"), 0, 50_000))
    for budget, name in ((CompileBudget(max_states=500), "max_states"), (CompileBudget(max_bytes=200_000), "max_bytes")):
        table = ExprTable(grammar, budget=budget)
        with pytest.raises(BudgetExceededError, match=rf"CompileBudget\.{name}") as caught:
            table.derive_bytes(table.start, b"ab" * 2000)
            table.ensure_rows(range(len(table)))
        assert caught.value.budget == name


# --- deep and broad inputs: GrammarErrors by nesting depth, iteration over breadth ---------------

def test_breadth_does_not_recurse() -> None:
    """A long sequence, a long chain of optional parts and many alternatives all compile."""
    long_seq = ir.seq(*[ir.literal(bytes([97 + i % 26])) for i in range(20_000)])
    optional_chain = ir.seq(*[ir.optional(ir.literal(f'"p{i}":0,')) for i in range(5_000)], ir.literal("}"))
    many = ir.alt(*[ir.literal(f"k{i:05d}") for i in range(10_000)])
    for node, text in ((long_seq, bytes(97 + i % 26 for i in range(20_000))),
                       (optional_chain, b'"p4998":0,}'), (many, b"k09999")):
        table = ExprTable(ir.Grammar.of(node))
        assert table.min_completion(table.start) <= len(text)
        assert table.nullable(table.derive_bytes(table.start, text))
        assert constrain.derivatives.matches(ir.Grammar.of(node), text)


def nested(depth: int) -> ir.Node:
    node: ir.Node = ir.literal("x")
    for _ in range(depth):
        node = ir.seq(ir.literal("["), ir.alt(node, ir.literal("y")), ir.literal("]"))
    return node


def rule_chain(length: int) -> ir.Grammar:
    rules: dict[str, ir.Node] = {"start": ir.ref("r0")}
    rules.update({f"r{i}": ir.seq(ir.ref(f"r{i + 1}"), ir.literal("x")) for i in range(length)})
    rules[f"r{length}"] = ir.literal("y")
    return ir.Grammar(rules)


def test_deep_inputs_give_a_grammar_error_naming_the_depth() -> None:
    limit = sys.getrecursionlimit()
    for make in (lambda: ir.Grammar.of(nested(3_000)), lambda: rule_chain(5_000)):
        with pytest.raises(constrain.GrammarError, match="nests more than 150 levels"):
            table = ExprTable(make())
            table.derive_bytes(table.start, b"[" * 3_000)
    assert sys.getrecursionlimit() == limit
    table = ExprTable(ir.Grammar.of(nested(60)))  # moderate depth is fine
    assert table.nullable(table.derive_bytes(table.start, b"[" * 60 + b"x" + b"]" * 60))
    chain = ExprTable(rule_chain(60))
    assert chain.nullable(chain.derive_bytes(chain.start, b"y" + b"x" * 60))


def test_deep_inputs_in_a_fresh_process() -> None:
    """No process-wide setting changes: the same error in a process that compiled nothing."""
    code = (
        "import sys\nfrom constrain.derivatives import ExprTable\nfrom constrain.grammars import ir\n"
        "node = ir.literal('x')\nfor _ in range(3000):\n"
        "    node = ir.seq(ir.literal('['), ir.alt(node, ir.literal('y')), ir.literal(']'))\n"
        "try:\n    ExprTable(ir.Grammar.of(node))\nexcept ValueError as e:\n    print(type(e).__name__, e)\n"
        "print(sys.getrecursionlimit())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "GrammarError constraint nests more than" in out.stdout and out.stdout.split()[-1] == "1000"


# ---------------------------------------------------------------- found by the long fuzz run (issue 11)


@pytest.mark.parametrize("text, accepted", [
    ('start: r1\nr0: r1\nr1: | "b" r0 | "x" r0+\n', [b"", b"b", b"x", b"bb", b"xb"]),
    # lark seed 130 of bench/fuzz.py, whose oracle accepts b"bbc" (start: r1 "b" "c", r1: "b" r0, r0: r1: empty)
    ('start: r1 "b" "c" | (r2 "b"? "b")* (r1? r2 | "b" "b"* "b") ("ab" | "b" "c"*)\nr0: r1 | "b"\n'
     'r1: r2+ ("b" | "b") | "a"? T* T? | "b" (r0 | "b" r0+)\nr2: T | "a"? (T)\nT: /c[ab]?/\n', [b"bbc", b"bc"]),
])
def test_a_nullable_rule_asked_inside_its_own_cycle_stays_nullable(text: str, accepted: list[bytes]) -> None:
    """``r0`` is asked whether it is nullable while ``r1``'s body (which ``r0`` is) is still open: the
    cycle is cut there, and what was computed under that cut must not be cached as final."""
    compiled = constrain.compile_lark(text, BYTES)
    for data in accepted:
        m = compiled.matcher()
        assert m.accept_bytes(data) and m.is_accepting(), data


def test_the_table_answers_nullable_consistently_through_rule_cycles() -> None:
    g = ir.Grammar({"start": ir.ref("r1"), "r0": ir.ref("r1"),
                    "r1": ir.alt(ir.EMPTY, ir.seq(ir.literal("b"), ir.ref("r0")),
                                 ir.seq(ir.literal("x"), ir.repeat(ir.ref("r0"), 1)))})
    table = ExprTable(g)
    after_b = table.derive(table.start, ord("b"))
    assert table.nullable(after_b)
    assert table.nullable(table.derive(after_b, ord("b")))


def test_an_intersection_with_a_dead_complement_is_its_other_member() -> None:
    """``x & not(nothing)`` is ``x``: once the input leaves a ``not`` branch (schema seed 1049's
    ``not: {const: 1, ...}`` after ``{``), the document is structural again, and its shortest
    completion exact, so the budget-aware close finds it."""
    schema = {"type": "object", "properties": {"t": {"type": "string", "format": "date-time"}},
              "required": ["t"], "not": {"const": 1}}
    compiled = constrain.compile_json_schema(schema, BYTES)
    m = matcher_after(compiled, b'{"x":[[[')
    shortest = m.min_completion_bytes()
    assert shortest == len(b']]],"t":"0000-00-00T00:00:00Z"}')
    left = int(shortest) + 1
    bitmask = constrain.allocate_token_bitmask(1, BYTES.vocab_size)
    while True:  # follow the budget-aware close with exactly the tokens needed: it never runs dry
        m.fill_next_token_bitmask(bitmask, 0, tokens_left=left)
        words = bitmask[0].numpy().astype("<i4").view(np.uint8)
        allowed = np.flatnonzero(np.unpackbits(words, bitorder="little")[:BYTES.vocab_size])
        assert len(allowed), f"empty budget-aware mask with {left} tokens left"
        token = int(allowed[0]) if left > 1 or EOS not in allowed else EOS
        if EOS in allowed and m.is_accepting():
            token = EOS
        assert m.accept_token(token)
        left -= 1
        if token == EOS:
            break
