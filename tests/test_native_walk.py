"""The C++ trie walk (``constrain._core``) against its Python twin (``constrain.walkers.NumpyWalker``)
and, on small vocabularies, against derivatives taken token by token: transitions and masks
identical, on random regexes, real schemas and real vocabularies."""

from __future__ import annotations

import gzip
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.walks import regexes, small_vocabularies

import constrain
from constrain import _core
from constrain.automaton import TokenAutomaton
from constrain.compiler import GrammarCompiler
from constrain.testing.corpus import DEFAULT_DATA
from constrain.token_trie import TokenTrie
from constrain.tokenizers import llama3, tekken
from constrain.walkers import NativeWalker, NumpyWalker

DATA = DEFAULT_DATA / "jsonschemabench"


def python_walk(automaton: TokenAutomaton, state: int) -> tuple[np.ndarray, np.ndarray]:
    return NumpyWalker(automaton.trie, automaton.table, automaton.n_words).transitions(state)


def native_walk(automaton: TokenAutomaton, state: int) -> tuple[np.ndarray, np.ndarray]:
    assert automaton.trie.packed is not None, "constrain._core is built but the trie has no packed twin"
    return NativeWalker(automaton.trie, automaton.table, automaton.n_words).transitions(state)


def by_token(tokens: np.ndarray, nexts: np.ndarray) -> dict[int, int]:
    pairs = dict(zip(tokens.tolist(), nexts.tolist()))
    assert len(pairs) == len(tokens), "a token came back twice"
    return pairs


def check_state(automaton: TokenAutomaton, state: int, per_token: bool = False) -> dict[int, int]:
    """The two walks (and, with ``per_token``, ``next_state`` for every id) agree on ``state``."""
    native = native_walk(automaton, state)
    assert native[0].dtype == np.int32 and native[1].dtype == np.int32
    expected = by_token(*python_walk(automaton, state))
    got = by_token(*native)
    assert got == expected
    accepting = automaton.is_accepting(state)
    assert np.array_equal(automaton._pack(native[0], accepting), automaton._pack(python_walk(automaton, state)[0], accepting))
    if per_token:
        oracle = {t: automaton.next_state(state, t) for t in range(len(automaton.token_bytes))}
        assert got == {t: s for t, s in oracle.items() if s > 0}
    return got


def walk_states(automaton: TokenAutomaton, rng: random.Random, steps: int, per_token: bool = False) -> None:
    """Check the states of a random walk of ``steps`` tokens from the start."""
    state = automaton.initial_state
    for _ in range(steps):
        allowed = check_state(automaton, state, per_token)
        if not allowed:
            return
        state = allowed[rng.choice(sorted(allowed))]


def automaton_of(compiled: constrain.CompiledGrammar) -> TokenAutomaton:
    return compiled._automaton


# ---------------------------------------------------------------- the packed layout

def prefixes(token_bytes: list[bytes | None]) -> list[bytes]:
    return sorted({t[:d] for t in token_bytes if t for d in range(1, len(t) + 1)})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=5).map(lambda b: bytes(c % 3 + 97 for c in b))),
                max_size=40))
def test_packed_nodes_are_the_depth_first_trie(token_bytes) -> None:
    """Node i is the i-th prefix in byte order; its depth, subtree size, token and path say so too."""
    trie = _core.PackedTrie(token_bytes)
    nodes = trie.nodes()
    paths = prefixes(token_bytes)
    assert trie.node_count == len(nodes) == len(paths) + 1
    assert trie.token_count == sum(1 for t in token_bytes if t)
    assert nodes[0, 1] >> 8 == len(nodes) and nodes[0, 1] & 0xFF == 0
    assert trie.path(0) == b""
    for node, (path, (token_byte, size_depth)) in enumerate(zip(paths, nodes[1:].tolist()), start=1):
        assert trie.path(node) == path
        assert token_byte & 0xFF == path[-1]
        assert size_depth & 0xFF == len(path)
        assert size_depth >> 8 == sum(p.startswith(path) for p in paths)
        ids = [i for i, t in enumerate(token_bytes) if t == path]
        token = token_byte >> 8
        if not ids:
            assert token == 0xFFFFFF
        elif len(ids) == 1:
            assert token == ids[0]
        else:  # duplicates: a group, numbered past the ids
            assert len(token_bytes) <= token < 0xFFFFFF


# 16 ASCII letters and 4 bytes of UTF-8 characters: a loop of 16 bytes or more lends its slice.
LETTERS = bytes(range(97, 113)) + b"\xc3\x80\x81\x82"


