"""Continuous batching: requests join and leave between decode steps, each with its own
constraint, sampling parameters, stop ids and token budget.

One step = (1) forward the tokens each running sequence appended last step (one sampled token
plus any forced ones) and prefill newly admitted prompts, (2) fill one bitmask row per
constrained sequence from its ``Matcher``, (3) sample under the masks (fused kernel), (4) accept into the
matchers, extend with forced text, retire finished sequences and compact the KV slots.

Forced text: when the constraint admits exactly one continuation (``find_jump_forward_bytes``),
we tokenize it the way the tokenizer would (canonically) and append the tokens without a forward
pass each. The last forced token is left for the model to pick under the mask, because BPE may
merge it with whatever follows (``": "`` + ``"J``...): forcing it could split text in a way the
model never saw in training.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from constrain import Matcher, Vocabulary, allocate_token_bitmask
from constrain.engine.runner import ModelRunner
from constrain.engine.sampler import sample
from constrain.engine.types import GenerationRequest, GenerationResult

logger = logging.getLogger("constrain")


@dataclass(eq=False)
class _Sequence:
    rid: int
    request: GenerationRequest
    matcher: Matcher | None
    seed: int
    pending: list[int]
    slot: int = -1
    length: int = 0  # tokens already in the KV cache
    generated: list[int] = field(default_factory=list)
    forced: int = 0
    draws: int = 0
    finish_reason: str | None = None


class Scheduler:
    """Owns the waiting queue and the running batch of one ``ModelRunner``.

    ``add`` may be called at any time, also between ``step`` calls while others are running.
    """

    def __init__(
        self,
        runner: ModelRunner,
        vocab: Vocabulary,
        encode: Callable[[str], list[int]],
        max_prefill_tokens: int = 8192,
    ) -> None:
        self.runner = runner
        self.vocab = vocab
        self.encode = encode
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[_Sequence] = deque()
        self.running: list[_Sequence] = []
        self._next_id = 0
        self._bitmask = allocate_token_bitmask(runner.max_slots, vocab.vocab_size)
        if runner.device.type == "cuda":
            self._bitmask = self._bitmask.pin_memory()
        self._scratch = allocate_token_bitmask(1, vocab.vocab_size)
        self._stop_set = set(vocab.eos_token_ids)

    # -- queue -------------------------------------------------------------------------------
    def add(self, request: GenerationRequest) -> int:
        """Queue a request; returns its id (results are reported with it)."""
        need = len(request.prompt_ids) + request.max_tokens
        if not request.prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if need > self.runner.max_len:
            raise ValueError(f"prompt ({len(request.prompt_ids)}) + max_tokens ({request.max_tokens}) "
                             f"exceeds the KV cache length {self.runner.max_len}")
        rid = self._next_id
        self._next_id += 1
        matcher = request.grammar.matcher() if request.grammar is not None else None
        seq = _Sequence(rid, request, matcher, request.sampling.resolved_seed(), list(request.prompt_ids))
        if matcher is not None and request.force_tokens:
            forced = self._forced_tokens(matcher, request.max_tokens)
            seq.generated.extend(forced)
            seq.pending.extend(forced)
            seq.forced += len(forced)
        self.waiting.append(seq)
        return rid

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[tuple[int, GenerationResult]]:
        """Run one decode step for every running sequence (admitting waiting ones first)."""
        old = self.running
        new: list[_Sequence] = []
        budget = self.max_prefill_tokens
        while self.waiting and len(old) + len(new) < self.runner.max_slots:
            cand = self.waiting[0]
            if new and len(cand.pending) > budget:
                break
            budget -= len(cand.pending)
            new.append(self.waiting.popleft())
        if not old and not new:
            return []
        parts = []
        if old:
            parts.append(self.runner.extend(0, [s.pending for s in old], [s.length for s in old]))
        if new:
            for i, s in enumerate(new):
                s.slot = len(old) + i
            parts.append(self.runner.extend(len(old), [s.pending for s in new], [0] * len(new)))
        batch = old + new
        for s in batch:
            s.length += len(s.pending)
            s.pending = []
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        rows = [i for i, s in enumerate(batch) if s.matcher is not None]
        mask = None
        if rows:
            for i in rows:
                self._fill_row(batch[i], i)
            mask = self._bitmask[: len(batch)].to(logits.device, non_blocking=True)
        tokens = sample(logits, [s.request.sampling for s in batch], [s.seed for s in batch],
                        [s.draws for s in batch], mask, rows).tolist()
        for s, t in zip(batch, tokens):
            self._advance(s, int(t))
        self.running = batch
        return self._retire()

    def _fill_row(self, s: _Sequence, row: int) -> None:
        """The matcher's mask for ``s`` into bitmask ``row``, budget-aware when asked.

        With ``budget_close`` the matcher allows, near the end of the budget, only tokens that
        keep a complete document within the tokens left (the stop token counts as one). When even
        that is impossible (a budget smaller than the shortest document) the mask would be empty:
        we fall back to the plain mask and the request ends with finish_reason "length".
        """
        req, m = s.request, s.matcher
        assert m is not None
        left = req.max_tokens - len(s.generated) if req.budget_close else None
        m.fill_next_token_bitmask(self._bitmask, row, tokens_left=left)
        if left is not None and m.min_completion_bytes() + 2 >= left and not bool(self._bitmask[row].any()):
            m.fill_next_token_bitmask(self._bitmask, row)

    def _advance(self, s: _Sequence, token: int) -> None:
        s.draws += 1
        req = s.request
        if s.matcher is not None:
            if not s.matcher.accept_token(token):
                raise RuntimeError(f"request {s.rid}: sampled token {token} that the constraint forbids "
                                   "(mask and matcher disagree: a bug, please report)")
            if s.matcher.is_terminated():
                s.finish_reason = "stop"
                return
        elif token in req.stop_token_ids:
            s.finish_reason = "stop"
            return
        s.generated.append(token)
        s.pending = [token]
        if s.matcher is not None and req.force_tokens:
            forced = self._forced_tokens(s.matcher, req.max_tokens - len(s.generated))
            s.generated.extend(forced)
            s.pending.extend(forced)
            s.forced += len(forced)
        if len(s.generated) >= req.max_tokens:
            # Out of budget. If the document is complete and only a stop token may follow, the
            # output is whole: report "stop". Otherwise "length": never presented as valid.
            s.finish_reason = "stop" if s.matcher is not None and self._only_stop_allowed(s.matcher) else "length"

    def _forced_tokens(self, matcher: Matcher, budget: int) -> list[int]:
        """Canonical tokens of the forced continuation (all but the last), accepted into ``matcher``."""
        data = matcher.find_jump_forward_bytes()
        if not data or budget <= 1:
            return []
        text = data.decode("utf-8", "ignore")
        ids = self.encode(text) if text else []
        tb = self.vocab.token_bytes
        if len(ids) < 2 or any(i >= len(tb) or tb[i] is None for i in ids):
            return []
        if b"".join(tb[i] for i in ids) != text.encode("utf-8"):  # e.g. a SentencePiece dummy prefix
            return []
        out: list[int] = []
        for t in ids[:-1][: budget - 1]:
            if not matcher.accept_token(t):
                break
            out.append(t)
        return out

    def _only_stop_allowed(self, matcher: Matcher) -> bool:
        """Whether the document is complete and nothing but a stop token may follow."""
        if not matcher.is_accepting():
            return False
        matcher.fill_next_token_bitmask(self._scratch, 0)
        words = self._scratch[0].numpy().view(np.uint32).copy()
        for e in self._stop_set:
            if e < self.vocab.vocab_size:
                words[e >> 5] &= np.uint32(~(1 << (e & 31)) & 0xFFFFFFFF)
        return not bool(words.any())

    def _retire(self) -> list[tuple[int, GenerationResult]]:
        done = [s for s in self.running if s.finish_reason is not None]
        if not done:
            return []
        alive = [s for s in self.running if s.finish_reason is None]
        n = len(alive)
        holes = sorted(s.slot for s in done if s.slot < n)
        movers = sorted((s for s in alive if s.slot >= n), key=lambda s: s.slot)
        for s, hole in zip(movers, holes):  # swap-with-last keeps active slots in 0..n-1
            self.runner.move_slot(s.slot, hole, s.length)
            s.slot = hole
        self.running = sorted(alive, key=lambda s: s.slot)
        return [(s.rid, self._result(s)) for s in done]

    def _result(self, s: _Sequence) -> GenerationResult:
        tb = self.vocab.token_bytes
        raw = b"".join(tb[t] if t < len(tb) and tb[t] is not None else b"" for t in s.generated)
        return GenerationResult(
            text=raw.decode("utf-8", "replace"),
            token_ids=list(s.generated),
            finish_reason=s.finish_reason,  # type: ignore[arg-type]
            prompt_tokens=len(s.request.prompt_ids),
            forced_tokens=s.forced,
            constrained=s.matcher is not None,
        )
