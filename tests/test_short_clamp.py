"""Masks of states whose repetition counts are clamped below the longest token
(``TokenAutomaton.mask``, ``LongTokens``) against one walk of the whole trie from the state itself,
along random walks of real tokens through counted strings, arrays, whitespace runs and regexes;
with the C++ walker and table and with their numpy/Python twins."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.walks import expressions

import constrain
from constrain.automaton import MAX_LONG_TOKENS, TokenAutomaton
from constrain.compiler import GrammarCompiler
from constrain.derivatives import NOTHING, ExprTable
from constrain.grammars import ir
from constrain.native_derivatives import NativeExprTable, available
from constrain.tokenizers import llama3, smollm2, tekken

GITHUB_EASY_0 = {  # JSONSchemaBench Github_easy/0: the engine benchmark's costliest host path before clamping short
    "additionalProperties": False, "title": "OAuthAuthorizationCode", "type": "object",
    "properties": {
        "authorizationCode": {"maxLength": 100, "type": "string"},
        "clientId": {"maxLength": 12, "minLength": 12, "pattern": "[0-9a-fA-F]+", "type": "string"},
        "expirationTime": {"type": "number"}, "scope": {"type": "string"},
    },
}

# (kind, constraint, options): counted pieces longer than a short token, some that the long
# tokens (runs of spaces and dashes) fit into.
CASES = [
    ("schema", {"type": "string", "maxLength": 100}, {}),
    ("schema", {"type": "string", "minLength": 40, "maxLength": 90}, {}),
    ("schema", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 60}, {}),
    ("schema", {"type": "string", "pattern": "^[a-z -]*$", "maxLength": 80}, {}),
    # intersections whose completions are long (twelve x's to end), or whose lower bound stays
    ("schema", {"type": "string", "pattern": "^[a-z ]*x{12}$", "maxLength": 70}, {}),
    ("schema", {"type": "string", "pattern": "^(ab|c-d)+$", "minLength": 30, "maxLength": 90}, {}),
    ("schema", {"type": "string", "format": "email", "maxLength": 64}, {}),
    ("schema", {"type": "integer", "minimum": 0, "maximum": 10**40}, {}),
    ("schema", {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
     {"whitespace": "flexible", "max_whitespace": 100}),
    ("schema", GITHUB_EASY_0, {}),
    ("schema", GITHUB_EASY_0, {"property_order": "declared"}),
    ("regex", "[a-z]{3,40}", {}),
    ("regex", "(ab){2,30}c", {}),
    ("regex", r"-?[0-9]{1,40}(\.[0-9]{2,30})?", {}),
    ("regex", "[ -]{0,100}x", {}),
    ("regex", " {20,90}[a-z]{0,50}", {}),
    # items of several bytes: a token starts fewer of their iterations
    ("regex", "(abc){2,40}d", {}),
    ("schema", {"type": "string", "pattern": "^([a-z]+ ){0,30}$", "maxLength": 300}, {}),
    # a count that binds (the words) beside one that does not (the length)
    ("schema", {"type": "string", "pattern": r"^(?:\S+\s+){0,20}\S+$", "maxLength": 3000}, {}),
]

COMPILERS = {native: GrammarCompiler(native=native) for native in (True, False)}


def compile_case(case: tuple, vocab: constrain.Vocabulary, native: bool) -> TokenAutomaton:
    kind, constraint, options = case
    compiler = COMPILERS[native]
    if kind == "regex":
        compiled = compiler.compile_regex(constraint, vocab)
    else:
        compiled = compiler.compile_json_schema(constraint, vocab, **options)
    return compiled._automaton


def exact(a: TokenAutomaton, state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The state's mask from one walk of the whole trie from the state itself (nothing clamped),
    and its tokens with the states they lead to."""
    tokens, nexts = a.transitions(state)
    return a._pack(tokens, a.is_accepting(state)), tokens, nexts


def check_walk(a: TokenAutomaton, rng: random.Random, steps: int) -> int:
    """Masks compared along a random walk of allowed tokens, often long ones or ones to states
    whose counts clamping changes; the number of such states met."""
    lengths = np.array([len(b) if b else 0 for b in a.token_bytes])
    state, clamped = a.initial_state, 0
    for _ in range(steps):
        want, tokens, nexts = exact(a, state)
        got = a.mask(state)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        assert a.mask_is_cached(state) and a.mask(state) is got
        clamped += a.table.clamp(state, a.long_tokens.limit) != state
        if not len(tokens):
            break
        targets = np.unique(nexts)
        changed = targets[[a.table.clamp(int(s), a.long_tokens.limit) != s for s in targets]]
        pools = [np.nonzero(lengths[tokens] > a.long_tokens.limit)[0], np.nonzero(np.isin(nexts, changed))[0]]
        pool = [p for p in pools if len(p) and rng.random() < 0.4]
        pick = rng.choice(pool[0].tolist()) if pool else rng.randrange(len(tokens))
        state = int(nexts[pick])
    return clamped


