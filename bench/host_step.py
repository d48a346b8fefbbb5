"""Host work per row per decode step of the state-table path, the model stubbed out (CPU).

Why: on the H200 a SmolLM2-135M forward at batch 256 takes ~1.6 ms, and everything the host
does per row and step (the scheduler accepting the token into the row's matcher, stop and
forced-text checks, ``GraphStep``'s sync and mask preparation, result bookkeeping) adds up
to more than that at ~8-10 us a row. This measures exactly that work, repeatably, on any CPU.

How: greedy outputs of the demo model (SmolLM2-135M-Instruct, the eager CPU backend) for
JSON-schema requests (JSONSchemaBench dev schemas from ``/work/shared/data``, ``max_tokens``
64) are recorded once and cached in ``bench/results/host_step_record.json`` (git-ignored; the
key says what was recorded). They are then replayed through the real ``Scheduler`` and
``GraphStep`` at each batch (cycling the recorded requests) over a ``GraphRunner`` whose model
is a tiny random Llama and whose forward, prefill and sampling are stubs: each step "samples"
each row's recorded token, and the ``kernels.StateTable`` (on CPU tensors) gathers the row's
mask (the token must be allowed: the replay stops with an error where it is not) and advances
the state, giving the same (token, state, miss) outputs the GPU's ``constrained_step`` gives.
Every replay's results must equal the recording, token for token.

Timed: every ``Scheduler.step`` that admits no request, after one warm-up pass of the same
requests through the same scheduler and backend (the steady state: states, transitions, close
rows and forced text all seen; first visits are a separate problem), minus the time spent in
the stubs (what the GPU does) and in ``GraphRunner.move_rows`` (compaction's device copies of
each moved row's buffers and KV slot, reported apart: on the CPU they are copies, on a GPU
kernel launches, a different cost). Reported: host us per live row per step (best of
``--repeats`` passes; this process's CPU time, ``time.process_time``, so other work on the
machine does not count; torch on one thread; the garbage collector off, as ``timeit`` has it:
a full collection takes ~0.1 s with a model loaded and would land in one step), the same per
section (``SECTIONS``: one more pass with a timer around each; nested ones overlap), how many
of a pass's steps used a forward ``GraphStep`` queued ahead of the host's work (on a GPU the
host work of the others is not overlapped), and with ``--profile`` a cProfile breakdown of one
pass at the largest batch.

Two request kinds: ``plain`` (no forced text, no budget-aware close: the engine bench's mode
table, ``bench/engine_graph.make_requests``) and ``defaults`` (the Engine's defaults: forced
text appended, the budget-aware close).

    python3 -m bench.host_step                          # batch 16, 64, 256; both kinds
    python3 -m bench.host_step --batches 256 --kinds plain --profile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import hashlib
import json
import pstats
import time
from pathlib import Path
from typing import Any

import torch

from constrain.engine.constraints import Constraint
from constrain.engine.generate import run_requests
from constrain.engine.graph_loop import GraphStep
from constrain.engine.graph_runner import GraphRunner
from constrain.engine.runner import EagerStep, ModelRunner
from constrain.engine.sampler import SamplingParams
from constrain.engine.scheduler import Row, Scheduler
from constrain.engine.types import GenerationRequest, GenerationResult
from constrain.testing.corpus import DEFAULT_DATA

RESULTS = Path(__file__).resolve().parent / "results"
SUBSETS = ("Glaiveai2K", "Github_easy")
PROMPT = "Produce one JSON object for this schema, item {i}: {schema}"
KINDS = {"plain": (False, False), "defaults": (True, True)}  # force_tokens, budget_close


class Diverged(RuntimeError):
    """The replay left the recording (a token its mask forbids, or a row past its record)."""


def schemas(count: int) -> list[tuple[str, Any]]:
    """The first ``count`` dev schemas (even positions) of the subsets, in order."""
    out = []
    for subset in SUBSETS:
        with gzip.open(DEFAULT_DATA / "jsonschemabench" / f"{subset}.jsonl.gz", "rt") as fh:
            for i, line in enumerate(fh):
                if i % 2 == 0:
                    out.append((f"{subset}/{i}", json.loads(line)["schema"]))
    return out[:count]


def build_requests(engine: Any, kind: str, count: int, max_tokens: int) -> tuple[list[GenerationRequest], list[str]]:
    """Greedy requests over the first ``count`` schemas constrain compiles (the ids used)."""
    force, close = KINDS[kind]
    reqs, ids = [], []
    for sid, schema in schemas(4 * count):
        if len(reqs) == count:
            break
        try:
            grammar = engine.compile(Constraint.from_args(json_schema=schema))
        except Exception:  # a schema constrain refuses is simply not used
            continue
        text = PROMPT.format(i=len(reqs), schema=json.dumps(schema)[:160])
        reqs.append(GenerationRequest(engine.loaded.encode_prompt(text), grammar, SamplingParams(0.0), max_tokens,
                                      stop_token_ids=frozenset(engine.loaded.eos_token_ids),
                                      force_tokens=force, budget_close=close))
        ids.append(sid)
    return reqs, ids


def record(engine: Any, kind: str, count: int, max_tokens: int) -> tuple[list[GenerationRequest], list[dict]]:
    """The requests of ``kind`` and their greedy outputs (recorded once, then read from the cache)."""
    reqs, ids = build_requests(engine, kind, count, max_tokens)
    key = hashlib.sha256(json.dumps([engine.loaded.name, kind, ids, max_tokens,
                                     [r.prompt_ids for r in reqs]]).encode()).hexdigest()
    path = RESULTS / "host_step_record.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if key not in cache:
        t0 = time.perf_counter()
        backend = EagerStep(ModelRunner(engine.loaded.model, 16, 512), engine.vocab.vocab_size)
        got = run_requests(Scheduler(backend, engine.vocab, engine._encode), reqs)
        cache[key] = [{"tokens": g.token_ids, "finish": g.finish_reason} for g in got]
        RESULTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(cache))
        print(f"recorded {kind}: {len(reqs)} requests in {time.perf_counter() - t0:.1f} s")
    return reqs, cache[key]


class ReplayRunner(GraphRunner):
    """A ``GraphRunner`` whose forward is a no-op and whose sample emits each row's recorded
    token, the state table gathering and advancing on CPU as ``kernels.constrained_step`` does.
    ``stub_s`` accumulates the time spent standing in for the GPU, ``moves_s`` in compaction."""

    def __init__(self, max_batch: int, max_len: int, stop: int, layers: int) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        # ``layers``: the real model's, so that compaction copies KV slots of the real shape
        tiny = LlamaConfig(vocab_size=2, hidden_size=8, num_hidden_layers=layers, num_attention_heads=1,
                           num_key_value_heads=1, intermediate_size=8, max_position_embeddings=max_len,
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
        super().__init__(LlamaForCausalLM(tiny).eval(), max_batch, max_len, use_graphs=False)
        self.stop = stop
        self.batch: list[Row] = []
        self.records: dict[int, dict] = {}  # id(request) -> its recording
        self.stub_s = 0.0
        self.moves_s = 0.0  # in ``move_rows``: device copies (compaction), counted apart
        self.runner.extend = self._extend  # type: ignore[method-assign]

    def _extend(self, first_slot: int, tokens: Any, starts: Any, n_logits: Any = None) -> torch.Tensor:
        return torch.zeros(len(tokens), self.logits.shape[1])

    def _forward(self, rows: int, length: int) -> None:
        pass

    def verify_forward(self, tokens: list[list[int]], starts: list[int]) -> torch.Tensor:
        return torch.zeros(len(tokens), max(map(len, tokens)), self.logits.shape[1])

    def move_rows(self, moves: list[tuple[int, int, int]], live: int) -> None:
        t0 = time.process_time()
        super().move_rows(moves, live)
        self.moves_s += time.process_time() - t0

    def _recorded(self, rows: int) -> torch.Tensor:
        out = [0] * rows
        for i, s in enumerate(self.batch):
            rec = self.records[id(s.request)]
            k = len(s.generated)
            if k < len(rec["tokens"]):
                out[i] = rec["tokens"][k]
            elif k == len(rec["tokens"]) and rec["finish"] == "stop":
                out[i] = self.stop
            else:
                raise Diverged(f"request {s.rid} asked for token {k} of a record of {len(rec['tokens'])}")
        return torch.tensor(out, dtype=torch.int64)

    def _sample(self, rows: int, mode: str, table: Any, filtered: bool) -> None:
        t0 = time.process_time()
        tok = self._recorded(rows)
        sl = slice(0, rows)
        if mode == "table":
            states = self.states[sl]
            # each row's word of its token only: a gather of whole rows (1.5 MB at batch 256)
            # would evict the host's own data from the caches, which the GPU does not
            bits = ((table.masks[states.clamp(min=0).long(), tok >> 5] >> (tok & 31)) & 1).tolist()
            bad = [i for i, s in enumerate(self.batch) if not bits[i] and s.matcher is not None]
            if bad:
                raise Diverged(f"rows {bad}: the recorded token is not allowed by the row's mask")
            nxt, miss = table.advance(states, tok)
            self.states[sl].copy_(nxt)
            self.out[2, sl].copy_(miss)
        else:
            self.out[2, sl].zero_()
        self.out[0, sl].copy_(tok)
        self.out[1, sl].copy_(self.states[sl])
        self.ids[sl].copy_(tok)
        self.pos[sl] += 1
        self.draws[sl] += 1
        self.stub_s += time.process_time() - t0


class ReplayStep(GraphStep):
    """``GraphStep`` telling its runner which rows a step samples for."""

    runner: ReplayRunner

    def step(self, batch: list[Row], n_old: int, scheduler: Scheduler) -> list[int]:
        self.runner.batch = batch
        return super().step(batch, n_old, scheduler)


# the per-step pieces the breakdown times, where they exist (names of the code measured)
SECTIONS = {"backend": ("_prepare_masks", "_ahead_serves", "_forward_ahead", "sync", "_resolve_pending", "move_rows"),
            "scheduler": ("_prepare_masks", "outcomes", "_take_step", "_advance", "_retire", "_result")}


class TimedScheduler(Scheduler):
    """Times every step that admits nothing: (CPU s, in the stubs, in compaction, live rows);
    ``sections``: CPU s inside each of the ``SECTIONS`` methods during those steps."""

    log: list[tuple[float, float, float, int]]
    timing = False

    def step(self) -> list[tuple[int, GenerationResult]]:
        backend = self.backend
        assert isinstance(backend, ReplayStep)
        admit = bool(self.waiting) and len(self.running) < backend.max_rows
        runner = backend.runner
        live, stub, moves = len(self.running), runner.stub_s, runner.moves_s
        self.timing = not admit and bool(live)
        t0 = time.process_time()
        out = super().step()
        wall = time.process_time() - t0
        if self.timing:
            self.log.append((wall, runner.stub_s - stub, runner.moves_s - moves, live))
        return out

    def time_sections(self) -> dict[str, float]:
        """Wrap the ``SECTIONS`` methods of this scheduler and its backend with CPU timers."""
        sections: dict[str, float] = {}
        for owner, names in (("backend", SECTIONS["backend"]), ("scheduler", SECTIONS["scheduler"])):
            obj = self.backend if owner == "backend" else self
            for name in names:
                if hasattr(obj, name):
                    setattr(obj, name, self._timer(getattr(obj, name), f"{owner}.{name}", sections))
        return sections

    def _timer(self, fn: Any, label: str, sections: dict[str, float]) -> Any:
        def timed(*args: Any, **kw: Any) -> Any:
            if not self.timing:
                return fn(*args, **kw)
            t0 = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                sections[label] = sections.get(label, 0.0) + time.process_time() - t0
        return timed


def replay(engine: Any, reqs: list[GenerationRequest], recs: list[dict], batch: int, repeats: int,
           profile: bool, layers: int) -> dict:
    """Host us per row per step replaying ``batch`` requests (cycling ``reqs``)."""
    need = max(len(r.prompt_ids) + r.max_tokens for r in reqs) + 1
    runner = ReplayRunner(batch, -(-need // 64) * 64, engine.vocab.eos_token_ids[0], layers)
    backend = ReplayStep(runner, engine.vocab.vocab_size)
    sched = TimedScheduler(backend, engine.vocab, engine._encode, context_len=engine.context_len)
    rows = [GenerationRequest(**{**reqs[i % len(reqs)].__dict__}) for i in range(batch)]
    want = [recs[i % len(reqs)] for i in range(batch)]
    runner.records = {id(r): w for r, w in zip(rows, want)}

    def one_pass(prof: cProfile.Profile | None = None) -> float:
        sched.log = []
        gc.collect()
        gc.disable()  # as timeit does: a full collection (~0.1 s with a model loaded) is no step's cost
        if prof is not None:
            prof.enable()
        try:
            got = run_requests(sched, rows)
        finally:
            if prof is not None:
                prof.disable()
            gc.enable()
        for i, (g, w) in enumerate(zip(got, want)):
            if g.token_ids != w["tokens"] or g.finish_reason != w["finish"]:
                raise Diverged(f"request {i}: replay gave {g.finish_reason} {g.token_ids}, recorded {w}")
        return 1e6 * sum(w - s - m for w, s, m, _ in sched.log) / sum(n for *_, n in sched.log)

    warm = one_pass()
    times = [one_pass() for _ in range(repeats - 1)]
    served, steps = backend.ahead_served, backend.steps
    times.append(one_pass())
    row_steps = sum(n for *_, n in sched.log)
    out = {"batch": batch, "us_per_row_step": round(min(times), 2), "passes": [round(t, 2) for t in times],
           "warmup_pass": round(warm, 2), "steps": len(sched.log), "row_steps": row_steps,
           "stub_us_per_row_step": round(1e6 * sum(s for _, s, _, _ in sched.log) / row_steps, 2),
           "compaction_us_per_row_step": round(1e6 * sum(m for _, _, m, _ in sched.log) / row_steps, 2),
           # forwards queued ahead of the host's work and used (of the pass's steps)
           "ahead_served_of_steps": [backend.ahead_served - served, backend.steps - steps]}
    if profile:
        prof = cProfile.Profile()
        one_pass(prof)
        stats = pstats.Stats(prof)
        print(f"\ncProfile, one warm pass at batch {batch} ({out['row_steps']} row-steps), by own time:")
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)
    sections = sched.time_sections()  # one more pass, timed piece by piece (the timers cost a little)
    one_pass()
    out["sections_us_per_row_step"] = {k: round(1e6 * v / row_steps, 2) for k, v in sections.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,64,256")
    ap.add_argument("--kinds", default="plain,defaults")
    ap.add_argument("--requests", type=int, default=48, help="distinct recorded requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per cell (best reported)")
    ap.add_argument("--profile", action="store_true", help="cProfile one pass at the largest batch")
    ap.add_argument("--layers", type=int, default=None, help="layers of the stub model (default: the real model's)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from constrain.engine.api import Engine

    engine = Engine.from_pretrained()
    batches = [int(b) for b in args.batches.split(",")]
    for kind in args.kinds.split(","):
        reqs, recs = record(engine, kind, args.requests, args.max_tokens)
        tokens = sum(len(r["tokens"]) for r in recs)
        print(f"{kind}: {len(reqs)} requests, {tokens} tokens recorded, finish "
              f"{ {f: sum(r['finish'] == f for r in recs) for f in ('stop', 'length', 'error')} }")
        for b in batches:
            row = replay(engine, reqs, recs, b, args.repeats, args.profile and b == max(batches),
                         args.layers or engine.loaded.model.config.num_hidden_layers)
            print(json.dumps({"kind": kind, **row}), flush=True)


if __name__ == "__main__":
    main()
