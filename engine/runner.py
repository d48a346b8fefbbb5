"""Ragged forward passes over the slot KV cache: prefill, one-token decode and forced-token runs.

Why one "extend" primitive: a step where some rows add one sampled token, others add several
forced tokens, and new requests add whole prompts is the same operation — each row appends
``n_i >= 1`` tokens at its own position. Rows are right-padded to the longest; padding writes to
the cache's scratch column and is masked out. We compute the LM head only at each row's last
real token (one row of logits per sequence), which is all the sampler needs.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from constrain import allocate_token_bitmask
from constrain.engine.kv_cache import SlotKVCache
from constrain.engine.sampler import sample
from constrain.engine.speculative import verify_drafts
from constrain.engine.state_cache import StateCache
from constrain.kernels import to_device

if TYPE_CHECKING:
    from constrain.engine.scheduler import Row, Scheduler
    from constrain.engine.types import CausalLM

logger = logging.getLogger("constrain")


class ModelRunner:
    """Owns the model's KV cache and runs ``extend`` steps for contiguous slot ranges."""

    def __init__(self, model: CausalLM, max_slots: int, max_len: int) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = SlotKVCache.for_model(model, max_slots, max_len)
        self._decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self._head = model.get_output_embeddings()
        cfg = model.config
        # Heads with extra logic (soft-capping, scaling) go through the full model forward.
        self._plain_head = not any(getattr(cfg, a, None) for a in ("final_logit_softcapping", "logit_scale"))
        params = inspect.signature(self._decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def max_slots(self) -> int:
        return self.cache.max_slots

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @torch.inference_mode()
    def extend(self, first_slot: int, tokens: Sequence[Sequence[int]], starts: Sequence[int],
               n_logits: Sequence[int] | None = None) -> torch.Tensor:
        """Append ``tokens[i]`` to slot ``first_slot + i`` whose sequence has ``starts[i]`` tokens.

        Returns float32 logits ``(rows, logits_width)`` at each row's last appended token; with
        ``n_logits`` (speculation), ``(rows, max(n_logits), logits_width)`` at each row's last
        ``n_logits[i]`` tokens (rows with fewer repeat their last).
        """
        rows = len(tokens)
        lens = [len(t) for t in tokens]
        t_max = max(lens)
        if min(lens) < 1:
            raise ValueError("every row must append at least one token")
        end_pos = max(s + n for s, n in zip(starts, lens))
        if end_pos > self.cache.max_len:
            raise ValueError(f"sequence of {end_pos} tokens exceeds the KV cache length {self.cache.max_len}")
        dev = self.device
        ids = torch.zeros((rows, t_max), dtype=torch.long)
        pos = torch.full((rows, t_max), self.cache.scratch, dtype=torch.long)
        for i, (seq, s) in enumerate(zip(tokens, starts)):
            ids[i, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
            pos[i, : len(seq)] = torch.arange(s, s + len(seq))
        ids, pos = to_device(ids, torch.long, dev), to_device(pos, torch.long, dev)
        lens_t, starts_t = to_device([lens, list(starts)], torch.long, dev)
        # RoPE positions: real positions for real tokens; padding reuses the last real position.
        rope_pos = torch.minimum(pos, (starts_t + lens_t - 1).unsqueeze(1))
        view_len = end_pos
        key_pos = torch.arange(view_len, device=dev)
        allowed = key_pos.view(1, 1, view_len) <= rope_pos.unsqueeze(-1)  # (rows, T, view_len), causal
        mask = torch.zeros((rows, 1, t_max, view_len), dtype=self.dtype, device=dev)
        mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(self.dtype).min)
        self.cache.begin_step(first_slot, pos, view_len)
        kwargs = {self._cache_kw: self.cache, "use_cache": True}
        if n_logits is None:
            last = (lens_t - 1).view(rows, 1, 1)
        else:  # positions lens - n .. lens - 1, padded with the last
            n_t = to_device(list(n_logits), torch.long, dev).view(rows, 1)
            j = torch.arange(max(n_logits), device=dev).view(1, -1)
            last = torch.minimum(lens_t.view(rows, 1) - n_t + j, lens_t.view(rows, 1) - 1).unsqueeze(-1)
        width = last.shape[1]
        if self._plain_head:
            out = self._decoder(input_ids=ids, attention_mask=mask, position_ids=rope_pos, **kwargs)
            hidden = out.last_hidden_state
            hidden = torch.gather(hidden, 1, last.expand(rows, width, hidden.shape[-1]))
            logits = self._head(hidden).float()
        else:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=rope_pos, **kwargs)
            logits = torch.gather(out.logits, 1, last.expand(rows, width, out.logits.shape[-1])).float()
        return logits.squeeze(1) if n_logits is None else logits


class EagerStep:
    """The scheduler's step backend on transformers' own forward (CPU, unsupported models).

    Old rows and new prompts are forwarded by two ragged ``extend`` calls; every constrained
    row's matcher fills its bitmask row on the host; the fused sampler applies the masks. The
    ``cache`` only serves speculation: drafts walk through it, verification gathers from it.
    """

    def __init__(self, runner: ModelRunner, vocab_size: int) -> None:
        self.runner = runner
        self._bitmask = allocate_token_bitmask(runner.max_slots, vocab_size)
        if runner.device.type == "cuda":
            self._bitmask = self._bitmask.pin_memory()
        self.cache = StateCache(self._bitmask.shape[1], runner.device, states=256, transitions=16,
                                scratch_rows=runner.max_slots)

    @property
    def max_rows(self) -> int:
        return self.runner.max_slots

    @property
    def max_len(self) -> int:
        return self.runner.max_len

    def host_masks(self, batch: list[Row]) -> list[Row]:
        return batch  # every mask comes from the rows' matchers

    def step(self, batch: list[Row], n_old: int, scheduler: Scheduler) -> list[int]:
        old, new = batch[:n_old], batch[n_old:]
        parts = []
        if old:
            parts.append(self.runner.extend(0, [s.pending for s in old], [s.length for s in old]))
        if new:
            parts.append(self.runner.extend(n_old, [s.pending for s in new], [0] * len(new)))
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        rows = [i for i, s in enumerate(batch) if s.matcher is not None]
        for i in rows:
            scheduler.fill_mask(batch[i], self._bitmask, i)
        mask = self._bitmask[: len(batch)].to(logits.device, non_blocking=True) if rows else None
        tokens = sample(logits, [s.request.sampling for s in batch], [s.seed for s in batch],
                        [s.draws for s in batch], mask, rows)
        return [int(t) for t in tokens.tolist()]

    def verify(self, batch: list[Row], rows: torch.Tensor, scheduler: Scheduler) -> list[list[int]]:
        logits = self.runner.extend(0, [s.pending + s.draft for s in batch], [s.length for s in batch],
                                    [len(s.draft) + 1 for s in batch])
        return verify_drafts(logits, batch, self.cache.table.masks[rows.to(self.runner.device)])

    def step_time(self, rows: int, width: int, need: int) -> float | None:
        """Not measured: the scheduler's default model prices verification."""
        return None

    def sync(self, batch: list[Row]) -> None:
        """Nothing to mirror: the host matchers are the only constraint state."""

    def move_rows(self, moves: list[tuple[int, int, int]], live: int) -> None:
        self.runner.cache.move_slots(moves)