VOCABS: dict[str, Callable[[], constrain.Vocabulary]] = {"smollm2": smollm2, "tekken": tekken, "llama3": llama3}


@pytest.mark.parametrize("name", sorted(VOCABS))
def test_limit_leaves_few_long_tokens(name: str) -> None:
    vocab = VOCABS[name]()
    a = constrain.compile_regex("[a-z]{3,40}", vocab)._automaton
    lengths = np.array([len(b) if b else 0 for b in vocab.token_bytes])
    limit = a.long_tokens.limit
    assert limit < a.long_tokens.longest == int(lengths.max())
    assert np.count_nonzero(lengths > limit) <= MAX_LONG_TOKENS < np.count_nonzero(lengths > limit - 1)
    assert a.long_tokens.trie is not None and a.long_tokens.trie.size == np.count_nonzero(lengths > limit)
    short = np.unpackbits(a.long_tokens.short.view(np.uint8), bitorder="little")[:len(lengths)]
    assert np.array_equal(short.astype(bool), (lengths > 0) & (lengths <= limit))


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c[1])[:40] + str(c[2]))
@settings(max_examples=4, deadline=None)
@given(rng=st.randoms(use_true_random=False))
def test_masks_exact_native(case: tuple, rng: random.Random) -> None:
    for vocab in (smollm2(), tekken()):
        check_walk(compile_case(case, vocab, native=True), rng, steps=30)


@pytest.mark.parametrize("case", CASES[::2], ids=lambda c: str(c[1])[:40] + str(c[2]))
@settings(max_examples=2, deadline=None)
@given(rng=st.randoms(use_true_random=False))
def test_masks_exact_twin(case: tuple, rng: random.Random) -> None:
    check_walk(compile_case(case, smollm2(), native=False), rng, steps=20)


@pytest.mark.parametrize("native", [True, False])
def test_walks_reach_clamped_states(native: bool) -> None:
    """The walks above do meet states whose counts clamping changes (or they would prove nothing),
    the intersection of a pattern with a length included."""
    met = [sum(check_walk(compile_case(case, smollm2(), native=native), random.Random(seed), steps=30) for seed in range(3))
           for case in CASES]
    assert all(n >= 3 for n in met), met


@pytest.mark.parametrize("native", [True, False])
def test_full_walks_bounded_by_short_limit(native: bool) -> None:
    """90 characters into a string of at most 100 take a full walk for each count that leaves
    fewer characters than the limit and one for all the others (their clamped state); the long
    tokens are walked apart."""
    vocab = smollm2()
    compiled = GrammarCompiler(native=native).compile_json_schema({"type": "string", "maxLength": 100}, vocab)
    a = compiled._automaton
    walker = a.walker
    calls = []
    for verb in ("mask", "head", "below"):
        real = getattr(walker, verb)
        setattr(walker, verb, lambda *args, real=real, verb=verb: calls.append(verb) or real(*args))
    quote, letter = vocab.token_bytes.index(b'"'), vocab.token_bytes.index(b"a")
    state = a.next_state(a.initial_state, quote)
    for _ in range(90):
        assert np.array_equal(a.mask(state), exact(a, state)[0])
        state = a.next_state(state, letter)
    assert 0 < len(calls) <= a.long_tokens.limit + 2


@pytest.mark.parametrize("native", [True, False])
def test_counts_clamped_by_the_items_length(native: bool) -> None:
    """A token of at most ``limit`` bytes starts at most T = (limit - 1) // 3 + 1 iterations of
    ``abc``: the states of ``(abc){0,60}`` with T or more left share one clamped state."""
    a = GrammarCompiler(native=native).compile_regex("(abc){0,60}", smollm2())._automaton
    limit = a.long_tokens.limit
    state, keys = a.initial_state, set()
    for _ in range(59):  # (the start is the rule, then 59 iterations left, ..., 1)
        state = a.table.step_bytes(state, b"abc")
        keys.add(a.table.clamp(state, limit))
    assert len(keys) == (limit - 1) // 3 + 1 < limit


ANY_AB = ir.repeat(ir.byte_set(b"ab"), 0, None)
# items whose matches are longer than a byte: a token starts fewer of their iterations
ITEMS = st.sampled_from([ir.byte_set(b"ab"), ir.literal("ab"), ir.alt(ir.literal("abb"), ir.literal("ba")),
                         ir.seq(ir.literal("a"), ir.repeat(ir.literal("b"), 0, 2))])


