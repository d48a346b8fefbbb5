"""Constraint-aware speculation (``engine.speculative`` on the one ``Scheduler``), on the CPU.

Oracles: greedy speculation must emit exactly the tokens of plain greedy decoding (for any
model, so a tiny random Llama over SmolLM2's real vocabulary serves for 200 schema prompts, and
the real demo model for a few where prompt lookup is accepted); sampled speculation must follow
plain masked sampling (chi-square against the exact distribution, enumerated from the model);
after every step each row's matcher must be in the state a fresh matcher replayed over its
tokens reaches, whatever drafts were proposed and rejected (hypothesis).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engine import PERSON_SCHEMA, checker, engine
from transformers import LlamaConfig, LlamaForCausalLM

from constrain import Vocabulary
from constrain.engine.api import Engine, Request
from constrain.engine.constraints import Constraint
from constrain.engine.generate import run_requests
from constrain.engine.graph_loop import GraphStep
from constrain.engine.graph_runner import GraphRunner
from constrain.engine.model import LoadedModel
from constrain.engine.runner import EagerStep, ModelRunner
from constrain.engine.sampler import SamplingParams
from constrain.engine.scheduler import FORCED, Row, Scheduler
from constrain.engine.speculative import (
    LookupDrafter,
    NgramIndex,
    SpeculativeConfig,
    choose_draft_length,
    choose_width,
    prefix_survival,
    verify,
)
from constrain.engine.state_cache import StateCache
from constrain.engine.types import GenerationRequest
from constrain.kernels import verify_draft_ref

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(autouse=True)
def _torch_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors through the kernels' torch twins, as the engine runs on a CPU, even when the
    kernel tests set TRITON_INTERPRET in this process (the interpreter is correct, only slow)."""
    import constrain.kernels._common as common

    monkeypatch.setattr(common, "INTERPRET", False)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """The tiny models' matmuls are far faster on one thread than split over busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

SCHEMAS = [
    PERSON_SCHEMA,
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 10}, "year": {"type": "integer"},
                                      "isbn": {"type": "string", "pattern": "^[0-9]{3}$"}},
     "required": ["title", "year", "isbn"]},
    {"type": "object", "properties": {"status": {"enum": ["ok", "failed", "pending"]}, "paid": {"type": "boolean"}},
     "required": ["status", "paid"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                               "maxItems": 3}}, "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"address": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city", "zip"], "additionalProperties": False}}, "required": ["address"]},
]
INSTANCES = [
    lambda r: {"name": r.choice(["Ann", "Bob Marley", "Zoe"]), "age": r.randint(1, 99)},
    lambda r: {"title": r.choice(["Dune", "Emma"]), "year": r.randint(1800, 2024), "isbn": f"{r.randint(0, 999):03d}"},
    lambda r: {"status": r.choice(["ok", "failed", "pending"]), "paid": r.random() < 0.5},
    lambda r: {"tags": r.sample(["red", "blue", "tall", "new"], r.randint(0, 3))},
    lambda r: {"address": {"city": r.choice(["Oslo", "Lima"]), "zip": f"{r.randint(0, 99999):05d}"}},
]


def _tiny_llama(vocab_size: int, seed: int = 0, init: float = 0.5) -> Any:
    """A random 2-layer Llama in float64: any model must give identity, and float64 keeps a
    several-token forward's logits equal to a one-token forward's after the cast to float32."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, initializer_range=init)
    return LlamaForCausalLM(cfg).to(torch.float64).eval()


@functools.lru_cache(maxsize=1)
def tiny_engine() -> Engine:
    """The tiny Llama over SmolLM2's real vocabulary and chat template."""
    demo = engine().loaded
    loaded = LoadedModel(_tiny_llama(demo.logits_width), demo.tokenizer, torch.device("cpu"), "tiny-llama",
                         demo.eos_token_ids)
    return Engine(loaded, max_batch=16, backend="eager")


