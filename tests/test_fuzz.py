"""Our own fuzzer, bounded for CI: random regexes, Lark grammars and mutated corpus schemas, each
compiled under a compile budget and walked along its masks (``constrain.testing.fuzz`` holds the
generators and the checks; ``bench/fuzz.py`` runs the same for hours). Hypothesis draws case seeds,
derandomized and without an example database, so a run is reproducible; a failure prints the
constraint, the property it broke and the walk's tokens, and ``python3 bench/fuzz.py --kinds KIND
--vocabs byte --seed SEED --cases 1`` replays it (a case is ``fuzz.generate(kind, random.Random(seed))``)."""

from __future__ import annotations

import json
import random
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.testing import fuzz
from constrain.testing.corpus import DEFAULT_DATA


def bounded(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


schema_pool = cache(fuzz.schema_pool)  # the dev half, as bench/fuzz.py reads it: seeds replay there


SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


def holds(kind: str, seed: int, vocab) -> None:
    rng = random.Random(seed)
    case = fuzz.generate(kind, rng, schema_pool() if kind == "schema" else [])
    failures = fuzz.check_case(case, vocab, rng)
    assert not failures, "\n".join(json.dumps(f.to_json()) for f in failures)


@bounded(300)
@given(SEEDS)
def test_regexes_agree_with_re(byte_vocab, seed):
    holds("regex", seed, byte_vocab)


@bounded(40)
@given(SEEDS)
def test_lark_grammars_agree_with_lark(byte_vocab, seed):
    holds("lark", seed, byte_vocab)


needs_data = pytest.mark.skipif(not (DEFAULT_DATA / "jsonschemabench").is_dir(), reason="needs ../shared/data")


@needs_data
@bounded(60)
@given(SEEDS)
def test_mutated_schemas_walk_to_valid_documents(byte_vocab, seed):
    holds("schema", seed, byte_vocab)


@needs_data
@bounded(6)
@given(SEEDS)
def test_mutated_schemas_on_a_real_vocabulary(vocab_by_name, seed):
    holds("schema", seed, vocab_by_name("tekken"))
