"""The trie layout against the token bytes it was built from, and split masks (a head walked once
for every tail, tokens that cross into the tail walked again from where they cross) against full
trie walks and against derivatives taken byte by byte, token by token."""

from __future__ import annotations

import bisect
import random
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import constrain
import constrain.automaton as automaton_module
from constrain.derivatives import NOTHING
from constrain.grammars import ir
from constrain.token_trie import TokenTrie
from constrain.tokenizers import tekken


def check_nodes(trie: TokenTrie, token_bytes: list[bytes | None], nodes) -> None:
    """Each node's path, tokens, subtree and children, from a sorted list of the token bytes."""
    ranked = sorted((b, i) for i, b in enumerate(token_bytes) if b)
    keys = [b for b, _ in ranked]
    for node in nodes:
        path = trie.prefix(node)
        depth = len(path) - 1
        level = trie.levels[depth]
        assert level.start <= node < level.start + len(level.byte)
        lo, hi = bisect.bisect_left(keys, path), bisect.bisect_left(keys, path + b"\xff" * 80)
        assert (trie.rank_start[node], trie.rank_end[node]) == (lo, hi)
        ending = trie.end_tokens[trie.tok_start[node]:trie.tok_end[node]].tolist()
        assert sorted(ending) == sorted(i for b, i in ranked[lo:hi] if b == path)
        children = range(trie.child_start[node], trie.child_end[node])
        assert [trie.prefix(c) for c in children] == sorted({b[: depth + 2] for b, _ in ranked[lo:hi] if len(b) > depth + 1})
        if depth:
            parent = trie.levels[depth - 1].start + level.parent[node - level.start]
            assert trie.parent[node] == parent and trie.prefix(parent) == path[:-1]
        else:
            assert trie.parent[node] == -1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=5).map(lambda b: bytes(c % 3 + 97 for c in b))),
                max_size=40))
def test_layout_of_small_vocabularies(token_bytes) -> None:
    """Duplicates, tokens that are prefixes of others, ids without bytes."""
    trie = TokenTrie(token_bytes)
    check_nodes(trie, token_bytes, range(len(trie.byte)))
    assert trie.size == sum(1 for b in token_bytes if b)


def test_layout_of_a_real_vocabulary() -> None:
    vocab = tekken()
    trie = TokenTrie(vocab.token_bytes)
    rng = np.random.default_rng(0)
    deep = [level.start for level in trie.levels[-5:]]
    check_nodes(trie, vocab.token_bytes, [*rng.choice(len(trie.byte), 300, replace=False).tolist(), *deep])


ALPHABET = b'a ,["]'


def recursive_grammar() -> ir.Grammar:
    """Nested lists with optional bounded spaces: heads that may end in the middle of a token,
    and a head (``tag``) that may end in different states where its tail may start ("a ")."""
    ws = ir.repeat(ir.literal(" "), 1, 3)
    word = ir.seq(ir.literal('"'), ir.repeat(ir.byte_set(b"a ,")), ir.literal('"'))
    return ir.Grammar({
        "start": ir.seq(ir.optional(ir.ref("ws")), ir.ref("value"), ir.optional(ir.ref("ws"))),
        "ws": ws,
        "tag": ir.alt(ir.repeat(ir.literal("a"), 1, 3), ir.literal('"a')),
        "value": ir.alt(ir.ref("list"), ir.repeat(ir.literal("a"), 1, None), word,
                        ir.seq(ir.literal("["), ir.ref("tag"), ir.optional(ir.literal("a ")), ir.literal("]"))),
        "list": ir.seq(ir.literal("["), ir.optional(ir.ref("ws")), ir.optional(ir.seq(
            ir.ref("value"), ir.repeat(ir.seq(ir.optional(ir.ref("ws")), ir.literal(","), ir.optional(ir.ref("ws")),
                                              ir.ref("value"))))), ir.optional(ir.ref("ws")), ir.literal("]")),
    })


def bytewise_allowed(compiled: constrain.CompiledGrammar, state: int) -> set[int]:
    table = compiled._automaton.table
    allowed = set()
    for tok, data in enumerate(compiled.vocab.token_bytes):
        s = state
        for b in data or b"":
            s = table.derive(s, b)
            if s == NOTHING:
                break
        if data and s != NOTHING and table.is_live(s):
            allowed.add(tok)
    return allowed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=2, max_size=6).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] for c in b)),
                max_size=60), st.integers(0, 2**32 - 1))
def test_split_masks_equal_full_walks_and_bytewise_derivatives(extra, seed) -> None:
    """Every head split at its first visit and every union assembled member by member (the
    alphabet is narrower than ``MIN_SPLIT_BYTES``, which would walk most states whole)."""
    fixed = [bytes([c]) for c in ALPHABET] + [b'"aa]', b'"aaa', b"aaa]", b'"a a', b"aa ]"]
    vocab = constrain.Vocabulary.from_token_bytes(fixed + extra + [None], eos_token_ids=[len(fixed) + len(extra)])
    compiled = constrain.compile_grammar(recursive_grammar(), vocab)
    automaton = compiled._automaton
    m = compiled.matcher()
    assert m.accept_bytes(b"[ [")
    rng = random.Random(seed)
    with mock.patch.object(automaton_module, "MIN_SPLIT_BYTES", 1):
        for _ in range(40):
            state = m.state
            tokens, _ = automaton.transitions(state)
            assert np.array_equal(automaton.mask(state), automaton._pack(tokens, automaton.is_accepting(state)))
            assert set(tokens.tolist()) == bytewise_allowed(compiled, state)
            if not len(tokens):
                break
            assert m.accept_token(rng.choice(sorted(tokens.tolist())))
    assert automaton._head_states, "the split path was never taken"
