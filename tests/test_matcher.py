"""Token masks and Matcher verbs on real vocabularies, checked token by token against the
derivative engine walked byte by byte (an independent path from the vectorised trie walk)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import constrain
from constrain.derivatives import NOTHING
from constrain.grammars import ir
from constrain.grammars.errors import GrammarError
from constrain.grammars.unicode import char_class
from constrain.tokenizers import gpt2, tekken

STRING_CHAR = ir.alt(
    char_class([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]),
    ir.seq(ir.literal("\\"), ir.byte_set(b'"\\/bfnrt')),
)
JSON_STRING = ir.seq(ir.literal('"'), ir.repeat(STRING_CHAR), ir.literal('"'))
DIGITS = ir.repeat(ir.byte_set(b"0123456789"), 1, 4)
RECORD = ir.Grammar({
    "start": ir.seq(ir.literal('{"name":'), JSON_STRING, ir.literal(',"tags":['), ir.ref("items"), ir.literal("]}")),
    "items": ir.optional(ir.seq(ir.ref("item"), ir.repeat(ir.seq(ir.literal(","), ir.ref("item"))))),
    "item": ir.alt(DIGITS, ir.seq(ir.literal("["), ir.ref("items"), ir.literal("]"))),
})


def oracle_allowed(compiled: constrain.CompiledGrammar, state: int) -> set[int]:
    table = compiled._automaton.table
    allowed = set()
    for tok, data in enumerate(compiled.vocab.token_bytes):
        if not data:
            continue
        s = state
        for b in data:
            s = table.derive(s, b)
            if s == NOTHING:
                break
        if s != NOTHING and table.is_live(s):
            allowed.add(tok)
    if compiled.is_accepting(state):
        allowed |= set(compiled.vocab.eos_token_ids)
    return allowed


@pytest.mark.parametrize("load", [gpt2, tekken], ids=["gpt2", "tekken"])
def test_masks_equal_bytewise_oracle_along_random_walks(load) -> None:
    vocab = load()
    compiled = constrain.compile_grammar(RECORD, vocab)
    rng = np.random.default_rng(1)
    matcher = compiled.matcher()
    checked = 0
    for step in range(40):
        ids = set(matcher.allowed_token_ids().tolist())
        if checked < 6 and step % 6 == 0:
            assert ids == oracle_allowed(compiled, matcher.state)
            checked += 1
        if matcher.is_terminated():
            break
        eos = set(vocab.eos_token_ids) & ids
        choice = int(rng.choice(sorted(eos))) if eos and step > 25 else int(rng.choice(sorted(ids)))
        assert matcher.accept_token(choice)
    assert checked >= 3


def test_mask_and_accept_agree_and_forbidden_tokens_rejected() -> None:
    vocab = gpt2()
    compiled = constrain.compile_grammar(RECORD, vocab)
    m = compiled.matcher()
    allowed = set(m.allowed_token_ids().tolist())
    for tok in range(0, vocab.vocab_size, 97):
        fork = m.fork()
        assert fork.accept_token(tok) == (tok in allowed)


def text_tokens(vocab: constrain.Vocabulary, text: bytes) -> list[int]:
    """Greedy longest-match tokenization (any split is valid input for a byte-level matcher)."""
    by_bytes = {t: i for i, t in enumerate(vocab.token_bytes) if t}
    out, i = [], 0
    while i < len(text):
        for j in range(min(len(text), i + 32), i, -1):
            if text[i:j] in by_bytes:
                out.append(by_bytes[text[i:j]])
                i = j
                break
        else:
            raise AssertionError(f"untokenizable at {i}")
    return out


def test_document_accepted_token_by_token_then_stop() -> None:
    vocab = tekken()
    compiled = constrain.compile_grammar(RECORD, vocab)
    doc = '{"name":"Zoë \\"Z\\" 🙂","tags":[1,[22,[]],333]}'.encode()
    m = compiled.matcher()
    for tok in text_tokens(vocab, doc):
        assert not m.is_accepting()
        assert m.accept_token(tok)
    assert m.is_accepting() and not m.is_terminated()
    eos = vocab.eos_token_ids[0]
    assert m.accept_token(eos) and m.is_terminated()
    assert not m.accept_token(eos)
    assert m.allowed_token_ids().tolist() == sorted(vocab.eos_token_ids)


def test_accept_tokens_is_accept_token_in_a_loop(byte_vocab) -> None:
    """``accept_tokens`` accepts up to the first refusal and says how many: the same states,
    the same history for ``rollback``, a stop token ending the document, a bad id an error."""
    compiled = constrain.compile_regex("ab[cd]+", byte_vocab)
    m, one = compiled.matcher(), compiled.matcher()
    run = list(b"abcdxc")
    assert m.accept_tokens(run) == 4  # "x" is refused: nothing after it is taken
    assert [one.accept_token(t) for t in run[:5]] == [True] * 4 + [False]
    assert m.state == one.state
    m.rollback(2)  # back to "ab"
    assert m.allowed_token_ids().tolist() == list(b"cd")
    assert m.accept_tokens([]) == 0 and m.accept_tokens([ord("d"), 256, ord("c")]) == 2 and m.is_terminated()
    fresh = compiled.matcher()
    with pytest.raises(ValueError, match=r"accept_tokens\(token_ids\)=257 is outside \[0, 257\)"):
        fresh.accept_tokens([ord("a"), 257])
    assert fresh.state == compiled.initial_state  # checked before any token is taken


def test_rollback_fork_reset() -> None:
    vocab = gpt2()
    compiled = constrain.compile_grammar(RECORD, vocab)
    m = compiled.matcher()
    toks = text_tokens(vocab, b'{"name":"ab","tags":[1')
    start_mask = m.allowed_token_ids().tolist()
    masks = []
    for t in toks:
        masks.append(m.allowed_token_ids().tolist())
        assert m.accept_token(t)
    f = m.fork()
    m.rollback(len(toks))
    assert m.allowed_token_ids().tolist() == start_mask
    assert f.accept_token(text_tokens(vocab, b"]")[0])  # the fork kept its own state
    for t, mask in zip(toks, masks):
        assert m.allowed_token_ids().tolist() == mask
        m.accept_token(t)
    m.reset()
    assert m.allowed_token_ids().tolist() == start_mask
    with pytest.raises(ValueError):
        m.rollback(1)


def test_forced_bytes_are_the_literal_prefix() -> None:
    compiled = constrain.compile_grammar(RECORD, gpt2())
    m = compiled.matcher()
    assert m.find_jump_forward_bytes() == b'{"name":"'


def test_padding_ids_and_specials_never_allowed_duplicates_all_allowed() -> None:
    vocab = constrain.Vocabulary.from_token_bytes(
        [b"a", b"a", b"b", None, b"ab"], eos_token_ids=[3], vocab_size=40
    )
    compiled = constrain.compile_grammar(ir.Grammar.of(ir.repeat(ir.literal("a"), 1, None)), vocab)
    bits = constrain.allocate_token_bitmask(2, 64)  # wider than the vocabulary: extra words cleared
    compiled.matcher().fill_next_token_bitmask(bits, 1)
    assert bits[0].tolist() == [-1, -1]
    assert bits[1].tolist() == [0b11, 0]


def test_vocabulary_without_stop_token_is_refused() -> None:
    vocab = constrain.Vocabulary.from_token_bytes([b"a", b"b"], eos_token_ids=[])
    with pytest.raises(GrammarError, match="EOS"):
        constrain.compile_grammar(ir.Grammar.of(ir.literal("a")), vocab)


def test_unsatisfiable_constraint_is_refused() -> None:
    never = ir.intersect(ir.literal("a"), ir.literal("b"))
    with pytest.raises(constrain.UnsatisfiableError, match="unsatisfiable"):
        constrain.compile_grammar(ir.Grammar.of(never), gpt2())
    # every item whose "c" matches "a+" has a "c" matching "a*": no item can violate the second
    item = lambda p: {"type": "object", "required": ["c"], "properties": {"c": {"type": "string", "pattern": p}}}
    narrower = {"allOf": [{"type": "array", "items": item("^a+$")}, {"not": {"type": "array", "items": item("^a*$")}}]}
    with pytest.raises(constrain.UnsatisfiableError, match="unsatisfiable"):
        constrain.compile_json_schema(narrower, gpt2())
    empty_rec = ir.Grammar({"start": ir.seq(ir.literal("x"), ir.ref("start"))})
    with pytest.raises(GrammarError, match="unsatisfiable"):
        constrain.compile_grammar(empty_rec, gpt2())


def test_bitmask_layout() -> None:
    bits = constrain.allocate_token_bitmask(3, 100)
    assert bits.shape == (3, 4) and bits.dtype == torch.int32 and bool((bits == -1).all())


def test_shared_head_masks_equal_full_walks_at_every_depth() -> None:
    """Masks built from a cached head walk plus crossing tokens equal a full trie walk."""
    vocab = tekken()
    compiled = constrain.compile_grammar(RECORD, vocab)
    automaton = compiled._automaton
    m = compiled.matcher()
    steps = 0
    for tok in text_tokens(vocab, b'{"name":"a\\"b","tags":[[1,[2,[[[3]]]]],[[[[4,5'):
        tokens, _ = automaton.transitions(m.state)
        full = automaton._pack(tokens, automaton.is_accepting(m.state))
        assert np.array_equal(automaton.mask(m.state), full)
        assert m.accept_token(tok)
        steps += 1
    assert steps > 10 and automaton._heads, "the shared-head path was never taken"


def test_budget_aware_close_always_ends_valid() -> None:
    """With a token budget, random walks finish with a complete document within the budget."""
    vocab = gpt2()
    compiled = constrain.compile_grammar(RECORD, vocab)
    rng = np.random.default_rng(7)
    bits = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    eos = vocab.eos_token_ids[0]
    for budget in (30, 45, 60):
        m = compiled.matcher()
        used = 0
        while not m.is_terminated():
            assert used < budget, "budget exceeded"
            m.fill_next_token_bitmask(bits, 0, tokens_left=budget - used)
            flags = np.unpackbits(bits.numpy().view(np.uint8), bitorder="little")
            ids = np.nonzero(flags)[0]
            assert len(ids), "budget close left no token"
            non_eos = ids[ids != eos]
            tok = int(rng.choice(non_eos)) if len(non_eos) else eos
            assert m.accept_token(tok)
            used += 1
        assert used <= budget


def test_budget_masks_equal_the_per_token_rule() -> None:
    """At states along random walks and every budget around their levels, the close's mask (all
    levels from one walk) equals its rule token by token: a token is allowed iff the state it
    leads to has a shortest completion within the budget; its levels are those completions."""
    vocab = gpt2()
    compiled = constrain.compile_grammar(RECORD, vocab)
    table = compiled._automaton.table
    rng = np.random.default_rng(11)
    bits = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    for _ in range(6):
        m = compiled.matcher()
        for _ in range(12):
            allowed = sorted(t for t in oracle_allowed(compiled, m.state) if t not in vocab.eos_token_ids)
            completion = {t: table.min_completion(compiled.next_state(m.state, t)) for t in allowed}
            assert m.next_completions() == sorted(set(completion.values()))
            for left in {2, *(int(c) + d for c in completion.values() for d in (1, 2, 3))}:
                if not m.budget_binds(left):
                    continue
                m.fill_next_token_bitmask(bits, 0, tokens_left=left)
                got = set(np.nonzero(np.unpackbits(bits.numpy().view(np.uint8), bitorder="little"))[0].tolist())
                fits = {t for t, c in completion.items() if c <= left - 2}
                want = fits | (set(vocab.eos_token_ids) if m.is_accepting() else set())
                assert got == want
            if not allowed:
                break
            assert m.accept_token(int(rng.choice(allowed)))


def test_min_completion_bytes() -> None:
    compiled = constrain.compile_grammar(RECORD, gpt2())
    m = compiled.matcher()
    assert m.min_completion_bytes() == len(b'{"name":"","tags":[]}')
    m.accept_bytes(b'{"name":"x","tags":[[[')
    assert m.min_completion_bytes() == len(b"]]]}")


def test_budget_close_sees_tokens_that_open_long_completions() -> None:
    """A token such as '],[' can raise the shortest completion a lot in one step."""
    vocab = constrain.Vocabulary.from_token_bytes([b"[", b"]", b"1", b",", b"],[[[[[", None], eos_token_ids=[5])
    nested = ir.Grammar({**RECORD.rules, "start": ir.seq(ir.literal("["), ir.ref("items"), ir.literal("]"))})
    compiled = constrain.compile_grammar(nested, vocab)
    m = compiled.matcher()
    for tok in (0, 0, 2):  # "[[1"
        assert m.accept_token(tok)
    bits = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bits, 0, tokens_left=6)
    allowed = np.nonzero(np.unpackbits(bits.numpy().view(np.uint8), bitorder="little"))[0].tolist()
    assert 4 not in allowed  # "],[[[[[" needs 6 more closing bytes plus the stop token
    assert 1 in allowed


def test_counted_repetitions_share_masks_and_stay_exact() -> None:
    """Clamping repetition counts to the longest token changes no mask (checked by full walks)."""
    vocab = gpt2()
    bounded = ir.Grammar.of(ir.seq(ir.literal('"'), ir.repeat(STRING_CHAR, 2, 300), ir.literal('"')))
    compiled = constrain.compile_grammar(bounded, vocab)
    automaton = compiled._automaton
    m = compiled.matcher()
    rng = np.random.default_rng(3)
    for _ in range(60):
        tokens, _ = automaton.transitions(m.state)
        full = automaton._pack(tokens, automaton.is_accepting(m.state))
        assert np.array_equal(automaton.mask(m.state), full)
        ids = m.allowed_token_ids()
        content = ids[ids != vocab.eos_token_ids[0]]
        if len(content) == 0:
            m.reset()
            continue
        quote = vocab.token_bytes.index(b'"')
        choice = quote if m.is_accepting() and rng.random() < 0.1 else int(rng.choice(content))
        assert m.accept_token(choice)
    assert len({id(v) for v in automaton._masks.values()}) < len(automaton._masks)


def test_rule_free_heads_are_shared_across_grammars() -> None:
    """The string body walked for one schema serves every other schema of the vocabulary."""
    vocab = gpt2()
    compiler = constrain.GrammarCompiler()
    first = compiler.compile_grammar(ir.Grammar.of(ir.seq(ir.literal('{"a":'), JSON_STRING, ir.literal("}"))), vocab)
    m = first.matcher()
    m.accept_bytes(b'{"a":"')
    m.allowed_token_ids()
    shared = compiler.cache_entries
    second = compiler.compile_grammar(
        ir.Grammar.of(ir.seq(ir.literal('["x",'), JSON_STRING, ir.literal(',1]'))), vocab
    )
    m2 = second.matcher()
    m2.accept_bytes(b'["x","ab')
    tokens, _ = second._automaton.transitions(m2.state)
    full = second._automaton._pack(tokens, False)
    assert np.array_equal(second.state_mask(m2.state), full)
    assert compiler.cache_entries == shared  # reused, not recomputed


def test_union_masks_of_unordered_members_equal_full_walks() -> None:
    """Object members in any order: masks assembled member by member equal a full trie walk,
    whatever members came before, and the budget close still sees exact shortest completions."""
    vocab = gpt2()
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in
                                               [("alpha", "integer"), ("alps", "string"), ("beta", "boolean"),
                                                ("gamma", "array")]},
              "required": ["beta"], "additionalProperties": {"type": "integer"}}
    compiled = constrain.compile_json_schema(schema, vocab)
    automaton = compiled._automaton
    unions = 0
    for doc in (b'{"gamma":[],"alps":"x","zz":1,"beta":true,"alpha":7}',
                b'{"beta":false,"alpha":1,"q":2,"alps":"","gamma":[1]}'):
        m = compiled.matcher()
        for tok in text_tokens(vocab, doc):
            tokens, _ = automaton.transitions(m.state)
            full = automaton._pack(tokens, automaton.is_accepting(m.state))
            union = automaton._union_mask(m.state)  # None where the state is no union or its keys are few
            if union is not None:
                unions += 1
                assert np.array_equal(union, full)
            assert np.array_equal(automaton.mask(m.state), full)
            assert m.accept_token(tok)
        assert compiled.is_accepting(m.state)
    assert unions > 4, "the union path was never taken"
    m = compiled.matcher()
    assert m.accept_bytes(b'{"gamma":[],"')
    assert m.min_completion_bytes() == len(b'beta":true}')
