"""Fixtures shared by the test suite. Plain helper modules are in ``tests/support/``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from constrain import Vocabulary


@pytest.fixture(scope="session")
def byte_vocab() -> Vocabulary:
    """256 single-byte tokens and a stop token (id 256): small enough to check every mask token."""
    return Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])


@pytest.fixture(scope="session")
def vocab_by_name() -> Callable[[str], Vocabulary]:
    """A real vocabulary from an installed package by its ``constrain.tokenizers`` name ("llama3", "tekken"...)."""
    from constrain import tokenizers

    def load(name: str) -> Vocabulary:
        return getattr(tokenizers, name)()

    return load
