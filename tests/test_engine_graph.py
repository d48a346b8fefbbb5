"""The graph step backend (``GraphStep`` over ``GraphRunner``/``StaticDecoder``) on the CPU.

CUDA graphs cannot be captured here, but every captured function runs eagerly on the CPU, so
these tests pin what the GPU replays: the static one-token step equals the eager ragged forward,
and whole generations through the one ``Scheduler`` (greedy and seeded with top-k, forced text
appended several tokens per forward, the budget-aware close, constrained rows through the GPU
state table or host masks, unconstrained rows) equal the eager backend's token for token.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.engine import PERSON_SCHEMA, checker, engine

from constrain import Matcher
from constrain.engine.constraints import Constraint
from constrain.engine.generate import run_requests
from constrain.engine.graph_loop import GraphStep
from constrain.engine.graph_runner import WIDTH_BUCKETS, GraphRunner
from constrain.engine.runner import EagerStep, ModelRunner
from constrain.engine.sampler import SamplingParams
from constrain.engine.scheduler import Scheduler
from constrain.engine.static_decoder import StaticDecoder
from constrain.engine.types import GenerationRequest, GenerationResult

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

ORDER_SCHEMA = {  # no additionalProperties: the generation defaults force each key in order
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 10}, "year": {"type": "integer"},
                   "international_standard_book_number": {"type": "string", "pattern": "^[0-9]{3}$"}},
    "required": ["title", "year", "international_standard_book_number"],
}


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
    """A mixed batch: forced keys (declared order), a budget the close must meet (its masks
    come from close rows of the table), top-k rows on the state table, an unconstrained row and
    one that runs out of budget."""
    def grammar(kind, source):
        return eng.compile(Constraint.from_args(**{kind: source}))

    person = grammar("json_schema", PERSON_SCHEMA)

    def req(text, cg, max_tokens, seed, **kw):
        return GenerationRequest(eng.loaded.encode_prompt(text), cg,
                                 SamplingParams(temperature, top_k=kw.pop("top_k", 0), seed=seed), max_tokens,
                                 stop_token_ids=frozenset(eng.loaded.eos_token_ids), **kw)

    return [
        req("Describe the book Dune (1965) as JSON.", grammar("json_schema", ORDER_SCHEMA), 80, 1),
        req("Pick a number.", grammar("regex", r"[0-9]{2,5}"), 6, 2, top_k=5, budget_close=False),
        req("Say hi.", None, 5, 3),
        req("Describe Ann, 7, as JSON.", person, 12, 4),  # the budget-aware close finishes it
        req("Describe Bob, 42, as JSON.", person, 5, 5),  # too short for any document: "length"
        req("Write a word.", grammar("regex", r"[a-z]{2,8}"), 8, 6, top_k=20, budget_close=False),
    ]


def _eager(eng, reqs, max_batch=4):
    backend = EagerStep(ModelRunner(eng.loaded.model, max_batch, 128), eng.vocab.vocab_size)
    return run_requests(Scheduler(backend, eng.vocab, eng._encode), reqs)


def _graph(eng, reqs, table=True, max_batch=4):
    backend = GraphStep(GraphRunner(eng.loaded.model, max_batch, 128), eng.vocab.vocab_size, table=table)
    return run_requests(Scheduler(backend, eng.vocab, eng._encode, max_prefill_tokens=64), reqs), backend


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_graph_path_equals_eager_path(table: bool, temperature: float) -> None:
    eng = engine()
    reqs = _requests(eng, temperature)
    want = _eager(eng, reqs)
    # max_batch 2 and a small prefill budget: admission in rounds, compaction, padding rows
    got, backend = _graph(eng, reqs, table, max_batch=2)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        assert g.finish_reason == w.finish_reason
        assert g.forced_tokens == w.forced_tokens
    assert got[0].forced_tokens > 0 and got[3].forced_tokens > 0  # several tokens per forward
    assert [r.finish_reason for r in got][3:5] == ["stop", "length"]
    assert checker("json_schema", PERSON_SCHEMA)(got[3].text)
    assert backend.ahead_served > 0  # next steps' forwards queued ahead of the host's work
    assert backend.ahead_forced > 0  # forced text's several-token passes too
    if table:
        assert backend.cache.misses > 0  # the host filled the table lazily
        assert backend.cache.close_rows > 0  # the close's masks came from the table too


@pytest.mark.parametrize("wide", ["dear", "width 2"])
def test_forced_text_a_token_a_step_equals_appending_it(wide: str) -> None:
    """Where the backend's step times make a wide pass dear (``Scheduler._force_cap``), forced
    text is taken a token a step under one-token masks (chain rows of the table, or host masks),
    all of it or past the first token: greedy tokens equal the eager path's, which appends it."""
    eng = engine()
    reqs = [r for r in _requests(eng) if r.sampling.top_k == 0]
    want = _eager(eng, reqs)
    for table in (True, False):
        backend = GraphStep(GraphRunner(eng.loaded.model, 2, 128), eng.vocab.vocab_size, table=table)
        run = backend.runner
        for rows in (1, 2):  # the step-time table a GPU measures when it captures its forwards
            for length in {run.length_bucket(n) for n in range(1, run.max_len + 1)}:
                run.step_ms[(rows, 1, length)] = 1.0
                for w in WIDTH_BUCKETS:
                    run.step_ms[(rows, w, length)] = 1.0 if wide == "width 2" and w == 2 else 50.0
        got = run_requests(Scheduler(backend, eng.vocab, eng._encode, max_prefill_tokens=64), reqs)
        for w, g in zip(want, got):
            assert (g.token_ids, g.finish_reason, g.forced_tokens) == (w.token_ids, w.finish_reason, w.forced_tokens)
        assert got[0].forced_tokens > 0
        assert backend.cache.chain_rows > 0 if table else backend.cache.chain_rows == 0


