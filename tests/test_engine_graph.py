"""The graph decode path (``GraphScheduler`` over ``GraphRunner``/``StaticDecoder``) on the CPU.

CUDA graphs cannot be captured here, but every captured function runs eagerly on the CPU, so
these tests pin what the GPU replays: the static one-token step equals the eager ragged forward,
and whole generations (greedy and seeded, constrained through the GPU state table or host
matchers, unconstrained) equal the eager ``Scheduler``'s token for token.
"""

from __future__ import annotations

import pytest
import torch
from engine_support import PERSON_SCHEMA, engine

from constrain.engine.constraints import Constraint
from constrain.engine.generate import run_requests
from constrain.engine.graph_loop import GraphScheduler
from constrain.engine.graph_runner import GraphRunner
from constrain.engine.runner import ModelRunner
from constrain.engine.sampler import SamplingParams
from constrain.engine.scheduler import Scheduler
from constrain.engine.static_decoder import StaticDecoder
from constrain.engine.types import GenerationRequest

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_static_step_equals_eager_forward() -> None:
    model = engine().loaded.model
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16]]
    eager, static = ModelRunner(model, 4, 32), ModelRunner(model, 4, 32)
    logits = eager.extend(0, prompts, [0] * 3)
    static.extend(0, prompts, [0] * 3)
    step = StaticDecoder(model, static.cache)
    lens = [len(p) for p in prompts]
    tok = logits.argmax(-1)
    for _ in range(3):
        a = eager.extend(0, [[int(t)] for t in tok], lens)
        # one padding row past the live ones (position past the cache end: scratch column)
        b = step.step(torch.cat([tok, torch.zeros(1, dtype=torch.long)]), torch.tensor(lens + [32]), 16)[:3]
        assert torch.allclose(a, b, atol=1e-3, rtol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        tok = a.argmax(-1)
        lens = [n + 1 for n in lens]


def _requests(eng, temperature: float = 0.0) -> list[GenerationRequest]:
    person = eng.compile(Constraint("json_schema", PERSON_SCHEMA))
    digits = eng.compile(Constraint("regex", r"[0-9]{2,5}"))

    def req(text, grammar, max_tokens, seed):
        return GenerationRequest(eng.loaded.encode_prompt(text), grammar,
                                 SamplingParams(temperature, seed=seed), max_tokens,
                                 stop_token_ids=frozenset(eng.loaded.eos_token_ids),
                                 force_tokens=False, budget_close=False)

    return [
        req("Describe Bob, 42 years old, as JSON.", person, 20, 1),
        req("Pick a number.", digits, 6, 2),
        req("Say hi.", None, 5, 3),
        req("Describe Ann, 7, as JSON.", person, 9, 4),  # runs out of budget: "length"
    ]


def _eager(eng, reqs):
    return run_requests(Scheduler(ModelRunner(eng.loaded.model, 4, 128), eng.vocab, eng._encode), reqs)


def _graph(eng, reqs, mode, max_batch=4):
    run = GraphRunner(eng.loaded.model, max_batch, 128, mask_words=(eng.vocab.vocab_size + 31) // 32)
    sched = GraphScheduler(run, eng.vocab, mode=mode, max_prefill_tokens=64)
    return run_requests(sched, reqs), sched


@pytest.mark.parametrize("mode", ["table", "host"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graph_path_equals_eager_path(mode: str, temperature: float) -> None:
    eng = engine()
    reqs = _requests(eng, temperature)
    want = _eager(eng, reqs)
    # max_batch 2 and a small prefill budget: admission in two rounds, compaction, padding rows
    got, sched = _graph(eng, reqs, mode, max_batch=2)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        assert g.finish_reason == w.finish_reason
    assert [r.finish_reason for r in got][:2] == ["stop", "stop"]
    if mode == "table":
        assert sched.cache.misses > 0  # the host filled the table lazily


def test_wide_states_get_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """States wider than EXPAND_MAX_TOKENS get a default next state plus hashed exceptions; the
    tokens equal the eager path's and the table then serves their steps without misses."""
    import constrain.engine.state_cache as sc

    monkeypatch.setattr(sc, "EXPAND_MAX_TOKENS", 8)  # the test vocabulary is small
    monkeypatch.setattr(sc, "EXPAND_ON_MISS", 1)  # two short requests miss out of a state once
    eng = engine()
    reqs = _requests(eng)[:2]
    want = _eager(eng, reqs)
    got, sched = _graph(eng, reqs, "table", max_batch=2)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sched.cache.defaults > 0
    misses = sched.cache.misses
    again, _ = run_requests(sched, reqs), None
    assert [g.token_ids for g in again] == [w.token_ids for w in want]
    assert sched.cache.misses == misses  # second pass: every step served by the GPU table


def test_unconstrained_mode_none() -> None:
    eng = engine()
    reqs = [r for r in _requests(eng) if r.grammar is None]
    want = _eager(eng, reqs)
    got, _ = _graph(eng, reqs, "none")
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    with pytest.raises(ValueError):
        GraphScheduler(GraphRunner(eng.loaded.model, 1, 64, 8), eng.vocab, mode="none").add(_requests(eng)[0])