def _schema_requests(n: int, seed: int = 0) -> list[Request]:
    """``n`` extraction-like prompts; the instance is in the prompt, so lookup has spans to copy."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        k = i % len(SCHEMAS)
        inst = json.dumps(INSTANCES[k](r), separators=(",", ":"))
        budget = r.choice([8, 14, 24, 40, 40, 40])  # short ones: the budget-aware close, "length"
        out.append(Request(f"Copy the record as JSON: {inst}\nText: {inst}", json_schema=SCHEMAS[k], max_tokens=budget))
    return out


def _run(eng: Engine, reqs: list[Request], spec: Any) -> list[Any]:
    eng.speculative = SpeculativeConfig.parse(spec)
    try:
        return eng.run(reqs)
    finally:
        eng.speculative = None


def _same(want: list[Any], got: list[Any]) -> None:
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
        assert (g.finish_reason, g.forced_tokens) == (w.finish_reason, w.forced_tokens)


def test_greedy_speculation_is_token_identical_on_200_schema_prompts() -> None:
    eng = tiny_engine()
    reqs = _schema_requests(200)
    want = _run(eng, reqs, None)
    got = _run(eng, reqs, "forced+lookup")
    _same(want, got)
    for req, res in zip(reqs, got):
        if res.finish_reason == "stop":
            assert checker("json_schema", req.json_schema)(res.text), res.text
        assert res.accepted_draft_tokens <= res.draft_tokens
    assert sum(r.finish_reason == "stop" for r in got) > 100 and any(r.finish_reason == "length" for r in got)
    assert sum(r.accepted_draft_tokens for r in got) > 100
    assert sum(len(r.token_ids) for r in got) > sum(r.steps for r in got)  # fewer steps than tokens
    assert sum(r.steps for r in got) < sum(r.steps for r in want)


@pytest.mark.parametrize("spec", ["forced", "lookup", SpeculativeConfig(max_draft=2, adaptive=False),
                                  SpeculativeConfig(mask_drafts=False)])
def test_every_drafter_is_exact(spec: Any) -> None:
    eng = tiny_engine()
    reqs = _schema_requests(30, seed=1)
    _same(_run(eng, reqs, None), _run(eng, reqs, spec))


def test_graph_path_speculation_equals_plain() -> None:
    """The graph step backend (run eagerly on the CPU) verifies drafts with the same result,
    in a mixed batch (unconstrained, seeded top-k, constrained) with admission in rounds."""
    eng = tiny_engine()
    reqs = [eng._to_request(r) for r in _schema_requests(10, seed=2)]
    reqs[3] = GenerationRequest(reqs[3].prompt_ids, None, max_tokens=10)
    reqs[5] = GenerationRequest(reqs[5].prompt_ids, reqs[5].grammar, SamplingParams(0.7, top_k=5, seed=3), 20)
    model = eng.loaded.model

    def graph(spec: Any) -> list[Any]:
        step = GraphStep(GraphRunner(model, 4, 256), eng.vocab.vocab_size)
        return run_requests(Scheduler(step, eng.vocab, eng._encode, max_prefill_tokens=64, speculative=spec), reqs)

    eager = run_requests(Scheduler(EagerStep(ModelRunner(model, 4, 256), eng.vocab.vocab_size), eng.vocab,
                                   eng._encode, speculative=None), reqs)
    plain, spec = graph(None), graph("forced+lookup")
    _same(eager, plain)
    _same(eager, spec)
    assert sum(r.draft_tokens for r in spec) > 0


def test_graph_path_wide_rows_fall_back_to_the_eager_pass() -> None:
    """Byte tokens make forced keys long: a row's pending + draft beyond the widest captured
    width goes through the eager several-tokens pass, with the same tokens."""
    model = _tiny_llama(BYTES.vocab_size, seed=3, init=1.0)
    schema = {"type": "object", "properties": {"international_standard_book_number": {"type": "string",
                                                                                      "maxLength": 40}},
              "required": ["international_standard_book_number"], "additionalProperties": False}
    grammar = Constraint.from_args(schema).compile(BYTES)
    prompt = list(b'{"international_standard_book_number":"isbn-isbn-isbn-isbn-isbn"}')
    reqs = [GenerationRequest(prompt, grammar, max_tokens=60, force_tokens=f) for f in (True, False)]
    want = run_requests(_byte_scheduler(model, 2, None, 128), reqs)
    step = GraphStep(GraphRunner(model, 2, 128), BYTES.vocab_size)
    cfg = SpeculativeConfig(max_draft=40)
    got = run_requests(Scheduler(step, BYTES, lambda text: list(text.encode()), speculative=cfg), reqs)
    _same(want, got)
    assert got[1].draft_tokens > 32  # forced text proposed as drafts when forcing is off


def test_demo_model_copies_through_lookup() -> None:
    """The real model copies spans of its prompt: lookup drafts are accepted, output unchanged."""
    eng = engine()
    r = random.Random(3)
    reqs = []
    for k in (0, 1, 4):
        inst = json.dumps(INSTANCES[k](r), separators=(",", ":"))
        reqs.append(Request(f"Repeat this JSON exactly: {inst}", json_schema=SCHEMAS[k], max_tokens=40))
    want = _run(eng, reqs, None)
    got = _run(eng, reqs, "forced+lookup")
    _same(want, got)
    assert sum(g.accepted_draft_tokens for g in got) >= 5
    assert sum(g.steps for g in got) < sum(w.steps for w in want)


# -- sampling: the speculative distribution is plain masked sampling ----------------------------
BYTES = Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])
EOS = 256


def _byte_scheduler(model: Any, rows: int, spec: Any, max_len: int = 64) -> Scheduler:
    backend = EagerStep(ModelRunner(model, rows, max_len), BYTES.vocab_size)
    return Scheduler(backend, BYTES, lambda text: list(text.encode()), speculative=spec)


def _exact(model: Any, prompt: list[int], grammar: Any, budget: int) -> dict[tuple[Any, ...], float]:
    """Probability of every output (tokens, finish) of masked sampling at temperature 1."""
    out: dict[tuple[Any, ...], float] = {}

    def walk(prefix: list[int], p: float) -> None:
        m = grammar.matcher()
        for t in prefix:
            assert m.accept_token(t)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + prefix])).logits[0, -1].float()
        allowed = torch.zeros(BYTES.vocab_size, dtype=torch.bool)
        allowed[torch.as_tensor(m.allowed_token_ids(), dtype=torch.long)] = True
        probs = torch.softmax(logits[: BYTES.vocab_size].masked_fill(~allowed, float("-inf")).double(), -1)
        for t in allowed.nonzero().flatten().tolist():
            q = p * float(probs[t])
            if t == EOS:
                out[(*prefix, "stop")] = q
            elif len(prefix) + 1 == budget:
                out[(*prefix, t, "length")] = q
            else:
                walk([*prefix, t], q)

    walk([], 1.0)
    return out


def test_sampled_speculation_follows_masked_sampling() -> None:
    from support.kernels import chi2_pvalue  # here: its import sets TRITON_INTERPRET if triton is not loaded yet
    model = _tiny_llama(BYTES.vocab_size, seed=1, init=0.3)
    grammar = Constraint.from_args(regex="[abc]{1,6}").compile(BYTES)
    prompt = list(b"abcabcab")  # lookup proposes "c", "ca", "cab"...
    budget, n = 4, 3000
    exact = _exact(model, prompt, grammar, budget)
    keys = sorted(exact, key=str)
    expected = torch.tensor([exact[k] for k in keys], dtype=torch.float64)
    assert abs(float(expected.sum()) - 1) < 1e-9
    reqs = [GenerationRequest(prompt, grammar, SamplingParams(1.0, seed=i), budget, budget_close=False)
            for i in range(n)]
    for spec in (None, SpeculativeConfig(adaptive=False)):
        got = run_requests(_byte_scheduler(model, 64, spec), reqs)
        counts = torch.zeros(len(keys))
        index = {k: i for i, k in enumerate(keys)}
        for g in got:
            counts[index[(*g.token_ids, g.finish_reason)]] += 1
        assert chi2_pvalue(counts, expected) > 1e-3, (spec, sorted(zip(expected.tolist(), counts.tolist()))[-8:])
        if spec is not None:
            assert sum(g.draft_tokens for g in got) > n // 20  # drafts were verified, not skipped
            assert 0 < sum(g.accepted_draft_tokens for g in got) < sum(g.draft_tokens for g in got)


# -- fuzz: random drafts, verified by the model, against a matcher replayed from scratch --------
Twist = Callable[[list[int], Row], list[int]]


class ScriptedDrafter:
    """Proposes the known plain output from the row's position on (``reference``: prompt ->
    output), changed by ``twist`` (the rest of the output, the row -> the draft)."""

    adaptive = False

    def __init__(self, reference: dict[tuple[int, ...], list[int]], twist: Twist) -> None:
        self.reference, self.twist = reference, twist

    def propose(self, row: Row, tail: list[int], k: int, scheduler: Scheduler) -> list[int]:
        ref = self.reference.get(tuple(row.request.prompt_ids), [])
        return self.twist(ref[len(row.generated) + len(tail):], row)[:k]


def _corrupting(rng: random.Random, corrupt: float) -> Twist:
    """The fuzz's drafts: the output with random corruptions, then a stop token and random
    tokens past the end of the document: every accept/reject pattern happens."""
    def twist(rest: list[int], row: Row) -> list[int]:
        out = rest[:8] + [EOS] + [rng.randrange(BYTES.vocab_size) for _ in range(8)]
        return [t if rng.random() >= corrupt else rng.choice([EOS, 34, 125, 48, 97]) for t in out]
    return twist


class _Raising:
    """A broken matcher: ``accept_token`` raises after ``after`` calls."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.left = inner, after

    def accept_token(self, token: int) -> bool:
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("broken matcher")
        return self.inner.accept_token(token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _run_checked(sched: Scheduler, reqs: list[GenerationRequest], want: list[Any]) -> list[Any]:
    """Run ``reqs`` to the end, checking after every step that each row's matcher is where a
    matcher replayed over its tokens is, and its KV length counts its tokens; then greedy
    results equal ``want`` (plain decoding's), budgets hold, complete outputs validate."""
    ids = [sched.add(q) for q in reqs]
    results: dict[int, Any] = {}
    for _ in range(sum(q.max_tokens for q in reqs) + len(reqs)):  # a stuck scheduler fails here
        if len(results) == len(reqs):
            break
        results.update(sched.step())
        for s in sched.running:
            if s.request.grammar is None or isinstance(s.matcher, _Raising):
                continue
            replay = s.request.grammar.matcher()
            assert all(replay.accept_token(t) for t in s.generated)
            assert replay.state == s.matcher.state
            assert s.length + len(s.pending) == len(s.request.prompt_ids) + len(s.generated)
    got = [results[i] for i in ids]
    for q, w, g in zip(reqs, want, got):
        if q.sampling.temperature == 0:
            assert (g.token_ids, g.finish_reason) == (w.token_ids, w.finish_reason)
        assert len(g.token_ids) <= q.max_tokens
        if q.grammar is not None and g.finish_reason == "stop":
            m = q.grammar.matcher()
            assert all(m.accept_token(t) for t in g.token_ids) and m.accept_token(EOS)
    return got


@functools.lru_cache(maxsize=1)
def _fuzz_setup() -> tuple[Any, list[Any]]:
    model = _tiny_llama(BYTES.vocab_size, seed=2, init=1.0)
    grammars = [Constraint.from_args(s).compile(BYTES) for s in SCHEMAS[:3]]
    grammars.append(Constraint.from_args(regex=r"(ab|cd){1,4}e?").compile(BYTES))
    return model, grammars


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), corrupt=st.sampled_from([0.0, 0.1, 0.4]), masked=st.booleans(),
       broken=st.booleans(), max_draft=st.integers(1, 6))
