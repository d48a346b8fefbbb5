"""Masks on the public path (``TokenAutomaton.mask``: split heads, crossings into tails, unions)
with the C++ walker against its numpy twin, and head walks compared piece by piece; on small
vocabularies also against derivatives taken token by token. Random regexes, the built-in grammars
and real schemas fed their real instances, on real vocabularies."""

from __future__ import annotations

import ast
import gzip
import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.walks import regexes, small_vocabularies

import constrain
from constrain.automaton import TokenAutomaton
from constrain.compiler import GrammarCompiler
from constrain.derivatives import ALL_BYTES
from constrain.grammars import ir
from constrain.grammars.builtin import builtin_grammar, names
from constrain.grammars.regex import regex_to_ir
from constrain.testing.corpus import DEFAULT_DATA
from constrain.tokenizers import tekken
from constrain.walkers import HeadWalk, NativeWalker, NumpyWalker

DATA = DEFAULT_DATA / "jsonschemabench"


def two_rules(head: str, tail: str) -> ir.Grammar:
    """``head`` then ``tail`` as two rules: inside the first, states are ``FRAME(rest) tail``
    sequences, which take the split path (a single regex's states are frames)."""
    return ir.Grammar({"start": ir.seq(ir.ref("head"), ir.ref("tail")), "head": regex_to_ir(head),
                       "tail": regex_to_ir(tail)})


def twins(compiled: constrain.CompiledGrammar) -> tuple[TokenAutomaton, TokenAutomaton]:
    """The compiled grammar's automaton (native) and a numpy twin over the same expression table."""
    native = compiled._automaton
    assert isinstance(native.walker, NativeWalker), "constrain._core is not built"
    return native, TokenAutomaton(native.table, native.vocab, native.shared, native=False)


def mask_ids(words: np.ndarray) -> np.ndarray:
    return np.nonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))[0]


def check_mask(native: TokenAutomaton, twin: TokenAutomaton, state: int, per_token: bool = False) -> np.ndarray:
    got = native.mask(state)
    assert got.dtype == np.int32 and got.shape == (native.n_words,)
    assert np.array_equal(got, twin.mask(state))
    tokens, _ = native.transitions(state)  # one walk of the whole state: the oracle of split and union masks
    assert np.array_equal(got, native._pack(tokens, native.is_accepting(state)))
    if per_token:  # the oracle: one derivative per byte of every token
        allowed = {t for t in range(len(native.token_bytes)) if native.next_state(state, t) > 0}
        if native.is_accepting(state):
            allowed |= set(native.eos_token_ids)
        assert set(mask_ids(got).tolist()) == allowed
    return got


def walk(native: TokenAutomaton, twin: TokenAutomaton, rng: random.Random, steps: int,
         per_token: bool = False) -> int:
    """Compare the masks along a random walk from the start; the number of states compared."""
    state = native.initial_state
    for step in range(steps):
        ids = [t for t in mask_ids(check_mask(native, twin, state, per_token)).tolist()
               if t < len(native.token_bytes) and native.token_bytes[t]]
        if not ids:
            return step + 1
        state = native.next_state(state, rng.choice(ids))
        assert state > 0
    return steps


def feed(native: TokenAutomaton, twin: TokenAutomaton, data: bytes) -> int:
    """Compare the masks at every state of ``data`` fed token by token (greedy longest match, as
    a model's output splits text); the number of states compared."""
    by_bytes = {t: i for i, t in enumerate(native.token_bytes) if t}
    state, i, seen = native.initial_state, 0, 0
    while i < len(data):
        check_mask(native, twin, state)
        seen += 1
        j = next(j for j in range(min(len(data), i + 16), i, -1) if data[i:j] in by_bytes)
        state = native.next_state(state, by_bytes[data[i:j]])
        if state <= 0:
            return seen  # the grammar refuses this instance here (not this test's business)
        i = j
    check_mask(native, twin, state)
    return seen + 1