@settings(max_examples=400, deadline=None)
# The tight case: after "a", the token "b" leads to the longest shortest completion (B = 4 bytes),
# so the 4 iterations left are told apart from unbounded ones by 1 + 4 bytes and must stay.
@example(item=ir.byte_set(b"ab"), other=ir.seq(ir.literal("a"), ir.alt(ir.literal("baaaa"), ir.literal("a"))),
         ending=0, lo=0, hi=5, limit=1, within=True, native=False)
@example(item=ir.byte_set(b"ab"), other=ir.seq(ir.literal("a"), ir.alt(ir.literal("baaaa"), ir.literal("a"))),
         ending=0, lo=0, hi=5, limit=1, within=True, native=available())
@given(item=st.one_of(ITEMS, expressions), other=st.one_of(st.just(ANY_AB), expressions), ending=st.integers(0, 4),
       lo=st.integers(0, 4), hi=st.integers(2, 14), limit=st.integers(1, 5), within=st.booleans(),
       native=st.booleans() if available() else st.just(False))
def test_clamped_state_agrees_on_short_strings(item: ir.Node, other: ir.Node, ending: int, lo: int, hi: int,
                                               limit: int, within: bool, native: bool) -> None:
    """A counted repetition, followed by more or inside an intersection, and its clamped state agree
    on every string of at most ``limit`` bytes on whether it leads somewhere live (a token allowed),
    and on every shorter one on whether it is a match (a token crossing into what follows has a
    byte after the match). The oracle is the unclamped state itself."""
    # (an ending of ``ending`` times "ab" makes completions long, after a loop of one-byte items: a
    # count may be lifted only where they fit below it)
    rest = ir.seq(other, ir.repeat(ir.literal("ab"), ending, ending))
    counted = ir.repeat(item, min(lo, hi), hi)
    node = ir.intersect(counted, rest) if within else ir.seq(counted, rest)
    table = (NativeExprTable if native else ExprTable)(ir.Grammar.of(node))
    for first in (b"", b"a", b"b"):  # (the start is the rule; the state itself, after a byte)
        state = table.step_bytes(table.start, first)
        clamped = table.clamp(state, limit)
        for n in range(limit + 1):
            for t in map(bytes, itertools.product(b"ab", repeat=n)):
                a, b = table.step_bytes(state, t), table.step_bytes(clamped, t)
                assert (a != NOTHING and table.is_live(a)) == (b != NOTHING and table.is_live(b)), first + t
                if n < limit:
                    assert (a != NOTHING and table.nullable(a)) == (b != NOTHING and table.nullable(b)), first + t


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 1000},
                                    {"type": "string", "pattern": "^[a-z]*$", "maxLength": 1000}])
def test_long_tokens_walked_once_far_from_the_count(schema: dict) -> None:
    """Counts beyond the longest token do not change the long tokens' walk either: 150 characters
    into a string of at most 1000 (with a pattern: an intersection), they are walked once."""
    vocab = smollm2()
    a = constrain.compile_json_schema(schema, vocab)._automaton
    assert a._long_walker is not None
    calls = []
    real = a._long_walker.mask
    a._long_walker.mask = lambda state: calls.append(state) or real(state)
    quote, letter = vocab.token_bytes.index(b'"'), vocab.token_bytes.index(b"a")
    state = a.next_state(a.initial_state, quote)
    for _ in range(150):
        assert np.array_equal(a.mask(state), exact(a, state)[0])
        state = a.next_state(state, letter)
    assert len(calls) == 1


@pytest.mark.parametrize("native", [True, False])
def test_count_that_binds_stays_while_the_others_go(native: bool) -> None:
    """JSONSchemaBench Github_easy/o21053: at most 100 words under a maxLength of 5000. Near the
    last words their count binds within a long token while the length does not: the states with as
    many words left share one walk whatever their length (before, none was clamped there, and the
    walks of new lengths grew the table by ~10,000 expressions a token, past the memory budget)."""
    vocab = smollm2()
    schema = {"type": "string", "pattern": r"^(?:\S+\s+){0,40}\S+$", "maxLength": 5000}
    a = GrammarCompiler(native=native).compile_json_schema(schema, vocab)._automaton
    start = a.table.step_bytes(a.initial_state, b'"')
    short, long = a.table.step_bytes(start, b"a " * 10), a.table.step_bytes(start, b"abc " * 10)
    keys = {a.table.clamp(s, a.long_tokens.longest) for s in (short, long)}
    assert len(keys) == 1 and short not in keys
    for s in (short, long):
        assert np.array_equal(a.mask(s), exact(a, s)[0])