def test_rollback_fuzz_states_agree_with_replay(seed: int, corrupt: float, masked: bool, broken: bool,
                                                max_draft: int) -> None:
    model, grammars = _fuzz_setup()
    r = random.Random(seed)
    reqs = []
    for i in range(5):
        g = r.choice([*grammars, None])
        prompt = list(f"{i}{r.random():.4f}: ".encode())
        temp = r.choice([0.0, 0.0, 1.0])
        reqs.append(GenerationRequest(prompt, g, SamplingParams(temp, seed=i), r.choice([6, 12, 30]),
                                      stop_token_ids=frozenset([EOS]), force_tokens=r.random() < 0.7))
    want = run_requests(_byte_scheduler(model, 3, None), reqs)
    reference = {tuple(q.prompt_ids): w.token_ids for q, w in zip(reqs, want)}
    if broken:  # its own fresh matcher, raising mid-way: only its request fails
        g = grammars[0]
        reqs.append(GenerationRequest(list(b"x: "), g, max_tokens=30, matcher=_Raising(g.matcher(), 4)))
    cfg = SpeculativeConfig(drafters=(ScriptedDrafter(reference, _corrupting(r, corrupt)),), max_draft=max_draft,
                            mask_drafts=masked)
    got = _run_checked(_byte_scheduler(model, 3, cfg), reqs, want)
    if broken:
        assert got[-1].finish_reason == "error" and "broken matcher" in got[-1].error
    assert all(g.finish_reason != "error" for g in got[: len(want)])


