"""Continuous batching, the one scheduler every path goes through: requests join and leave
between decode steps, each with its own constraint, sampling parameters, stop ids and budget.

The scheduler owns everything that is about *requests*: the checks, admission, per-row host
matchers (the constraint's authority), forced text, the budget-aware close, stop logic, failure
isolation, results and slot compaction. How a step's tokens are produced is a ``StepBackend``'s
business: ``runner.EagerStep`` (transformers' own forward, host masks; CPU and unsupported
models) or ``graph_loop.GraphStep`` (CUDA-graph replay of the static decoder, masks from the GPU
state table; the default on CUDA). One step = the backend forwards each row's pending tokens
(one sampled token plus any forced ones; whole prompts for new rows) and samples under the
masks; the scheduler then accepts each token into its row's matcher, appends forced text,
retires finished rows and compacts the slots.

Forced text: when the constraint admits exactly one continuation (``find_jump_forward_bytes``),
we tokenize it the way the tokenizer would (canonically) and append the tokens without a forward
pass each. The last forced token is left for the model to pick under the mask, because BPE may
merge it with whatever follows (``": "`` + ``"J``...): forcing it could split text in a way the
model never saw in training.

Failure isolation: a row whose mask allows nothing, or whose matcher refuses the token its mask
allowed, ends alone with ``finish_reason="error"`` (logged); the batch goes on. So does a
request that cannot run at all (empty prompt, prompt longer than the model's context).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from constrain import Vocabulary, allocate_token_bitmask
from constrain.engine.types import GenerationRequest, GenerationResult

logger = logging.getLogger("constrain")

# The budget-aware close needs a row's own mask once its tokens left come within this many of
# the document's shortest completion (in bytes, one per token at worst); before that the plain
# mask is the same, and on the GPU path it comes from the state table with no host work.
BUDGET_MARGIN = 32


@dataclass(eq=False)
class Row:
    """One admitted request: its matcher, KV slot, tokens and where it stands."""

    rid: int
    request: GenerationRequest
    matcher: Any
    seed: int
    budget: int  # tokens it may emit (max_tokens, cut to what the model's context leaves)
    pending: list[int]  # tokens to forward next step (the prompt, then sampled + forced)
    slot: int = -1
    length: int = 0  # tokens already in the KV cache
    generated: list[int] = field(default_factory=list)
    forced: int = 0
    forced_now: int = 0  # forced tokens appended by the last step
    draws: int = 0
    finish_reason: str | None = None
    error: str | None = None


class StepBackend(Protocol):
    """Produces one step's tokens for rows ``0..len(batch)-1`` (row i = KV slot i)."""

    @property
    def max_rows(self) -> int: ...

    @property
    def max_len(self) -> int: ...

    def step(self, batch: list[Row], n_old: int, scheduler: Scheduler) -> list[int]:
        """Forward each row's ``pending`` tokens (rows from ``n_old`` on are new: their prompt),
        sample one token per row under its constraint (``scheduler.fill_mask`` for host masks);
        -1 where a mask allowed nothing."""
        ...

    def sync(self, batch: list[Row]) -> None:
        """After the scheduler advanced the rows' matchers (forced text included)."""
        ...

    def move_rows(self, moves: list[tuple[int, int, int]], live: int) -> None:
        """Compaction: ``(src, dst, length)`` slot moves; rows ``live..`` are free afterwards."""
        ...


