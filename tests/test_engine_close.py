"""The budget-aware close served from the GPU state table (``StateCache.close``), on the CPU.

The graph path keeps one close mask per (state, budget level) as a table row that leaves by its
state's transitions; the eager path fills every close mask on the host. Both must emit the same
tokens: greedy and seeded top-k rows, forced text, budgets the close must meet and budgets too
short for any document, in one mixed batch with admission in rounds.
"""

from __future__ import annotations

import json
import random

import pytest
from test_speculative import INSTANCES, SCHEMAS, tiny_engine

from constrain.engine.api import Engine, Request

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _requests(n: int, seed: int = 0) -> list[Request]:
    r = random.Random(seed)
    out = [Request("Say hi.", max_tokens=7)]  # an unconstrained row among them
    for i in range(n):
        k = i % len(SCHEMAS)
        inst = json.dumps(INSTANCES[k](r), separators=(",", ":"))
        sampled = i % 3 == 2
        out.append(Request(f"Copy the record as JSON: {inst}", json_schema=SCHEMAS[k],
                           max_tokens=r.choice([3, 6, 9, 12, 16, 24]), temperature=0.8 if sampled else 0.0,
                           top_k=20 if sampled else 0, seed=i))
    return out


def test_close_from_the_table_equals_the_host_close() -> None:
    eager = tiny_engine()
    graph = Engine(eager.loaded, max_batch=8, backend="graph")
    reqs = _requests(30)
    want = eager.run(reqs)
    got = graph.run(reqs)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
        assert (g.finish_reason, g.forced_tokens) == (w.finish_reason, w.forced_tokens)
    cache = graph._step.cache  # type: ignore[union-attr]
    assert cache.close_rows > 0
    assert sum(g.forced_tokens for g in got) > 0
    assert {g.finish_reason for g in got[1:]} >= {"stop", "length"}
    rows, misses = cache.close_rows, cache.misses
    again = graph.run(reqs)  # every close mask is a row by now: none computed again
    assert [g.token_ids for g in again] == [w.token_ids for w in want]
    assert cache.close_rows == rows and cache.misses == misses
