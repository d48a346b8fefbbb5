"""BatchMatcher: one call fills many matchers' rows, over threads, exactly as filling each row alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import constrain
from constrain.testing.corpus import DEFAULT_DATA, expand_subsets, load_cases
from constrain.tokenizers import tekken


def matchers_at_many_states(vocab: constrain.Vocabulary) -> list[constrain.Matcher]:
    """Matchers of 12 real schemas, each at several points of a valid instance (new states,
    known states, a finished document)."""
    out = []
    cases = load_cases(DEFAULT_DATA, expand_subsets("jsb", DEFAULT_DATA), "dev")[::200]
    compiler = constrain.GrammarCompiler()
    for case in cases:
        valid = [t for t in case.tests if t["valid"]]
        try:
            grammar = compiler.compile_json_schema(case.schema, vocab)
        except constrain.GrammarError:
            continue
        if not valid:
            continue
        data = json.dumps(valid[0]["data"], separators=(",", ":"), ensure_ascii=False).encode()
        for cut in (0, len(data) // 3, len(data) // 2, len(data)):
            m = grammar.matcher()
            if m.accept_bytes(data[:cut]):
                out.append(m)
    return out


@pytest.mark.parametrize("as_numpy", [False, True])
def test_batch_fill_equals_one_fill_per_row(as_numpy: bool) -> None:
    vocab = tekken()
    matchers = matchers_at_many_states(vocab)
    assert len(matchers) > 20
    n = len(matchers)
    rows = list(reversed(range(2, n + 2)))  # rows out of order, two spare rows left as they were
    budgets = [None if i % 3 else 3 + i % 7 for i in range(n)]
    alone = constrain.allocate_token_bitmask(n + 2, vocab.vocab_size)
    for m, row, budget in zip(matchers, rows, budgets):
        m.fill_next_token_bitmask(alone, row, tokens_left=budget)
    for threads in (1, 4):
        fresh = matchers_at_many_states(vocab)  # new grammars: every first visit happens in the batch
        got = constrain.allocate_token_bitmask(n + 2, vocab.vocab_size)
        target = got.numpy() if as_numpy else got
        with constrain.BatchMatcher(max_threads=threads) as batch:
            batch.batch_fill_next_token_bitmask(fresh, target, rows, tokens_left=budgets)
            assert torch.equal(got, alone)
            got.fill_(0)
            batch.batch_fill_next_token_bitmask(fresh, target, rows, tokens_left=budgets)  # now all cached
            assert torch.equal(got[2:], alone[2:])
        ahead = matchers_at_many_states(vocab)
        assert not all(m.mask_is_cached() for m in ahead)
        with constrain.BatchMatcher(max_threads=threads) as batch:
            batch.prepare(ahead)  # what an engine filling rows its own way calls first
        assert all(m.mask_is_cached() for m in ahead)


def test_a_failing_row_is_named_and_the_others_are_filled() -> None:
    vocab = tekken()
    grammar = constrain.compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}, vocab)

    class Broken(constrain.Matcher):
        def fill_next_token_bitmask(self, bitmask, index=0, *, tokens_left=None):
            raise RuntimeError("broken matcher")

    good, bad = grammar.matcher(), Broken(grammar._automaton)
    bitmask = constrain.allocate_token_bitmask(3, vocab.vocab_size)
    bitmask.zero_()
    with pytest.raises(RuntimeError, match="broken matcher") as got:
        constrain.BatchMatcher(2).batch_fill_next_token_bitmask([good, bad, good.fork()], bitmask)
    assert any("bitmask row 1" in note for note in got.value.__notes__)
    expected = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    good.fill_next_token_bitmask(expected)
    assert torch.equal(bitmask[0], expected[0]) and torch.equal(bitmask[2], expected[0])
    assert not bitmask[1].any()


def test_bad_arguments_are_named() -> None:
    vocab = tekken()
    m = constrain.compile_regex("a+", vocab).matcher()
    bitmask = constrain.allocate_token_bitmask(2, vocab.vocab_size)
    batch = constrain.BatchMatcher(1)
    with pytest.raises(ValueError, match="indices"):
        batch.batch_fill_next_token_bitmask([m], bitmask, [0, 1])
    with pytest.raises(ValueError, match="tokens_left"):
        batch.batch_fill_next_token_bitmask([m], bitmask, tokens_left=[])
    with pytest.raises(TypeError, match=r"matchers\[1\]"):
        batch.batch_fill_next_token_bitmask([m, "m"], bitmask)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_threads"):
        constrain.BatchMatcher(0)
    np.testing.assert_equal(constrain.BatchMatcher("auto").max_threads >= 1, True)