def slice_table(inside: set[int], moves: list[int], nullable: list[bool]) -> Table:
    """Rows over LETTERS: state 1 goes where ``moves`` say; 2 loops on ``inside`` (elsewhere: where
    ``moves`` say); 3 loops on every letter; 4 goes to 1, 2 or 3 by letter; 5 is inside a UTF-8
    character (\\x80-\\x82 back to 2, nothing else)."""
    table = Table()
    table.rows = np.zeros((6, 256), np.int32)
    for i, c in enumerate(LETTERS):
        table.rows[1, c] = moves[i]
        table.rows[2, c] = 2 if c in inside else moves[20 + i]
        table.rows[3, c] = 3
        table.rows[4, c] = i % 3 + 1
    table.rows[5, [0x80, 0x81, 0x82]] = 2
    table.row_done = np.array([True, False, False, False, False, False])
    table.row_nullable = np.array([False, *nullable])
    return table


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=5).map(lambda b: bytes(LETTERS[c % 20] for c in b))),
                max_size=60), st.sets(st.sampled_from(LETTERS), min_size=16),
       st.lists(st.integers(0, 5), min_size=40, max_size=40), st.lists(st.booleans(), min_size=5, max_size=5))
@example([b"a\xc3b", b"a\xc3\x80b", b"ab"], set(LETTERS[:16]), [2] * 16 + [0] * 20 + [5, 0, 0, 0], [False] * 5)
def test_slices_skip_nodes_never_tokens_or_ends(token_bytes, inside, moves, nullable) -> None:
    """A walk that takes a slice (from a state that loops on many bytes, or that leads to one; its
    region with the UTF-8 states around it) allows the tokens that the plain walk and the rows
    token by token allow, and finds the same ends."""
    trie = _core.PackedTrie(token_bytes)
    table = slice_table(inside, moves, nullable)

    def allowed(start: int) -> list[int]:
        out = []
        for i, t in enumerate(token_bytes):
            s = start
            for c in t or b"":
                s = int(table.rows[s, c]) if s else 0
            if t and s:
                out.append(i)
        return out

    for start in (1, 2, 3, 4, 5):
        got = trie.mask(table, start)
        assert np.nonzero(np.unpackbits(got.view(np.uint8), bitorder="little"))[0].tolist() == allowed(start)
        assert np.array_equal(got, trie.mask(table, start, slices=False))
        for a, b in zip(trie.head_mask(table, start), trie.head_mask(table, start, slices=False)):
            assert np.array_equal(a, b)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=5).map(lambda b: bytes(c % 3 + 97 for c in b))),
                max_size=40), st.sets(st.sampled_from(b"abc")))
def test_a_slice_holds_the_tokens_and_exits_below_the_first_byte(token_bytes, inside) -> None:
    """Of a one-state region (a byte set looping on itself): the tokens whose bytes after the first
    are in the set, and the nodes below the first byte where a path first leaves it."""
    trie = _core.PackedTrie(token_bytes)
    region = np.full((1, 256), -1, np.int8)
    region[0, list(inside)] = 0
    held = trie.nbytes
    cut = trie.slice(region)
    assert trie.nbytes > held, "a slice kept with the trie is weighed with it"
    paths = prefixes(token_bytes)
    assert cut.exit_count == sum(len(p) >= 2 and p[-1] not in inside and all(c in inside for c in p[1:-1]) for p in paths)
    assert cut.token_count == sum(bool(t) and len(t) >= 2 and all(c in inside for c in t[1:]) for t in token_bytes)
    with pytest.raises(ValueError, match="entry is -1 or a state"):
        trie.slice(np.full((1, 256), 3, np.int8))


def test_packed_trie_refuses_what_a_node_cannot_hold() -> None:
    with pytest.raises(ValueError, match="token 1 has 256 bytes"):
        _core.PackedTrie([b"a", b"x" * 256])
    with pytest.raises(TypeError, match=r"token_bytes\[1\] is a str"):
        _core.PackedTrie([b"a", "b"])
    assert TokenTrie([b"a", b"x" * 256]).packed is None  # such a vocabulary keeps the numpy walk


class Table:
    """A hand-made row table: state 1 --a--> 2 --b--> 3, rows filled on demand (``fill``)."""

    def __init__(self, fill=None) -> None:
        self.rows = np.zeros((4, 256), np.int32)
        self.rows[1, ord("a")] = 2
        self.rows[2, ord("b")] = 3
        self.row_done = np.array([True, True, False, False])
        self.row_nullable = np.zeros(4, bool)
        self.fill = fill or (lambda s: self.row_done.__setitem__(s, True))

    def ensure_rows(self, states) -> None:
        for s in states:
            self.fill(s)


def test_the_table_must_hand_back_the_row() -> None:
    trie = _core.PackedTrie([b"a", b"ab"])
    tokens, nexts = trie.transitions(Table(), 1)
    assert tokens.tolist() == [0, 1] and nexts.tolist() == [2, 3]
    with pytest.raises(ValueError, match="no row for state 2"):
        trie.transitions(Table(fill=lambda s: None), 1)
    broken = Table()
    broken.rows = broken.rows.astype(np.int64)  # no silent copy of a table of another dtype
    with pytest.raises(TypeError, match="row table must have rows"):
        trie.mask(broken, 1)
    with pytest.raises(IndexError, match="node 9 is not a node below the root"):
        trie.mask_below(Table(), np.array([9], np.int32), np.array([1], np.int32))