# -- the anchor bugs' situations (issue 14): each against plain decoding and a replayed matcher ----
PADDED = Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None], eos_token_ids=[EOS], vocab_size=320)


@functools.lru_cache(maxsize=2)
def _anchor_model(vocab_size: int) -> Any:
    return _tiny_llama(vocab_size, seed=4, init=1.0)


def _anchor_run(twist: Twist, constraints: list[Any], masked: bool = True, vocab: Vocabulary = BYTES,
                stops: frozenset[int] = frozenset([EOS]), max_tokens: int = 24) -> tuple[list[Any], list[Any]]:
    """Each constraint (None: unconstrained) greedy and sampled, plain then with ``twist``'s
    drafts, through ``_run_checked``; (requests, speculative results)."""
    model = _anchor_model(vocab.vocab_size)
    reqs = [GenerationRequest(list(f"{i}: ".encode()), None if c is None else c.compile(vocab),
                              SamplingParams(temp, seed=i), max_tokens, stop_token_ids=stops)
            for i, (c, temp) in enumerate((c, t) for c in constraints for t in (0.0, 1.0))]

    def scheduler(spec: Any) -> Scheduler:
        return Scheduler(EagerStep(ModelRunner(model, 3, 64), vocab.vocab_size), vocab,
                         lambda text: list(text.encode()), speculative=spec)

    want = run_requests(scheduler(None), reqs)
    reference = {tuple(q.prompt_ids): w.token_ids for q, w in zip(reqs, want)}
    cfg = SpeculativeConfig(drafters=(ScriptedDrafter(reference, twist),), max_draft=6, mask_drafts=masked)
    return reqs, _run_checked(scheduler(cfg), reqs, want)