class Scheduler:
    """Owns the waiting queue and the running batch of one ``StepBackend``.

    ``add`` may be called at any time, also between ``step`` calls while others are running.
    ``context_len`` (the model's context) bounds prompt + output; ``encode`` tokenizes forced text.
    """

    def __init__(self, backend: StepBackend, vocab: Vocabulary, encode: Callable[[str], list[int]],
                 max_prefill_tokens: int = 8192, context_len: int | None = None) -> None:
        self.backend = backend
        self.vocab = vocab
        self.encode = encode
        self.max_prefill_tokens = max_prefill_tokens
        self.context_len = context_len
        self.waiting: deque[Row] = deque()
        self.running: list[Row] = []
        self._rejected: list[tuple[int, GenerationResult]] = []
        self._next_id = 0
        self._scratch = allocate_token_bitmask(1, vocab.vocab_size)
        self._stop_set = set(vocab.eos_token_ids)
        self._forced_cache: dict[tuple[int, int], list[int]] = {}

    # -- queue -------------------------------------------------------------------------------
    def add(self, request: GenerationRequest) -> int:
        """Queue a request; returns its id (results are reported with it). A request that cannot
        run gets an error result at the next ``step``, without affecting the others."""
        rid = self._next_id
        self._next_id += 1
        n = len(request.prompt_ids)
        budget = request.max_tokens
        if self.context_len is not None:
            budget = min(budget, self.context_len - n)
        problem = None
        if n == 0:
            problem = "prompt must contain at least one token"
        elif self.context_len is not None and n >= self.context_len:
            problem = (f"prompt of {n} tokens does not fit the model's context of {self.context_len} tokens "
                       "(it leaves no room for output): shorten the prompt")
        elif n + budget > self.backend.max_len:
            problem = (f"prompt ({n}) + max_tokens ({budget}) exceeds the KV cache length "
                       f"{self.backend.max_len}")
        if problem is not None:
            logger.warning("request %d: %s", rid, problem)
            self._rejected.append((rid, GenerationResult("", [], "error", n, error=problem,
                                                         constrained=request.grammar is not None)))
            return rid
        matcher = request.matcher
        if matcher is None and request.grammar is not None:
            matcher = request.grammar.matcher()
        row = Row(rid, request, matcher, request.sampling.resolved_seed(), budget, list(request.prompt_ids))
        self._force(row)
        self.waiting.append(row)
        return rid

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._rejected)

    # -- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[tuple[int, GenerationResult]]:
        """Run one decode step for every running sequence (admitting waiting ones first)."""
        done, self._rejected = self._rejected, []
        old = self.running
        new: list[Row] = []
        budget = self.max_prefill_tokens
        while self.waiting and len(old) + len(new) < self.backend.max_rows:
            cand = self.waiting[0]
            if new and len(cand.pending) > budget:
                break
            budget -= len(cand.pending)
            new.append(self.waiting.popleft())
        if not old and not new:
            return done
        for i, s in enumerate(new):
            s.slot = len(old) + i
        batch = old + new
        tokens = self.backend.step(batch, len(old), self)
        for s, t in zip(batch, tokens):
            s.length += len(s.pending)
            s.pending = []
            self._advance(s, int(t))
        self.backend.sync(batch)
        self.running = batch
        return done + self._retire()

    # -- constraint, shared by every backend --------------------------------------------------
    def budget_left(self, s: Row) -> int | None:
        """Tokens left when the budget-aware close must shape ``s``'s mask, else None."""
        if not s.request.budget_close or s.request.grammar is None:
            return None
        left = s.budget - len(s.generated)
        # Beyond the margin the close is not consulted (a cheap test: one token would have to add
        # over BUDGET_MARGIN bytes to the shortest completion); within it the matcher answers
        # exactly, so rows whose every next state still fits keep the plain (GPU table) mask.
        if left - 2 >= s.matcher.min_completion_bytes() + BUDGET_MARGIN:
            return None
        return left if s.matcher.budget_binds(left) else None

    def fill_mask(self, s: Row, bitmask: torch.Tensor, row: int) -> None:
        """``s``'s matcher's mask into ``bitmask`` row ``row``, budget-aware near the end.

        When even the close is impossible (a budget smaller than the shortest document) the
        budget mask is empty: the plain mask is used and the request ends with "length".
        """
        m = s.matcher
        left = self.budget_left(s)
        if left is None:
            m.fill_next_token_bitmask(bitmask, row)
            return
        m.fill_next_token_bitmask(bitmask, row, tokens_left=left)
        if not bool(bitmask[row].any()):
            m.fill_next_token_bitmask(bitmask, row)

    def _advance(self, s: Row, token: int) -> None:
        s.draws += 1
        s.forced_now = 0
        req, m = s.request, s.matcher
        if m is not None:
            if token < 0:
                self._fail(s, "the constraint allows no token here (empty mask)")
                return
            if not m.accept_token(token):
                self._fail(s, f"the constraint refused token {token} that its mask allowed")
                return
            if m.is_terminated():
                s.finish_reason = "stop"
                return
        elif token in req.stop_token_ids:
            s.finish_reason = "stop"
            return
        s.generated.append(token)
        s.pending = [token]
        self._force(s)
        if len(s.generated) >= s.budget:
            # Out of budget. If the document is complete and only a stop token may follow, the
            # output is whole: report "stop". Otherwise "length": never presented as valid.
            s.finish_reason = "stop" if self._only_stop_allowed(s) else "length"

    def _fail(self, s: Row, message: str) -> None:
        s.finish_reason = "error"
        s.error = f"request {s.rid}: {message} after {len(s.generated)} tokens (a bug, please report)"
        logger.error("%s; the rest of the batch goes on", s.error)

    def _force(self, s: Row) -> None:
        """Append the forced continuation's canonical tokens (all but the last), accepted into
        the matcher, within the budget."""
        req, m = s.request, s.matcher
        if req.grammar is None or not req.force_tokens or s.budget - len(s.generated) <= 1:
            return
        key = (id(req.grammar), m.state)
        ids = self._forced_cache.get(key)
        if ids is None:
            ids = self._forced_cache[key] = self._forced_ids(m.find_jump_forward_bytes())
        n = 0
        for t in ids[: s.budget - len(s.generated) - 1]:
            if not m.accept_token(t):
                break
            n += 1
        s.generated.extend(ids[:n])
        s.pending.extend(ids[:n])
        s.forced += n
        s.forced_now = n

    def _forced_ids(self, data: bytes) -> list[int]:
        """Canonical tokens of forced bytes, all but the last; none if they do not spell it."""
        text = data.decode("utf-8", "ignore")
        ids = self.encode(text) if text else []
        tb = self.vocab.token_bytes
        if len(ids) < 2 or any(i >= len(tb) or tb[i] is None for i in ids):
            return []
        if b"".join(tb[i] or b"" for i in ids) != text.encode("utf-8"):  # e.g. a SentencePiece dummy prefix
            return []
        return ids[:-1]

    def _only_stop_allowed(self, s: Row) -> bool:
        """Whether the document is complete and nothing but a stop token may follow."""
        m = s.matcher
        if s.request.grammar is None or not m.is_accepting():
            return False
        m.fill_next_token_bitmask(self._scratch, 0)
        words = self._scratch[0].numpy().view(np.uint32).copy()
        for e in self._stop_set:
            if e < self.vocab.vocab_size:
                words[e >> 5] &= np.uint32(~(1 << (e & 31)) & 0xFFFFFFFF)
        return not bool(words.any())

    # -- results -----------------------------------------------------------------------------
    def _retire(self) -> list[tuple[int, GenerationResult]]:
        done = [s for s in self.running if s.finish_reason is not None]
        if not done:
            return []
        alive = [s for s in self.running if s.finish_reason is None]
        n = len(alive)
        holes = sorted(s.slot for s in done if s.slot < n)
        movers = sorted((s for s in alive if s.slot >= n), key=lambda s: s.slot)
        moves = []
        for s, hole in zip(movers, holes):  # swap-with-last keeps active slots in 0..n-1
            moves.append((s.slot, hole, s.length))
            s.slot = hole
        self.backend.move_rows(moves, n)
        self.running = sorted(alive, key=lambda s: s.slot)
        return [(s.rid, self._result(s)) for s in done]

    def _result(self, s: Row) -> GenerationResult:
        tb = self.vocab.token_bytes
        raw = b"".join(tb[t] or b"" if t < len(tb) else b"" for t in s.generated)
        return GenerationResult(
            text=raw.decode("utf-8", "replace"),
            token_ids=list(s.generated),
            finish_reason=s.finish_reason,  # type: ignore[arg-type]
            prompt_tokens=len(s.request.prompt_ids),
            forced_tokens=s.forced,
            constrained=s.matcher is not None,
            error=s.error,
        )