def test_forward_queued_ahead_on_a_wrong_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forced-text pass queued ahead on a prediction the step then contradicts (here every
    one: rows predicted to force text append none) is redone by the step: the tokens equal the
    eager path's under the same rule."""
    eng = engine()
    reqs = [r for r in _requests(eng) if r.sampling.top_k == 0]
    monkeypatch.setattr(Scheduler, "_force", lambda self, s, gid=-1: None)  # predicted, never appended
    want = _eager(eng, reqs)
    got, backend = _graph(eng, reqs, max_batch=2)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert backend.ahead_forced > 0 and backend.ahead_served < backend.ahead_queued


def test_wide_states_get_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """States wider than EXPAND_MAX_TOKENS get a default next state plus hashed exceptions; the
    tokens equal the eager path's and the table then serves their steps without misses."""
    import constrain.engine.state_cache as sc

    monkeypatch.setattr(sc, "EXPAND_MAX_TOKENS", 8)  # the test vocabulary is small
    monkeypatch.setattr(sc, "EXPAND_ON_MISS", 1)  # two short requests miss out of a state once
    eng = engine()
    reqs = [r for r in _requests(eng) if r.grammar is not None and r.sampling.top_k == 0][:1]
    for r in reqs:
        r.budget_close = False
    want = _eager(eng, reqs)
    backend = GraphStep(GraphRunner(eng.loaded.model, 2, 128), eng.vocab.vocab_size)
    sched = Scheduler(backend, eng.vocab, eng._encode)
    got = run_requests(sched, reqs)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert backend.cache.defaults > 0
    misses = backend.cache.misses
    again = run_requests(sched, reqs)
    assert [g.token_ids for g in again] == [w.token_ids for w in want]
    assert backend.cache.misses == misses  # second pass: every step served by the GPU table


class _Refusing:
    """A broken matcher: its mask allows a token that its ``accept_token`` then refuses."""

    def __init__(self, inner, refuse_after: int) -> None:
        self.inner, self.left = inner, refuse_after

    def accept_token(self, token: int) -> bool:
        self.left -= 1
        return self.left >= 0 and self.inner.accept_token(token)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class _Empty(_Refusing):
    """A broken matcher whose mask allows nothing."""

    def fill_next_token_bitmask(self, bitmask, row=0, **_):
        bitmask[row].zero_()


class _RaisingFill(_Refusing):
    """A broken matcher whose mask fill raises after a few tokens."""

    def fill_next_token_bitmask(self, bitmask, row=0, **kw):
        if self.left < 0:
            raise RuntimeError("broken fill")
        self.inner.fill_next_token_bitmask(bitmask, row, **kw)

    def accept_token(self, token: int) -> bool:
        self.left -= 1
        return self.inner.accept_token(token)


class _RaisingBudget(_Refusing):
    """A broken matcher whose answers to the budget-aware close raise (asked before any mask)."""

    def min_completion_bytes(self) -> float:
        raise RuntimeError("broken budget")