JSON_OBJECT = Constraint.from_args({"type": "object"}, json_options={"property_order": "any",
                                                                    "strict_properties": False})
PERSON = Constraint.from_args(PERSON_SCHEMA)


@pytest.mark.parametrize("masked", [True, False])
def test_drafts_past_the_end_of_a_json_object(masked: bool) -> None:
    """vLLM #27969 (EAGLE-3 with json_object): the drafter goes on after the document is complete
    (more JSON where only the stop token may follow)."""
    reqs, got = _anchor_run(lambda rest, row: rest + list(b'},{"a":1}]') + [EOS], [JSON_OBJECT, PERSON], masked)
    done = [g for g in got if g.finish_reason == "stop"]
    assert len(done) >= 2 and all(isinstance(json.loads(g.text), dict) for g in done)
    assert sum(g.accepted_draft_tokens for g in got) > 0
    assert sum(g.draft_tokens - g.accepted_draft_tokens for g in got) > 0  # the past-the-end drafts


def test_stop_token_inside_a_draft_window() -> None:
    """vLLM #44297 (an end marker inside a draft window): stop tokens (EOS, and a newline as a
    request's own stop id) in the middle of drafts, constrained and unconstrained: the row ends
    at the stop, with nothing after it, as plain decoding does."""
    stops = frozenset([EOS, 10])
    reqs, got = _anchor_run(lambda rest, row: rest[:2] + [10, EOS] + rest[2:], [None, PERSON, JSON_OBJECT],
                            stops=stops)
    for q, g in zip(reqs, got):
        if q.grammar is None:
            assert not set(g.token_ids) & stops
    assert sum(g.draft_tokens for g in got) > 0


@pytest.mark.parametrize("masked", [True, False])
def test_padded_vocabulary_with_drafts(masked: bool) -> None:
    """vLLM #50924 (bitmask width off by one with a drafter): the model's logits are wider than
    the tokenizer (257 tokens, 320 logits); drafts carry padding ids and ids past the logits.
    Constrained rows never emit a padding id, no row forwards an id the model lacks."""
    reqs, got = _anchor_run(lambda rest, row: rest[:1] + [300, 319, 320, 5000, -1] + rest[1:],
                            [None, PERSON, JSON_OBJECT], masked, vocab=PADDED)
    for q, g in zip(reqs, got):
        assert all(0 <= t < 320 for t in g.token_ids)
        if q.grammar is not None:
            assert all(t < 256 for t in g.token_ids)
    assert all(g.finish_reason != "error" for g in got)


def test_no_stuck_or_crashed_batch_with_structured_output() -> None:
    """SGLang #9187 / #24283 (stuck or crashing with EAGLE and structured output): budgets of one
    and two tokens, output the grammar forces whole, a drafter that raises on one request (that
    request alone ends with an error), mixed with unconstrained rows; every request finishes in a
    bounded number of steps (``_run_checked``)."""
    def twist(rest: list[int], row: Row) -> list[int]:
        if row.request.prompt_ids[0] == ord("5"):  # the sampled PERSON row
            raise RuntimeError("drafter bug")
        return rest
    forced = Constraint.from_args(choices=["yes"])
    for budget in (1, 2, 24):
        reqs, got = _anchor_run(twist, [forced, None, PERSON, Constraint.from_args(regex="a{3}")],
                                max_tokens=budget)
        assert all(g.finish_reason != "error" for i, g in enumerate(got) if i != 5)
        if budget > 2:  # room for a draft (the last token of a budget is never drafted)
            assert got[5].finish_reason == "error" and "drafter bug" in got[5].error
            assert got[0].text == "yes" and got[6].text == "aaa"


def test_drafts_outside_the_grammar_are_never_emitted() -> None:
    """TensorRT-LLM #18892 (drafts emitting tokens outside the grammar): unmasked drafts of
    forbidden tokens only are all rejected, greedy and sampled; masked, they are cut unproposed."""
    digits = Constraint.from_args(regex="[0-9]{1,8}")
    for masked in (False, True):
        _, got = _anchor_run(lambda rest, row: list(b"\x01\x02" * 3), [digits, PERSON], masked)  # never JSON
        assert all(g.accepted_draft_tokens == 0 for g in got)
        assert (sum(g.draft_tokens for g in got) > 0) != masked