def unions_along(native: TokenAutomaton, twin: TokenAutomaton,
                 docs: tuple[bytes, ...]) -> Iterator[tuple[int, tuple[int, ...], np.ndarray]]:
    """Feed each of ``docs`` through both twins (``feed``), then yield the byte-level states along it
    that are unions: the state, its members and the mask of one walk of the whole union."""
    for doc in docs:
        assert feed(native, twin, doc) > 10
        state = native.initial_state
        for byte in doc:
            state = int(native.table.row(state)[byte])
            members = native.table.alternatives(state)
            if members:
                yield state, members, native._with_stops(native.walker.mask(state), native.is_accepting(state))


def head_summary(walker: NativeWalker | NumpyWalker, walked: HeadWalk, table, head: int) -> tuple:
    """A head walk in terms both walkers share: the inside mask and, per node where the head may
    end, the node's bytes and the head's state at its parent."""
    inside, node, group, head_paths = walked
    if isinstance(walker, NativeWalker):
        paths = [walker.packed.path(int(n)) for n in node]
    else:
        paths = [walker.trie.prefix(int(n)) for n in node]
    states = [table.derive_bytes(head, head_paths[g]) for g in group]
    assert all(table.derive_bytes(head, p[:-1]) == s for p, s in zip(paths, states))
    assert paths == sorted(paths), "nodes not in depth-first order"
    return inside.tolist(), list(zip(paths, states))


def check_heads(native: TokenAutomaton, twin: TokenAutomaton, state: int, first: int) -> None:
    """Head walk, crossings (tails starting with ``first``) and the walk below them, compared."""
    parts = native.table.split(state)
    if parts is None:
        return
    head, tail = parts
    table = native.table
    walks = [(w, w.head(head)) for w in (native.walker, twin.walker)]
    (nw, nwalked), (pw, pwalked) = walks
    assert head_summary(nw, nwalked, table, head) == head_summary(pw, pwalked, table, head)
    masks = []
    for w, walked in walks:
        nodes, group = w.crossings(walked, first)
        parents = np.array([table.seq(table.derive_bytes(head, p), tail) for p in walked[3]], dtype=np.int32)
        masks.append(w.below(nodes, parents[group]) if len(nodes) else np.zeros(native.n_words, np.int32))
    assert np.array_equal(*masks)


@settings(max_examples=80, deadline=None)
@given(regexes(), regexes(), small_vocabularies, st.randoms(use_true_random=False))
def test_split_masks_on_small_vocabularies(head, tail, token_bytes, rng) -> None:
    """``head tail`` states take the split path; every id checked one by one too."""
    vocab = constrain.Vocabulary.from_token_bytes([*token_bytes, None], eos_token_ids=[len(token_bytes)])
    try:
        compiled = constrain.compile_grammar(two_rules(f"({head})*", tail), vocab)
    except constrain.GrammarError:
        return
    native, twin = twins(compiled)
    walk(native, twin, rng, steps=6, per_token=True)


@settings(max_examples=60, deadline=None)
@given(regexes(), regexes(), small_vocabularies, st.integers(1, ALL_BYTES), st.randoms(use_true_random=False))
def test_head_walks_agree_piece_by_piece(head, tail, token_bytes, first, rng) -> None:
    vocab = constrain.Vocabulary.from_token_bytes(token_bytes)
    try:
        compiled = constrain.compile_grammar(two_rules(f"({head})*", tail), vocab)
    except constrain.GrammarError:
        return
    native, twin = twins(compiled)
    state = native.initial_state
    for _ in range(4):
        check_heads(native, twin, state, first | native.table.first_bytes(state))
        tokens, nexts = native.transitions(state)
        if not len(tokens):
            break
        state = int(nexts[rng.randrange(len(tokens))])


@pytest.mark.parametrize("head, tail, prefix", [('[^"]*', '"x', b"a"), ('"[^"\\\\]*"', "[0-9]{2}", b'"a'),
                                               ("[a-z0-9 ]{0,40}", ";", b"x"), ("(true|[a-z]+)", "[0-9]+", b"t")])
