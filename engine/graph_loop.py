"""Continuous batching over graph-replayed decode steps (``GraphRunner``): the fast path.

Same interface as ``Scheduler`` (``add`` / ``step`` / ``has_work``, so ``run_requests`` drives
either), different division of work:

- ``mode="table"`` (constrain): constraint states live on the GPU (``StateCache`` over a
  ``kernels.StateTable``). The captured step gathers each row's mask by its state, samples and
  advances the state on the GPU. The host reads back (token, state, miss) once per step and only
  works on misses (a state or transition seen for the first time: computed by constrain,
  stored, never missed again; a state's transitions are loaded in bulk on its second miss, see
  ``StateCache``) and on finished rows. A miss is resolved during the *next* step's forward
  (which reads tokens, not states) and patched in before that step's sample, so host work for
  new states overlaps the GPU instead of stalling it.
- ``mode="host"``: per-row matcher objects fill a bitmask on the host each step, while the
  forward graph runs; the mask goes to the GPU and the captured sampler applies it. This is how
  xgrammar and llguidance are driven in the benchmark (and constrain's own ``Matcher``, for a
  like-for-like comparison); a matcher has ``fill(row)``, ``accept(token)``, ``accept_eos(token)``.
- ``mode="none"``: unconstrained sampling only (every request must be unconstrained).

Differences from the eager ``Scheduler`` (requests that need them should use it): no forced-text
jump-forward (forced tokens are sampled one per step under a one-token mask), no budget-aware
close, no top-k/top-p (greedy and temperature sampling only). Greedy and seeded outputs equal the
eager path's with ``force_tokens=False, budget_close=False`` (tests check this on the CPU).

Finished rows stay in the batch (their slots run along, ignored) until the live rows fit a
smaller batch bucket; then the live rows are compacted to the front, so the per-step work tracks
the live batch within 2x without moving KV every step.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from constrain import Matcher, Vocabulary
from constrain.engine.graph_runner import BATCH_BUCKETS, GraphRunner, batch_bucket, seed_base
from constrain.engine.state_cache import StateCache
from constrain.engine.types import GenerationRequest, GenerationResult

logger = logging.getLogger("constrain")


class HostMatcher(Protocol):
    def fill(self, row: torch.Tensor) -> None: ...  # write the (1, words) int32 mask row
    def accept(self, token: int) -> bool: ...
    def accept_eos(self, token: int) -> bool: ...  # True when the matcher is then terminated


class ConstrainHostMatcher:
    """constrain's ``Matcher`` behind the ``HostMatcher`` verbs."""

    def __init__(self, matcher: Matcher) -> None:
        self.m = matcher

    def fill(self, row: torch.Tensor) -> None:
        self.m.fill_next_token_bitmask(row, 0)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def accept_eos(self, token: int) -> bool:
        return bool(self.m.accept_token(token)) and self.m.is_terminated()