# -- the pieces ---------------------------------------------------------------------------------
@given(seed=st.integers(0, 10_000))
def test_greedy_verify_is_the_kernels_greedy_verify(seed: int) -> None:
    """Greedy rows are verified by one batched masked argmax, sampled ones by ``verify_draft``:
    the greedy tokens must be the kernel twin's, on logits made to break a careless argmax (ties,
    NaN, +inf, masks that allow one token or none), drafts that follow the argmax for a while."""
    g = torch.Generator().manual_seed(seed)
    b, k1, v, words = 6, 5, 70, 3
    logits = torch.randint(-2, 3, (b, k1, v), generator=g).float()  # many ties
    logits[torch.rand(b, k1, v, generator=g) < 0.05] = float("nan")
    logits[torch.rand(b, k1, v, generator=g) < 0.02] = float("inf")
    masks = torch.randint(-(1 << 31), 1 << 31, (b, k1, words), generator=g, dtype=torch.int64).to(torch.int32)
    masks[torch.rand(b, k1, generator=g) < 0.1] = 0  # nothing allowed
    one = torch.rand(b, k1, generator=g) < 0.2
    masks[one] = 0
    masks[..., 0][one] = 1 << 5  # token 5 only
    masked = logits.clone()
    for r in range(b):
        for j in range(k1):
            bits = torch.tensor([(int(masks[r, j, t >> 5]) >> (t & 31)) & 1 for t in range(v)], dtype=torch.bool)
            masked[r, j, ~bits] = float("-inf")
    x = torch.nan_to_num(masked, nan=float("-inf"), posinf=3.4e38, neginf=float("-inf"))
    drafts = []
    for r in range(b):
        n = int(torch.randint(1, k1, (1,), generator=g))
        follow = int(torch.randint(0, n + 1, (1,), generator=g))  # positions that copy the argmax
        drafts.append([int(x[r, j].argmax()) if j < follow else int(torch.randint(0, v, (1,), generator=g))
                       for j in range(n)])
    got = verify(logits.clone(), drafts, masks, list(range(b)), [SamplingParams()] * b, [0] * b, [0] * b)
    for r in range(b):
        d = len(drafts[r])
        tgt = masked[r:r + 1, : d + 1]
        dtok = torch.tensor([drafts[r]])
        one_hot = torch.full((1, d, v), float("-inf")).scatter_(2, dtok.unsqueeze(-1), 0.0)
        toks, n_out, _, flags = verify_draft_ref(tgt, one_hot, dtok, None, None, temperature=torch.zeros(1))
        want = toks[0, : int(n_out[0])].tolist() + ([-1] if int(flags[0]) == 2 else [])
        assert got[r] == want, (r, drafts[r])


@given(seq=st.lists(st.integers(0, 3), max_size=30), tail=st.lists(st.integers(0, 3), max_size=3),
       k=st.integers(1, 5))
def test_ngram_lookup_finds_the_latest_longest_earlier_match(seq: list[int], tail: list[int], k: int) -> None:
    index = NgramIndex(3)
    index.extend(seq[:7])
    index.extend(seq[7:])  # incremental = all at once
    full = seq + tail
    want: list[int] = []
    for n in range(min(3, len(full)), 0, -1):  # brute force: longest suffix, latest earlier end
        ends = [e for e in range(n, len(seq)) if full[e - n:e] == full[len(full) - n:]]
        if ends:
            want = full[max(ends):max(ends) + k]
            break
    assert index.lookup(tail, k) == want


def test_text_lookup_proposes_the_sequences_own_tokens_at_a_token_start() -> None:
    """No token n-gram recurs (``"John`` against `` John``) but the text does: where the match
    ends where a token of the sequence begins, its tokens are the draft, without tokenizing;
    inside a token, the rest of the text is tokenized."""
    vocab = Vocabulary.from_token_bytes([b" John", b" Smith", b".", b'"', b"John", b" Sm"])
    encoded: list[str] = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return [2]

    sched: Any = type("S", (), {"vocab": vocab, "encode": staticmethod(encode)})()
    drafter = LookupDrafter(3)
    for generated, want, calls in (([3, 4], [1, 2, 3, 4], []), ([3, 4, 5], [2], ['ith."John Sm'])):
        row = Row(0, GenerationRequest([0, 1, 2]), None, 0, 10, [])
        row.generated = generated
        assert drafter.propose(row, [], 4, sched) == want
        assert encoded == calls


def test_draft_length_grows_with_acceptance_and_shrinks_with_cost() -> None:
    ks = [choose_draft_length(rate, 5, 0.1) for rate in (0.0, 0.2, 0.5, 0.8, 0.95)]
    assert ks == sorted(ks) and ks[0] == 0 and ks[-1] == 5
    assert choose_draft_length(0.8, 5, 2.0) < choose_draft_length(0.8, 5, 0.05)