@pytest.mark.parametrize("path", ["eager", "table", "host"])
def test_a_broken_matcher_fails_only_its_own_request(path: str) -> None:
    eng = engine()
    healthy = _requests(eng)
    digits = healthy[1].grammar
    refusing = GenerationRequest(healthy[1].prompt_ids, digits, max_tokens=6, matcher=_Refusing(digits.matcher(), 1))
    empty = GenerationRequest(healthy[1].prompt_ids, None, max_tokens=6, matcher=_Empty(digits.matcher(), 9))
    raising = GenerationRequest(healthy[1].prompt_ids, None, max_tokens=6, matcher=_RaisingFill(digits.matcher(), 1))
    # with its grammar: on the table path the close is decided outside any mask fill
    three = eng.compile(Constraint.from_args(regex=r"[0-9]{3}"))
    budget = GenerationRequest(healthy[1].prompt_ids, three, max_tokens=6, matcher=_RaisingBudget(three.matcher(), 9))
    reqs = [healthy[0], refusing, healthy[2], empty, raising, budget, healthy[3]]
    got = _eager(eng, reqs) if path == "eager" else _graph(eng, reqs, table=path == "table")[0]
    alone = _eager(eng, [healthy[0], healthy[2], healthy[3]])
    assert [r.finish_reason for r in got] == [alone[0].finish_reason, "error", alone[1].finish_reason, "error",
                                              "error", "error", alone[2].finish_reason]
    assert "refused token" in got[1].error and "empty mask" in got[3].error and "broken fill" in got[4].error
    assert "broken budget" in got[5].error and not got[5].token_ids
    assert len(got[1].token_ids) == 1 and not got[1].valid
    assert len(got[4].token_ids) == 2  # two tokens accepted, then the third mask raised
    assert [r.token_ids for r in (got[0], got[2], got[6])] == [r.token_ids for r in alone]


class _RefusingAfter(Matcher):
    """A constrain ``Matcher`` (the scheduler lets it lag behind the state table) that refuses
    every token after its first ``left``: on the table path the refusal surfaces when it catches up."""

    def __init__(self, grammar, left: int) -> None:
        super().__init__(grammar.matcher()._automaton)
        self.left = left
        self.refused_in = 0  # the length of the run it refused a token of

    def _accept(self, token_ids):
        n = super()._accept(list(token_ids)[: max(self.left, 0)])
        self.left -= n
        if n < len(token_ids) and not self.refused_in:
            self.refused_in = len(token_ids)
        return n


def test_lagging_matchers_end_exact_and_refusals_fail_alone() -> None:
    """Table-served rows take their tokens without their matchers, which catch up when used:
    each request's own matcher still ends where its tokens put it, and one that refuses a token
    while catching up fails its request alone with the output and error the eager path gives
    (which refuses it when sampled)."""
    eng = engine()
    healthy = _requests(eng)
    order, person = healthy[0].grammar, healthy[3].grammar
    own = person.matcher()
    reqs = [GenerationRequest(healthy[0].prompt_ids, order, max_tokens=80, matcher=_RefusingAfter(order, 25)),
            healthy[2], GenerationRequest(healthy[3].prompt_ids, person, max_tokens=12, matcher=own), healthy[1]]
    plain = [dataclasses.replace(r, matcher=None) for r in reqs]
    want = _eager(eng, [reqs[0], *plain[1:]])
    reqs[0].matcher = refusing = _RefusingAfter(order, 25)
    backend = GraphStep(GraphRunner(eng.loaded.model, 2, 128), eng.vocab.vocab_size)
    sched = Scheduler(backend, eng.vocab, eng._encode, max_prefill_tokens=64)
    run_requests(sched, plain)  # the table learns every state and transition: rows lag from now on
    misses = backend.cache.misses
    got = run_requests(sched, reqs)
    assert backend.cache.misses == misses
    def outcome(r):  # (request ids differ: the warm-up run took the first ones)
        return r.token_ids, r.finish_reason, r.error and r.error.split(":", 1)[1]

    assert [outcome(g) for g in got] == [outcome(w) for w in want]
    assert got[0].finish_reason == "error" and "refused token" in got[0].error and len(got[0].token_ids) == 25
    assert refusing.refused_in > 1  # refused while catching up, several tokens after it was sampled
    replay = person.matcher()
    assert replay.accept_tokens(got[2].token_ids) == len(got[2].token_ids) and got[2].finish_reason == "stop"
    assert replay.accept_token(eng.vocab.eos_token_ids[0]) and own.state == replay.state


def test_bad_requests_fail_alone() -> None:
    eng = engine()
    ok = _requests(eng)[2]
    backend = EagerStep(ModelRunner(eng.loaded.model, 2, 64), eng.vocab.vocab_size)
    sched = Scheduler(backend, eng.vocab, eng._encode, context_len=48)
    long = GenerationRequest(list(range(1, 60)), None, max_tokens=4)
    empty = GenerationRequest([], None, max_tokens=4)
    got: list[GenerationResult] = run_requests(sched, [long, ok, empty])
    assert got[0].finish_reason == "error" and "59 tokens" in got[0].error and "context of 48" in got[0].error
    assert got[2].finish_reason == "error" and "at least one token" in got[2].error
    assert got[1].finish_reason in ("stop", "length") and got[1].token_ids