@dataclass(eq=False)
class _Row:
    rid: int
    request: GenerationRequest
    host: HostMatcher | None
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class GraphScheduler:
    """Continuous batching on a ``GraphRunner``; see the module docstring for the modes."""

    def __init__(self, runner: GraphRunner, vocab: Vocabulary, mode: str = "table",
                 max_prefill_tokens: int = 8192, states: int = 4096, transitions: int = 1 << 18) -> None:
        if mode not in ("table", "host", "none"):
            raise ValueError(f"mode must be 'table', 'host' or 'none', got {mode!r}")
        self.runner = runner
        self.vocab = vocab
        self.mode = mode
        self.max_prefill_tokens = max_prefill_tokens
        self.words = runner.masks.shape[1]
        self.cache = StateCache(self.words, runner.device, states, transitions) if mode == "table" else None
        self.waiting: deque[_Row] = deque()
        self.rows: list[_Row] = []  # row i = KV slot i; finished rows stay until compaction
        self._eos = set(int(t) for t in vocab.eos_token_ids)
        pin = runner.device.type == "cuda"
        self._host_masks = torch.full(runner.masks.shape, -1, dtype=torch.int32, pin_memory=pin)
        self._state_of: list[int] = []  # table mode: each row's current state (host mirror)
        self._pending: list[tuple[int, int, int]] = []  # table mode: (row, state, token) misses to resolve
        self._next_id = 0
        self.steps = 0

    # -- queue --------------------------------------------------------------------------------
    def add(self, request: GenerationRequest, host_matcher: HostMatcher | None = None) -> int:
        """Queue a request. In ``host`` mode a constrained request uses ``host_matcher`` (default:
        constrain's matcher of ``request.grammar``)."""
        p = request.sampling
        if p.temperature > 0 and (p.top_k > 0 or p.top_p < 1):
            raise ValueError("the graph decode path samples greedily or with temperature only; "
                             "use the eager Scheduler for top-k / top-p")
        if len(request.prompt_ids) + request.max_tokens > self.runner.max_len:
            raise ValueError(f"prompt + max_tokens exceeds the KV cache length {self.runner.max_len}")
        if not request.prompt_ids:
            raise ValueError("prompt must contain at least one token")
        constrained = request.grammar is not None or host_matcher is not None
        if constrained and self.mode == "none":
            raise ValueError("mode 'none' runs unconstrained requests only")
        if self.mode == "host" and host_matcher is None and request.grammar is not None:
            host_matcher = ConstrainHostMatcher(request.grammar.matcher())
        rid = self._next_id
        self._next_id += 1
        self.waiting.append(_Row(rid, request, host_matcher))
        return rid

    def capture(self, states: int = 0, transitions: int = 0) -> None:
        """Capture this mode's sample graph for every batch bucket ahead of time, after
        reserving the state table (``states`` rows, ``transitions`` hash entries) so that it does
        not reallocate later, which would force the table graphs to be captured again."""
        table = self.cache.table if self.cache is not None else None
        if table is not None:
            table.reserve(states, transitions)
        for b in BATCH_BUCKETS:
            if b <= self.runner.max_rows:
                self.runner.capture_sample(b, self.mode, table)

    def has_work(self) -> bool:
        return bool(self.waiting) or any(r.finish_reason is None for r in self.rows)

    # -- one step -----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[tuple[int, GenerationResult]]:
        """Admit waiting requests (eager prefill + first token) or run one replayed decode step."""
        self._compact()
        if self.waiting and len(self.rows) < self.runner.max_rows:
            return self._admit()
        n = len(self.rows)
        if n == 0:
            return []
        b = batch_bucket(n)
        run = self.runner
        need = 1 + max(len(r.request.prompt_ids) + len(r.generated) for r in self.rows if r.finish_reason is None)
        run.forward(b, run.length_bucket(need))
        # Host work for the constraint runs while the forward computes: it does not read states.
        if self.mode == "host":
            self._fill_host_masks(0, n)
        self._resolve_pending()
        run.sample(b, self.mode, self.cache.table if self.cache else None)
        self.steps += 1
        return self._process(0, n, run.fetch(n).numpy())

    def _admit(self) -> list[tuple[int, GenerationResult]]:
        run = self.runner
        lo = len(self.rows)
        new: list[_Row] = []
        budget = self.max_prefill_tokens
        while self.waiting and lo + len(new) < run.max_rows:
            cand = self.waiting[0]
            if new and len(cand.request.prompt_ids) > budget:
                break
            budget -= len(cand.request.prompt_ids)
            new.append(self.waiting.popleft())
        hi = lo + len(new)
        prompts = [r.request.prompt_ids for r in new]
        run.logits[lo:hi] = run.runner.extend(lo, prompts, [0] * len(new))
        dev = run.device
        rows = slice(lo, hi)
        run.pos[rows] = torch.as_tensor([len(p) - 1 for p in prompts], device=dev)
        run.temperature[rows] = torch.as_tensor([r.request.sampling.temperature for r in new], device=dev)
        run.base[rows] = torch.as_tensor([seed_base(r.request.sampling.resolved_seed()) for r in new], device=dev)
        run.draws[rows] = 0
        if self.cache is not None:
            st = [self.cache.initial(r.request.grammar) if r.request.grammar is not None else -1 for r in new]
            run.states[rows] = torch.as_tensor(st, dtype=torch.int32, device=dev)
            self._state_of.extend(st)
        self.rows.extend(new)
        if self.mode == "host":
            self._fill_host_masks(lo, hi)
        run.sample_rows(lo, hi, self.mode, self.cache.table if self.cache else None)
        out = run.out[:, lo:hi].cpu().numpy()
        return self._process(lo, hi, out)

    def _fill_host_masks(self, lo: int, hi: int) -> None:
        """Each live constrained row's matcher writes its mask row; copied to the GPU in one go.
        Runs while the forward (already launched) computes on the GPU."""
        masks = self._host_masks
        index = [-1] * (hi - lo)
        for i in range(lo, hi):
            r = self.rows[i]
            if r.host is not None and r.finish_reason is None:
                r.host.fill(masks[i:i + 1])
                index[i - lo] = i
        index += [-1] * (self.runner.max_rows - hi)  # padding rows: unconstrained
        run = self.runner
        run.masks[lo:hi].copy_(masks[lo:hi], non_blocking=True)
        run.mask_index[lo:].copy_(torch.as_tensor(index, dtype=torch.int32), non_blocking=True)

    # -- results ------------------------------------------------------------------------------
    def _process(self, lo: int, hi: int, out: np.ndarray) -> list[tuple[int, GenerationResult]]:
        """Account the sampled tokens of rows ``lo..hi-1``: misses, stops, budgets."""
        tokens, states, miss = out[0], out[1], out[2]
        done: list[tuple[int, GenerationResult]] = []
        patch_rows: list[int] = []
        patch_states: list[int] = []
        if self.mode == "table":
            idx = [int(i) for i in np.nonzero(miss)[0] if self.rows[lo + i].finish_reason is None]
            resolve = [i for i in idx if int(tokens[i]) not in self._eos]
            if resolve:
                # Resolved during the next forward (``step``), except for rows that end here by
                # their budget: their finish reason needs the state now.
                prev = self._prev_states(lo, resolve)
                now = []
                for i, p in zip(resolve, prev):
                    r = self.rows[lo + i]
                    if len(r.generated) + 1 >= r.request.max_tokens:
                        now.append((i, p))
                    else:
                        self._pending.append((lo + i, p, int(tokens[i])))
                if now:
                    nxt = self._resolve([lo + i for i, _ in now], [p for _, p in now],
                                        [int(tokens[i]) for i, _ in now])
                    for (i, _), s in zip(now, nxt):
                        states[i] = s
                        patch_rows.append(lo + i)
                        patch_states.append(s)
        for i in range(hi - lo):
            r = self.rows[lo + i]
            if r.finish_reason is not None:
                continue
            tok = int(tokens[i])
            req = r.request
            if tok < 0:
                raise RuntimeError(f"request {r.rid}: the constraint allows no token (a bug, please report)")
            if r.host is not None:
                if tok in self._eos:
                    if not r.host.accept_eos(tok):
                        raise RuntimeError(f"request {r.rid}: matcher refused the stop token it allowed")
                    r.finish_reason = "stop"
                elif not r.host.accept(tok):
                    raise RuntimeError(f"request {r.rid}: matcher refused token {tok} it allowed")
            elif req.grammar is not None:
                if tok in self._eos:
                    r.finish_reason = "stop"
            elif tok in req.stop_token_ids:
                r.finish_reason = "stop"
            if r.finish_reason is None:
                r.generated.append(tok)
                if len(r.generated) >= req.max_tokens:
                    r.finish_reason = self._length_reason(r, int(states[i]))
            if r.finish_reason is not None:
                done.append((r.rid, self._result(r)))
        if self.cache is not None:
            self._state_of[lo:hi] = [int(x) for x in states]
        if patch_rows:
            dev = self.runner.device
            self.runner.states[torch.as_tensor(patch_rows, device=dev)] = torch.as_tensor(
                patch_states, dtype=torch.int32, device=dev)
        return done

    def _resolve(self, rows: list[int], states: list[int], tokens: list[int]) -> list[int]:
        nxt = self.cache.resolve(states, tokens)
        for row, tok, s in zip(rows, tokens, nxt):
            if s < 0:
                raise RuntimeError(f"row {row}: token {tok} not allowed by its "
                                   "constraint (mask and grammar disagree: a bug, please report)")
        return nxt

    def _resolve_pending(self) -> None:
        """Next states of last step's misses, stored in the table and patched into the rows
        (the GPU left those rows at -1). Called while the forward runs, before the sample reads them."""
        if not self._pending:
            return
        rows, states, tokens = zip(*self._pending)
        self._pending = []
        nxt = self._resolve(list(rows), list(states), list(tokens))
        for row, s in zip(rows, nxt):
            self._state_of[row] = s
        dev = self.runner.device
        self.runner.states[torch.as_tensor(rows, device=dev)] = torch.as_tensor(nxt, dtype=torch.int32, device=dev)

    def _prev_states(self, lo: int, idx: list[int]) -> list[int]:
        """Host copies of the rows' states before this step (the GPU already advanced them)."""
        return [self._state_of[lo + i] for i in idx]

    def _length_reason(self, r: _Row, state: int) -> str:
        """"stop" when the budget ran out exactly at a complete document that only a stop token
        may follow (as the eager scheduler reports it), else "length"."""
        if self.cache is None or r.request.grammar is None or state < 0:
            return "length"
        return "stop" if self.cache.only_stop(state) else "length"

    def _result(self, r: _Row) -> GenerationResult:
        tb = self.vocab.token_bytes
        raw = b"".join(tb[t] if t < len(tb) and tb[t] is not None else b"" for t in r.generated)
        return GenerationResult(text=raw.decode("utf-8", "replace"), token_ids=list(r.generated),
                                finish_reason=r.finish_reason,  # type: ignore[arg-type]
                                prompt_tokens=len(r.request.prompt_ids), forced_tokens=0,
                                constrained=r.request.grammar is not None or r.host is not None)

    def _compact(self) -> None:
        """Drop finished rows once the live ones fit a smaller bucket (or none are left)."""
        n = len(self.rows)
        if n == 0:
            return
        keep = [i for i, r in enumerate(self.rows) if r.finish_reason is None]
        if len(keep) == n or (keep and not self.waiting and batch_bucket(len(keep)) >= batch_bucket(n)):
            return
        length = min(self.runner.max_len, 1 + max((len(self.rows[i].request.prompt_ids) + len(self.rows[i].generated)
                                                   for i in keep), default=0))
        self._resolve_pending()  # pending misses name rows by their index before the move
        self.runner.compact(keep, length)
        if self.cache is not None:
            self._state_of = [self._state_of[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]