@pytest.mark.parametrize(("times", "want"), [
    ([1.0, 1.1, 1.2, 1.3], 3),  # cheap width: (2, 3.0, 3.82, 4.55) / t = 2, 2.73, 3.18, 3.50
    ([1.0, 1.2, 1.9, 2.6], 1),  # 2, 2.50, 2.01, 1.75
    ([1.0, 2.0, 3.0, 4.0], 0),  # a verify step costs more than its tokens: 2, 1.50, 1.27, 1.14
])
def test_batch_width_maximises_expected_tokens_per_step_time(times: list[float], want: int) -> None:
    """Two rows, rates 0.9 and 0.1 over three draft tokens: survivals (0.9, 0.81, 0.729) and
    (0.1, 0.01, 0.001), so the batch emits 2, 3.0, 3.82, 4.55 tokens at W = 0..3."""
    survive = [prefix_survival([0.9] * 3), prefix_survival([0.1] * 3)]
    assert survive[0] == pytest.approx([0.9, 0.81, 0.729])
    gains = [[1.0 + sum(p[:w]) for w in range(4)] for p in survive]
    assert choose_width(gains, times) == want
    assert choose_width([[1.0] * 4] * 2, [1.0] * 4) == 0  # ties (nothing survives): the plain step


def test_batch_width_never_cuts_inside_forced_text() -> None:
    row = Row(0, None, None, 0, 10, [1])  # type: ignore[arg-type]
    row.draft_kind = [1, FORCED, FORCED, 1]
    assert Scheduler._safe_cuts(row, 5) == [0, 1, 1, 3, 4, 4]
    row.draft_kind = [FORCED, FORCED, 1, FORCED, FORCED, FORCED]
    assert Scheduler._safe_cuts(row, 7) == [0, 0, 2, 3, 3, 3, 6, 6]


def test_step_time_table_is_relative_to_the_plain_forward() -> None:
    run = object.__new__(GraphRunner)  # only the table and the length buckets: no model needed
    run.runner = SimpleNamespace(max_len=4096)
    run.step_ms = {(32, 1, 64): 1.0, (32, 8, 2048): 6.0, (32, 1, 1024): 2.0, (32, 8, 1024): 3.0,
                   (32, 1, 256): 1.5, (32, 8, 256): 1.5, (4, 2, 64): 1.0}
    run._step_times = {}
    assert run.step_time(20, 5, 1000) == 1.5  # rows bucket 32, tokens bucket 8, length 1024
    assert run.step_time(20, 5, 3000) == 1.5  # no plain step at 4096 or 2048: the nearest with both
    assert run.step_time(20, 5, 200) == 1.0  # length 256
    assert run.step_time(20, 5, 60) == 1.0  # nearest with both (256), not the plain 64 against 2048
    assert run.step_time(20, 9, 100) is None and run.step_time(3, 2, 100) is None  # not measured
    assert run.step_time(20, 5, 1000) == 1.5  # asked again: the remembered answer


def test_costly_verification_falls_back_to_plain_steps() -> None:
    """With verification priced far above its tokens the batch width is 0 every step: no draft
    is verified, and the output is still plain decoding's."""
    eng = tiny_engine()
    reqs = _schema_requests(10, seed=3)
    got = _run(eng, reqs, SpeculativeConfig(cost=100.0))
    _same(_run(eng, reqs, None), got)
    assert sum(r.draft_tokens for r in got) == 0


class _PricedStep(EagerStep):
    """An eager backend that measured every verification far above what its tokens bring."""

    def step_time(self, rows: int, width: int, need: int) -> float | None:
        return 1000.0 ** width


def test_the_backends_step_time_prices_verification() -> None:
    """The batch width comes from the backend's ``step_time``: a backend pricing verification far
    above its tokens gets plain steps only (plain decoding's output); the eager default verifies."""
    model, grammars = _fuzz_setup()
    reqs = [GenerationRequest(list(f"{i}: ".encode()), g, max_tokens=12, stop_token_ids=frozenset([EOS]))
            for i, g in enumerate(grammars)]
    want = run_requests(_byte_scheduler(model, 4, None), reqs)
    priced = Scheduler(_PricedStep(ModelRunner(model, 4, 64), BYTES.vocab_size), BYTES,
                       lambda text: list(text.encode()), speculative="forced")
    got = run_requests(priced, reqs)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sum(g.draft_tokens for g in got) == 0
    assert sum(g.draft_tokens for g in run_requests(_byte_scheduler(model, 4, "forced"), reqs)) > 0


def test_config_parse() -> None:
    assert SpeculativeConfig.parse("off") is None and SpeculativeConfig.parse(None) is None
    assert SpeculativeConfig.parse(True) == SpeculativeConfig()
    assert SpeculativeConfig.parse("lookup").drafters == ("lookup",)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="drafters"):
        SpeculativeConfig.parse("eagle")


def test_cli_flag_shows_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    from constrain.engine.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--speculative {off,forced,lookup,forced+lookup}" in out and "(default: off)" in out