def test_heads_that_loop_on_many_bytes(head, tail, prefix) -> None:
    """String bodies and the like take the vocabulary's slice; a head that may end inside its loop
    records every node entered from it, so it walks the whole trie: both as the twin does. (Over
    tekken's first 4,000 tokens: the twin's ends are compared node by node.)"""
    vocab = constrain.Vocabulary.from_token_bytes([*tekken().token_bytes[:4000], None], eos_token_ids=[4000])
    native, twin = twins(GrammarCompiler().compile_grammar(two_rules(head, tail), vocab))
    state = native.table.derive_bytes(native.initial_state, prefix)
    parts = native.table.split(state)
    assert parts is not None
    check_heads(native, twin, state, native.table.first_bytes(parts[1]))
    check_mask(native, twin, state)


@settings(max_examples=15, deadline=None)
@given(regexes(), st.randoms(use_true_random=False))
def test_random_regexes_on_a_real_vocabulary(pattern, rng) -> None:
    try:
        compiled = constrain.compile_regex(f'"({pattern})*"' + r'(,"[^"\\]{0,4}")*', tekken())
    except constrain.GrammarError:
        return
    native, twin = twins(compiled)
    walk(native, twin, rng, steps=5)


@pytest.mark.parametrize("name", names())
def test_builtin_grammars(name: str) -> None:
    compiled = GrammarCompiler().compile_grammar(builtin_grammar(name), tekken())
    native, twin = twins(compiled)
    rng = random.Random(name)
    assert sum(walk(native, twin, rng, steps=25) for _ in range(2)) >= 10
    assert native._heads or native._head_states, "the split path was never taken"


def jsonschemabench_cases(every: int) -> list[dict]:
    out = []
    for subset in ("Github_easy", "Glaiveai2K", "Kubernetes"):
        with gzip.open(DATA / f"{subset}.jsonl.gz", "rt") as lines:
            out += [json.loads(line) for i, line in enumerate(lines) if i % every == 0]
    return out


def instances(case: dict) -> list[bytes]:
    tests = case["tests"] if isinstance(case["tests"], list) else ast.literal_eval(case["tests"])
    return [json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False).encode() for t in tests if t["valid"]][:2]


@pytest.mark.skipif(not DATA.exists(), reason="JSONSchemaBench data not present")
@pytest.mark.parametrize("name", ["tekken", "llama3"])
def test_real_schemas_fed_their_instances(name, vocab_by_name) -> None:
    """What a model does: real strings and numbers, nearly every state a first visit."""
    real_vocab = vocab_by_name(name)
    rng = random.Random(2)
    compared = compiled = 0
    for case in jsonschemabench_cases(every=350):
        schema = case["schema"] if isinstance(case["schema"], dict) else ast.literal_eval(case["schema"])
        try:
            grammar = GrammarCompiler().compile_json_schema(schema, real_vocab)
        except constrain.GrammarError:
            continue
        native, twin = twins(grammar)
        compiled += 1
        for data in instances(case):
            compared += feed(native, twin, data)
        compared += walk(native, twin, rng, steps=8)
    assert compiled >= 5 and compared >= 100


def test_union_masks_of_object_members() -> None:
    """Members in any order: a union of framed members, masked member by member on both sides."""
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in
                                               [("alpha", "integer"), ("alps", "string"), ("beta", "boolean"),
                                                ("gamma", "array")]},
              "required": ["beta"], "additionalProperties": {"type": "integer"}}
    native, twin = twins(GrammarCompiler().compile_json_schema(schema, tekken()))
    unions = 0
    for doc in (b'{"gamma":[],"alps":"x y","zz":1,"beta":true,"alpha":7}',
                b'{"beta":false,"alpha":1,"q":2,"alps":"","gamma":[1,"a"]}'):
        before = len(native._masks)
        assert feed(native, twin, doc) > 10
        unions += len(native._masks) > before
    assert unions


