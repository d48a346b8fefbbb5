"""Decode steps replayed from CUDA graphs: static buffers, one graph per (rows, length) bucket.

Why: an eager decode step of a transformers model is ~450 kernel launches plus Python per
layer, ~80-100 ms at any batch on an H200, so the GPU idles and constraint overhead cannot even
be seen. Replaying a captured graph costs a few microseconds of host time per step.

What is captured (per bucket, on first use, or ahead of time with ``capture`` /
``capture_sample`` so that no capture lands inside a timed run):
- ``forward`` graph per (rows, attended length): ``StaticDecoder.step`` on the static ``ids`` /
  ``pos`` buffers, logits into the static ``logits`` buffer;
- ``sample`` graph per (rows, mode, filtered): the fused sampler over those logits, masks taken
  - ``table``: from the GPU ``StateTable`` by each row's state (``kernels.constrained_step``:
    sample, then advance the state on the GPU; misses flagged for the host; rows whose mask the
    host fills point at a row of the table the host wrote for them),
  - ``none``: no mask;
  with the top-k / top-p filters only when a row asks for them (``filtered``); then the step's
  outputs become the next step's inputs on the GPU (ids <- token, pos += 1, draws += 1,
  states <- next state), so a steady-state step needs no host writes at all.

Rows are KV slots ``0..rows-1``; rows past the live ones (bucket padding, finished sequences)
run along with positions past the cache end (scratch column) or unconstrained states.

Without CUDA (CI) every call runs the same functions eagerly: the graph layer is only capture
and replay around them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from constrain.engine.runner import ModelRunner
from constrain.engine.static_decoder import StaticDecoder
from constrain.kernels import StateTable, constrained_step, sample, to_device

if TYPE_CHECKING:
    from constrain.engine.types import CausalLM

logger = logging.getLogger("constrain")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WIDTH_BUCKETS = (2, 4, 8, 16, 32)  # tokens per row of a captured verification pass
MIN_LENGTH_BUCKET = 64
_MIX = 0x9E3779B97F4A7C15
_DRAW = 0xBF58476D1CE4E5B9 - (1 << 64)  # as int64: products wrap mod 2^64 like engine.sampler's
_MASK63 = (1 << 63) - 1


def batch_bucket(n: int) -> int:
    for b in BATCH_BUCKETS:
        if b >= n:
            return b
    raise ValueError(f"batch {n} exceeds the largest bucket {BATCH_BUCKETS[-1]}")


def seed_base(seed: int) -> int:
    """``seed * MIX`` as a wrapped int64, the per-request half of ``engine.sampler.step_seed``."""
    v = (seed * _MIX) & ((1 << 64) - 1)
    return v - (1 << 64) if v >= 1 << 63 else v


class GraphRunner:
    """Static decode buffers over a ``ModelRunner``'s slot cache, with captured replays on CUDA."""

    def __init__(self, model: CausalLM, max_batch: int, max_len: int,
                 use_graphs: bool | None = None) -> None:
        self.max_rows = batch_bucket(max_batch)
        self.runner = ModelRunner(model, self.max_rows, max_len)  # eager prefill, same cache
        self.decoder = StaticDecoder(model, self.runner.cache)
        dev = self.device = self.runner.device
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        n = self.max_rows
        vocab = self.runner._head.weight.shape[0]
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.pos = torch.full((n,), max_len, dtype=torch.int64, device=dev)
        self.states = torch.full((n,), -1, dtype=torch.int32, device=dev)
        self.temperature = torch.zeros(n, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(n, dtype=torch.int32, device=dev)
        self.top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.base = torch.zeros(n, dtype=torch.int64, device=dev)
        self.draws = torch.zeros(n, dtype=torch.int64, device=dev)
        self.logits = torch.zeros(n, vocab, dtype=torch.float32, device=dev)
        self.out = torch.zeros(3, n, dtype=torch.int64, device=dev)  # token, state after, miss
        self.out_host = torch.zeros(3, n, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._verify_bufs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._graphs: dict[tuple[object, ...], torch.cuda.CUDAGraph] = {}
        self._table_gen: tuple[int, int] | None = None
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.captures = 0  # graphs captured so far (a benchmark checks none happen while timing)
        # (rows, tokens per row, attended length) -> ms of a replay of that forward, timed when
        # captured (the forward graph is width 1): the step-time table of the batch verify width
        self.step_ms: dict[tuple[int, int, int], float] = {}
        self._step_times: dict[tuple[int, int | None, int], float | None] = {}  # step_time's answers

    @property
    def max_len(self) -> int:
        return self.runner.max_len

    def length_bucket(self, need: int) -> int:
        """Attended columns for a step whose longest live row has ``need`` tokens after it."""
        b = MIN_LENGTH_BUCKET
        while b < need:
            b *= 2
        return min(b, self.max_len)

    def step_time(self, rows: int, width: int, need: int) -> float | None:
        """Time of a verification forward of ``width`` tokens per row over ``rows`` rows against
        a plain step's forward, both measured in their buckets at the same attended length: the
        length bucket of ``need`` (the longest row's tokens after the step), else the measured
        one nearest to it; None until both were captured at one length (``Scheduler`` then uses
        its default model). Why the same length: a forward's time grows with what it attends,
        and a plain step timed at 64 columns against a verification at 2048 priced drafts out."""
        key = (batch_bucket(rows), next((w for w in WIDTH_BUCKETS if w >= width), None), self.length_bucket(need))
        if key not in self._step_times:  # (the batch width asks for every width, every step)
            bucket, tokens, target = key
            both = [n for (r, w, n) in self.step_ms if r == bucket and w == tokens and (bucket, 1, n) in self.step_ms]
            ratio = None
            if tokens is not None and both:
                n = min(both, key=lambda n: (abs(n.bit_length() - target.bit_length()), n))
                ratio = self.step_ms[(bucket, tokens, n)] / self.step_ms[(bucket, 1, n)]
            self._step_times[key] = ratio
        return self._step_times[key]

    # -- the step bodies (eager on CPU, captured on CUDA) -------------------------------------
    def _forward(self, rows: int, length: int) -> None:
        self.logits[:rows].copy_(self.decoder.step(self.ids[:rows], self.pos[:rows], length))

    def _sample(self, rows: int, mode: str, table: StateTable | None, filtered: bool) -> None:
        sl = slice(0, rows)
        seeds = (self.base[sl] ^ (self.draws[sl] * _DRAW + 1)) & _MASK63
        logits = self.logits[sl]
        params: dict[str, Any] = dict(temperature=self.temperature[sl], seeds=seeds)
        if filtered:
            params.update(top_k=self.top_k[sl], top_p=self.top_p[sl])
        if mode == "table":
            assert table is not None
            tok, nxt, miss, _ = constrained_step(logits, table, self.states[sl], **params)
            self.states[sl].copy_(nxt)
            self.out[2, sl].copy_(miss)
        else:
            tok, _ = sample(logits, **params)
            self.out[2, sl].zero_()
        self.out[0, sl].copy_(tok)
        self.out[1, sl].copy_(self.states[sl])
        self.ids[sl].copy_(tok.clamp(min=0))
        self.pos[sl] += 1
        self.draws[sl] += 1

    # -- public steps -------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, rows: int, length: int) -> None:
        """Logits of one decode step for rows ``0..rows-1`` (a bucket) into ``self.logits``."""
        self._run(("fwd", rows, length), lambda: self._forward(rows, length))

    @torch.inference_mode()
    def tokens_logits(self, ids: list[int], pos: list[int], slots: list[int], length: int) -> torch.Tensor:
        """Logits (len(ids), V) of every token of a several-tokens-per-row eager pass (token j to
        slot ``slots[j]`` at column ``pos[j]``): rows wider than ``verify_forward``'s graphs."""
        dev = self.device
        ids_t, pos_t, slots_t = to_device([ids, pos, slots], torch.int64, dev)
        return self.decoder.step(ids_t, pos_t, length, slots_t)

    @torch.inference_mode()
    def verify_forward(self, tokens: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Logits (rows, W, V) of ``tokens[r]`` appended to slot r at ``starts[r]`` ([r, j]: after
        its j-th token; W >= the longest row), one pass replayed from a graph per (rows, W,
        length) bucket (``StaticDecoder.step(width=W)``): speculative verification. Rows past
        the longest width bucket run eagerly."""
        n, need = len(tokens), max(len(t) for t in tokens)
        length = self.length_bucket(max(s + len(t) for s, t in zip(starts, tokens)))
        width = next((w for w in WIDTH_BUCKETS if w >= need), None)
        if width is None:
            flat = [(r, j) for r, t in enumerate(tokens) for j in range(len(t))]
            logits = self.tokens_logits([tokens[r][j] for r, j in flat], [starts[r] + j for r, j in flat],
                                        [r for r, _ in flat], length)
            out = logits.new_zeros((n, need, logits.shape[-1]))
            out[torch.as_tensor([r for r, _ in flat]), torch.as_tensor([j for _, j in flat])] = logits
            return out
        rows = batch_bucket(n)
        bufs = self._verify_bufs.get((rows, width))
        if bufs is None:
            vocab = self.logits.shape[-1]
            bufs = self._verify_bufs[(rows, width)] = (
                torch.zeros(width * rows, dtype=torch.int64, device=self.device),
                torch.full((width * rows,), self.max_len, dtype=torch.int64, device=self.device),
                torch.zeros(width * rows, vocab, dtype=torch.float32, device=self.device))
        ids, pos, logits = bufs
        host = np.zeros((2, width, rows), dtype=np.int64)
        host[1] = self.max_len  # padding: the scratch column
        for r, (t, s) in enumerate(zip(tokens, starts)):
            host[0, : len(t), r] = t
            host[1, : len(t), r] = np.arange(s, s + len(t))
        staged = to_device(torch.from_numpy(host.reshape(2, -1)), torch.int64, self.device)
        ids.copy_(staged[0])
        pos.copy_(staged[1])

        def body() -> None:
            logits.copy_(self.decoder.step(ids, pos, length, width=width))

        self._run(("verify", rows, width, length), body)
        return logits.view(width, rows, -1)[:need, :n].transpose(0, 1)

    @torch.inference_mode()
    def sample(self, rows: int, mode: str, table: StateTable | None = None, filtered: bool = False,
               states: tuple[list[int], list[int]] | None = None) -> None:
        """Sample rows ``0..rows-1`` from ``self.logits``; outputs in ``self.out``, inputs advanced.
        ``states``: (rows, states) to write into the rows' constraint states first, riding in the
        table's flush of its staged inserts (one upload for both; so they need the ``table``)."""
        self._check_table(table)
        if table is not None:  # a replayed graph reads the table's tensors without asking the table
            table.flush(None if states is None else (self.states, *states))
        else:
            assert states is None or not states[0], "state patches ride in the table's flush"
        self._run(self._sample_key(rows, mode, filtered), lambda: self._sample(rows, mode, table, filtered))

    @staticmethod
    def _sample_key(rows: int, mode: str, filtered: bool) -> tuple[object, ...]:
        return ("table" if mode == "table" else "sample", rows, filtered)

    def _check_table(self, table: StateTable | None) -> None:
        if table is not None and (id(table), table.generation) != self._table_gen:
            # The table reallocated (grew): graphs holding its old tensors must be captured again.
            self._graphs = {k: g for k, g in self._graphs.items() if k[0] != "table"}
            self._table_gen = (id(table), table.generation)

    @torch.inference_mode()
    def capture_sample(self, rows: int, mode: str, table: StateTable | None = None, filtered: bool = False) -> None:
        """Capture the sample graph of ``rows`` for ``mode`` ahead of time (the table must already
        be reserved to its final size: a table that grows invalidates its graphs)."""
        if not self.use_graphs:
            return
        self._check_table(table)
        if table is not None:
            table.flush()  # (nothing may upload inside a capture)
        key = self._sample_key(rows, mode, filtered)
        if key not in self._graphs:
            self._graphs[key] = self._capture(lambda: self._sample(rows, mode, table, filtered))

    @torch.inference_mode()
    def capture(self, rows: int, lengths: list[int]) -> None:
        """Capture the forward graphs of ``rows`` for each attended length ahead of time, so no
        capture happens inside a timed run. (The warm-up writes KV of rows at their current
        positions: call it between runs, not while sequences are live.)"""
        if not self.use_graphs:
            return
        for length in lengths:
            key = ("fwd", rows, length)
            if key not in self._graphs:
                self._graphs[key] = self._capture(lambda length=length: self._forward(rows, length))
                self._timed_replay(key)

    def fetch(self, rows: int) -> torch.Tensor:
        """(3, rows) int64 on the host: sampled token, state after, miss flag. Synchronises."""
        self.out_host[:, :rows].copy_(self.out[:, :rows], non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        return self.out_host[:, :rows]

    def _run(self, key: tuple, fn) -> None:
        if not self.use_graphs:
            fn()
            return
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._capture(fn)
            if key[0] in ("fwd", "verify"):
                self._timed_replay(key)
                return
        graph.replay()

    def _timed_replay(self, key: tuple) -> None:
        """Replay a forward graph three times, the fastest timed into ``step_ms`` (a first replay
        can be slow; one synchronisation per graph, at capture, never later). A forward graph
        only reads the step inputs and writes the same KV columns and logits each time, so
        replaying it is what the step does."""
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._graphs[key].replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end))
        rows, width, length = (key[1], 1, key[2]) if key[0] == "fwd" else key[1:]
        self.step_ms[(rows, width, length)] = best
        self._step_times.clear()

    def _capture(self, fn) -> torch.cuda.CUDAGraph:
        """Warm up (Triton JIT, cuBLAS plans) on a side stream, then capture. The warm-up really
        runs, so the step inputs it advances are restored afterwards; its KV writes are the same
        ones the next real step makes."""
        saved = [t.clone() for t in (self.ids, self.pos, self.states, self.draws, self.out)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        for t, s in zip((self.ids, self.pos, self.states, self.draws, self.out), saved):
            t.copy_(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            fn()
        self.captures += 1
        logger.debug("captured decode graph %s", fn)
        return graph

    # -- slot compaction ----------------------------------------------------------------------
    @torch.inference_mode()
    def move_rows(self, moves: list[tuple[int, int, int]], live: int) -> None:
        """Move rows ``src -> dst`` (buffers and the first ``length`` columns of their KV slots);
        rows ``live..`` are parked afterwards (scratch column, unconstrained)."""
        if moves:
            src, dst = to_device([[m[0] for m in moves], [m[1] for m in moves]], torch.int64, self.device)
            for buf in (self.ids, self.pos, self.states, self.temperature, self.top_k, self.top_p,
                        self.base, self.draws):
                buf[dst] = buf[src]
            self.runner.cache.move_slots(moves)
        self.pos[live:] = self.max_len
        self.states[live:] = -1