# -- the drafts' walk through the state cache, against a matcher replayed from scratch ----------
class _Planned:
    """Proposes ``plan`` from the draft's position on (set before each draft)."""

    adaptive = False
    plan: list[int] = []

    def propose(self, row: Row, tail: list[int], k: int, scheduler: Scheduler) -> list[int]:
        return self.plan[len(tail):len(tail) + k]


class _Counting:
    """A correct matcher that counts the calls that walk it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.walked = inner, 0

    def accept_token(self, token: int) -> bool:
        self.walked += 1
        return self.inner.accept_token(token)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _CacheOnly:
    """A step backend reduced to what drafting needs: its state cache."""

    max_rows, max_len = 1, 4096

    def __init__(self, words: int) -> None:
        self.cache = StateCache(words, "cpu", states=64, transitions=16, scratch_rows=1)


def _allowed(m: Any, words: int, tokens_left: int | None = None) -> Any:
    bits = np.zeros((1, words), dtype=np.int32)
    m.fill_next_token_bitmask(bits, 0, tokens_left=tokens_left)
    return np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))[0]


def test_cached_draft_walk_equals_a_replayed_matcher() -> None:
    """Random drafts (a random document's continuation, corrupted by random allowed and
    forbidden tokens and stop tokens) on SmolLM2's tokenizer and the schemas above, each drafted
    twice through one shared cache: at every walked position the state the cache reaches and the
    mask row it picks (plain, budget-aware close, one-token forced text) are what a matcher
    replayed over the row's tokens reaches and fills; the second time no matcher call is needed."""
    eng = engine()
    vocab, words = eng.vocab, (eng.vocab.vocab_size + 31) // 32
    drafter = _Planned()
    backend = _CacheOnly(words)
    sched = Scheduler(backend, vocab, eng._encode,  # type: ignore[arg-type]
                      speculative=SpeculativeConfig(drafters=(drafter,), max_draft=6, batch_width=False))
    cache, eos = backend.cache, vocab.eos_token_ids[0]
    rng = np.random.default_rng(0)
    checked = closed = forced = 0
    for k, schema in enumerate(SCHEMAS):
        cg = Constraint.from_args(schema).compile(vocab)
        for _ in range(4):
            doc, m = [], cg.matcher()  # a random document, finished within 40 tokens
            while len(doc) < 39 and not m.is_terminated():
                doc.append(int(rng.choice(_allowed(m, words, 40 - len(doc)))))
                assert m.accept_token(doc[-1])
            for p in range(0, len(doc), 3):
                m = cg.matcher()
                assert all(m.accept_token(t) for t in doc[:p])
                plan = doc[p:p + 8]
                for j in range(len(plan)):
                    r = rng.random()
                    if r < 0.1:
                        plan[j] = int(rng.integers(vocab.vocab_size))
                    elif r < 0.15:
                        plan[j] = eos
                    elif r < 0.25:
                        replay = cg.matcher()
                        if all(replay.accept_token(t) for t in doc[:p] + plan[:j]) and not replay.is_terminated():
                            plan[j] = int(rng.choice(_allowed(replay, words)))
                request = GenerationRequest([1], cg, max_tokens=p + int(rng.integers(2, 30)),
                                            force_tokens=bool(rng.random() < 0.7))
                for again in (False, True):
                    row = Row(0, request, _Counting(m), 0, request.max_tokens, [], generated=doc[:p])
                    drafter.plan = plan
                    state = m.state
                    rows = sched._draft_all([row])
                    assert row.finish_reason is None and m.state == state  # rolled back
                    if again:
                        assert row.matcher.walked == 0  # every state and pair known: no matcher walk
                    if rows is None:
                        continue
                    gid = cache.enter(cg, state)
                    replay = cg.matcher()
                    assert all(replay.accept_token(t) for t in doc[:p])
                    for j in range(len(row.draft) + 1):
                        assert cache.local(gid) == replay.state
                        want = np.zeros((1, words), dtype=np.int32)
                        if j < len(row.draft) and row.draft_kind[j] == FORCED:
                            want[0].view(np.uint32)[row.draft[j] >> 5] = 1 << (row.draft[j] & 31)
                            forced += 1
                        else:
                            left = sched.budget_left(dataclasses.replace(row, matcher=replay), j)
                            Scheduler._fill_close(replay, want, 0, left)
                            closed += left is not None
                        assert np.array_equal(cache.table.masks[int(rows[0, j])].numpy(), want[0]), (k, p, j)
                        checked += 1
                        if j < len(row.draft):
                            assert replay.accept_token(row.draft[j])
                            nxt = cache.successor(gid, row.draft[j])
                            assert nxt is not None
                            gid = nxt
    assert checked > 500 and closed > 20 and forced > 20, (checked, closed, forced)