# ---------------------------------------------------------------- walks: the twins agree

@settings(max_examples=80, deadline=None)
@given(regexes(), small_vocabularies, st.randoms(use_true_random=False))
def test_random_regexes_on_small_vocabularies(pattern, token_bytes, rng) -> None:
    """Duplicates, prefixes of other tokens and multi-byte characters; every id checked one by one."""
    vocab = constrain.Vocabulary.from_token_bytes([*token_bytes, None], eos_token_ids=[len(token_bytes)])
    try:
        compiled = constrain.compile_regex(pattern, vocab)
    except constrain.GrammarError:  # e.g. no token can start a document
        return
    walk_states(automaton_of(compiled), rng, steps=6, per_token=True)


@pytest.fixture(scope="module", params=["tekken", "llama3"])
def real_vocab(request) -> constrain.Vocabulary:
    return {"tekken": tekken, "llama3": llama3}[request.param]()


@settings(max_examples=25, deadline=None)
@given(regexes(), st.randoms(use_true_random=False))
def test_random_regexes_on_a_real_vocabulary(pattern, rng) -> None:
    vocab = tekken()
    try:
        compiled = constrain.compile_regex(pattern, vocab)
    except constrain.GrammarError:
        return
    walk_states(automaton_of(compiled), rng, steps=4)


def test_builtin_json_grammar_on_real_vocabularies(real_vocab) -> None:
    """Dense states (string bodies) and the grammar stack's states, on a random walk."""
    text = (Path(constrain.grammars.__file__).parent / "json.lark").read_text()
    walk_states(automaton_of(constrain.compile_lark(text, real_vocab)), random.Random(0), steps=40)


def jsonschemabench_slice(every: int) -> list[dict]:
    with gzip.open(DATA / "Github_easy.jsonl.gz", "rt") as lines:
        return [json.loads(line)["schema"] for i, line in enumerate(lines) if i % every == 0]


@pytest.mark.skipif(not DATA.exists(), reason="JSONSchemaBench data not present")
def test_real_schemas_on_real_vocabularies(real_vocab) -> None:
    rng = random.Random(1)
    compiled = 0
    for schema in jsonschemabench_slice(every=150):
        try:
            grammar = constrain.compile_json_schema(schema, real_vocab)
        except constrain.GrammarError:
            continue
        walk_states(automaton_of(grammar), rng, steps=12)
        compiled += 1
    assert compiled >= 3


def test_walks_from_many_threads_agree(real_vocab) -> None:
    """Walks of a fresh grammar from four threads at once: rows are filled through the callback
    while other walks run without the GIL, and every result equals the Python walk's."""
    automaton = automaton_of(GrammarCompiler().compile_regex(r'\[("[^"\\]{0,5}"|[0-9]{1,3})(,("[a-z]*"|-?[0-9]+))*\]',
                                                             real_vocab))
    states = [automaton.initial_state]
    for byte in b'["ab':
        states.append(int(automaton.table.row(states[-1])[byte]))
    rows_before = int(automaton.table.row_done.sum())
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda s: by_token(*native_walk(automaton, s)), states * 4))
    assert int(automaton.table.row_done.sum()) > rows_before  # the walks did fill rows
    for state, got in zip(states * 4, results):
        assert got == by_token(*python_walk(automaton, state))


def test_a_walk_steps_through_thin_nodes_without_rows() -> None:
    """Deep in a long token a new state's row would derive every byte class for the one byte that
    follows: the C++ walk steps through such states (their rows stay unfilled) and allows what the
    rows of the Python table allow, token by token."""
    from constrain.derivatives import ExprTable
    from constrain.grammars import ir
    from constrain.native_derivatives import NativeExprTable

    words = ir.repeat(ir.seq(ir.repeat(ir.byte_set(b"ab"), 1, None), ir.literal(" ")), 0, 12)
    node = ir.intersect(words, ir.repeat(ir.byte_set(b"ab "), 0, 70))  # (a product: a new state per byte)
    tokens = [b"a", b"b", b" ", b"a" * 40, b"ab " * 10, b"ab " * 13, b"b" * 69 + b" ", b"b" * 70 + b" ", None]
    trie = _core.PackedTrie(tokens)
    native, twin = NativeExprTable(ir.Grammar.of(node)), ExprTable(ir.Grammar.of(node))
    got, want = trie.mask(native, native.start), trie.mask(twin, twin.start)
    assert np.array_equal(got, want)
    assert np.nonzero(np.unpackbits(got.view(np.uint8), bitorder="little"))[0].tolist() == [0, 1, 3, 4, 6]
    assert int(native.row_done.sum()) < 10 < int(twin.row_done.sum())
