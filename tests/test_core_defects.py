"""The automaton core's correctness defects found by fuzzing (issue 11), each as the case that
exposed it: masks must agree with ``accept_token``, dead ends must never be offered, the
budget-aware close must always be able to finish, and resource use is bounded with clear errors."""

from __future__ import annotations

import pytest

import constrain
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