def test_union_masks_of_members_inside_a_frame() -> None:
    """An object's next key inside a frame (``FRAME(({k1 ...|k2 ...}) "}") tail``, a nested object
    with optional members in declared order and extra keys) is masked member by member too."""
    inner = {"type": "object", "properties": {k: {"type": t} for k, t in
                                              [("alpha", "integer"), ("alps", "string"), ("beta", "boolean"),
                                               ("gamma", "array"), ("alpine", "null")]},
             "additionalProperties": {"type": "integer"}}
    schema = {"type": "object", "properties": {"x": inner, "y": {"type": "array", "items": inner}}}
    native, twin = twins(GrammarCompiler().compile_json_schema(schema, tekken()))
    table, framed = native.table, 0
    for doc in (b'{"x":{"alps":"x y","gamma":[],"zz":1},"y":[{"alpha":1,"alpine":null,"q":2},{}]}',
                b'{"y":[{"beta":false,"alpine":null},{"alpha":7,"zq":3}],"x":{"al":1}}'):
        assert feed(native, twin, doc) > 10
    for state in list(native._masks):
        framed += table.is_framed(state) and table.alternatives(state) is not None
    assert framed, "no union inside a frame was masked member by member"


def test_frame_masks_of_members_under_branches() -> None:
    """An object's members in any order under each branch of an ``anyOf`` (the same key frames
    under every branch, each with its own remainder): masked from one head walk per frame, equal
    to a walk of the whole union and to the twin's, after any members."""
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in
                                               [("alpha", "integer"), ("alps", "string"), ("beta", "boolean"),
                                                ("gamma", "array"), ("delta", "null")]},
              "anyOf": [{"required": ["alpha"]}, {"required": ["beta"]}, {"required": ["gamma", "delta"]}],
              "additionalProperties": {"type": "integer"}}
    native, twin = twins(GrammarCompiler().compile_json_schema(schema, tekken()))
    framed = 0
    for state, members, full in unions_along(native, twin, (b'{"alps":"x y","zz":1,"beta":true,"delta":null,"alpha":7}',
                                                            b'{"gamma":[1,"a"],"q":2,"delta":null,"alps":""}')):
        got = native._frames_mask(state, members)
        if got is not None:
            framed += 1
            assert np.array_equal(got, full)
            assert np.array_equal(twin._frames_mask(state, members), full)
    assert framed >= 4, "the frames path was never taken"


def test_masks_from_many_threads_agree() -> None:
    """Split masks of a fresh grammar from four threads at once (rows filled while other walks run
    without the GIL) equal the twin's."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 20},
                                               "b": {"type": "array", "items": {"type": "number"}}}}
    native, twin = twins(GrammarCompiler().compile_json_schema(schema, tekken()))
    states = [native.initial_state]
    for byte in b'{"a":"x y z':
        states.append(int(native.table.row(states[-1])[byte]))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(native.mask, states * 3))
    for state, words in zip(states * 3, got):
        assert np.array_equal(words, twin.mask(state))


def test_key_masks_from_the_frames_alone() -> None:
    """An object's next key (a union of key frames, each before the object's remainder, that starts
    with few bytes): masked from one walk of the frames together, equal to a walk of the whole
    union and to the twin's, whichever keys are left."""
    keys = ["alpha", "alps", "beta", "gamma", "delta", "deltoid", "epsilon", "zeta", "a"]
    schema = {"type": "object", "properties": {k: {"type": ["integer", "string"]} for k in keys},
              "additionalProperties": False}
    native, twin = twins(GrammarCompiler().compile_json_schema(schema, tekken()))
    walked = 0
    for state, members, full in unions_along(native, twin, (b'{"gamma":1,"alps":"x","a":2,"deltoid":"","zeta":3,"alpha":"y"}',
                                                            b'{"a":"1","alpha":7,"delta":0,"beta":"b","epsilon":5}')):
        if native._narrow(state) and all(native.table.is_framed(m) for m in members):
            walked += 1
            for automaton in (native, twin):
                got = automaton._keys_words(members)
                assert np.array_equal(automaton._with_stops(got, automaton.is_accepting(state)), full)
    assert walked >= 10, "no key union was met"
