"""Fixtures shared by the test suite. Plain helper modules are in ``tests/support/``."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import settings

from constrain import Vocabulary

# CI (``.ci/run``) draws the same examples on every run, so that what passed on a clean clone here
# passes there, and times none (a shared machine's pause is no failure); elsewhere each run draws
# new ones (``--hypothesis-seed`` replays one).
settings.register_profile("ci", derandomize=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


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
