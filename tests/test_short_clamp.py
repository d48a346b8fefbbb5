"""Masks of states whose repetition counts are clamped below the longest token
(``TokenAutomaton.mask``, ``LongTokens``) against one walk of the whole trie from the state itself,
along random walks of real tokens through counted strings, arrays, whitespace runs and regexes;
with the C++ walker and table and with their numpy/Python twins."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import constrain
from constrain.automaton import MAX_LONG_TOKENS, TokenAutomaton
from constrain.compiler import GrammarCompiler
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
        clamped += a.table.clamp(state) != state
        if not len(tokens):
            break
        targets = np.unique(nexts)
        changed = targets[[a.table.clamp(int(s)) != s for s in targets]]
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
    assert a.table.clamp_limit == limit < int(lengths.max())
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


def test_walks_reach_clamped_states() -> None:
    """The walks above do meet states whose counts clamping changes (or they would prove nothing),
    except inside the intersection, which clamping leaves whole."""
    met = [sum(check_walk(compile_case(case, smollm2(), native=True), random.Random(seed), steps=30) for seed in range(3))
           for case in CASES]
    assert all(n >= 3 for case, n in zip(CASES, met) if case is not CASES[3])


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
