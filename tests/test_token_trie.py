"""Tries cut out of a vocabulary's trie (``TokenTrie.restrict``) against tries built from scratch
from the same tokens' bytes (equal layouts and equal walks: tokens and next states), and both
walks against the derivatives taken byte by byte, token by token (which knows nothing of tries)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import constrain
from constrain.automaton import trie_for
from constrain.derivatives import NOTHING
from constrain.token_trie import TokenTrie
from constrain.tokenizers import tekken

FIELDS = ("byte", "parent", "child_start", "child_end", "tok_start", "tok_end", "end_tokens", "end_nodes")


def scratch(token_bytes: list[bytes | None], ids) -> TokenTrie:
    """The oracle: a trie built from the bytes of just ``ids``."""
    chosen = set(int(i) for i in ids)
    return TokenTrie([b if i in chosen else None for i, b in enumerate(token_bytes)])


def walk(automaton, state: int, trie: TokenTrie) -> list[tuple[int, int]]:
    tokens, nexts = automaton.transitions(state, trie)
    return sorted(zip(tokens.tolist(), nexts.tolist()))


def bytewise(automaton, state: int, token_bytes: list[bytes | None], ids) -> list[tuple[int, int]]:
    out = []
    for tok in sorted(set(int(i) for i in ids)):
        s = state
        for b in token_bytes[tok] or b"":
            s = automaton.table.derive(s, b)
            if s == NOTHING or not automaton.table.is_live(s):
                break
        else:
            if token_bytes[tok]:
                out.append((tok, s))
    return out


def assert_same(compiled: constrain.CompiledGrammar, texts: list[bytes], ids) -> None:
    automaton = compiled._automaton
    cut = automaton.trie.restrict(np.asarray(ids, dtype=np.int64))
    built = scratch(compiled.vocab.token_bytes, ids)
    assert (cut.size, cut.depth) == (built.size, built.depth)
    for mine, theirs in zip(cut.levels, built.levels):
        for name in FIELDS:
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name
    for text in texts:
        state = compiled.initial_state
        for b in text:
            state = automaton.table.derive(state, b)
        assert state != NOTHING
        expected = bytewise(automaton, state, compiled.vocab.token_bytes, ids)
        assert walk(automaton, state, cut) == walk(automaton, state, built) == expected


small_vocab = st.lists(
    st.one_of(st.none(), st.text(alphabet='ab"', min_size=1, max_size=5).map(str.encode)), min_size=1, max_size=40
)


@settings(max_examples=150, deadline=None)
@given(small_vocab, st.data())
def test_restricted_small_vocabularies_equal_scratch_tries(token_bytes, data) -> None:
    """Duplicates, prefixes of each other, ids without bytes (ignored, as by the constructor)."""
    ids = data.draw(st.lists(st.integers(0, len(token_bytes) - 1), max_size=50))
    vocab = constrain.Vocabulary.from_token_bytes([*token_bytes, None], eos_token_ids=[len(token_bytes)])
    compiled = constrain.compile_regex(r'(a|b)*"(ab)*"?', vocab)
    assert_same(compiled, [b"", b"a", b'ab"', b'"ab'], ids)


JSONISH = r'\{("[a-z ]*": ?(-?[0-9]+|"([^"\\]|\\.)*")(, ?)?)*\}'


@settings(max_examples=12, deadline=None)
@given(st.one_of(
    st.lists(st.integers(0, 131071), max_size=400),
    st.binary(min_size=1, max_size=2),  # every token that starts with these bytes: long shared prefixes
))
def test_restricted_real_vocabulary_equals_scratch_trie(chosen) -> None:
    vocab = tekken()
    if isinstance(chosen, bytes):
        chosen = [i for i, b in enumerate(vocab.token_bytes) if b and b.startswith(chosen)]
    compiled = constrain.compile_regex(JSONISH, vocab)
    assert_same(compiled, [b"", b'{"ab', b'{"a": "x\\', b'{"a":-1'], chosen)


def test_restricting_to_everything_gives_the_full_trie() -> None:
    vocab = tekken()
    full = trie_for(vocab)
    cut = full.restrict(np.arange(len(vocab.token_bytes)))
    for mine, theirs in zip(cut.levels, full.levels, strict=True):
        for name in FIELDS:
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name
