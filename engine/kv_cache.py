"""A preallocated, slot-addressed KV cache for continuous batching.

Why not transformers' ``StaticCache``: it writes every row of a batch at the same positions, so
sequences of different lengths (requests that joined at different times, rows that received
several forced tokens in one step) cannot share it. Here each batch row owns a *slot* with its
own length; a forward writes each row's new keys at that row's own positions.

Layout per layer: ``(slots, kv_heads, max_len + 1, head_dim)``. Column ``max_len`` is a scratch
column: padding positions of ragged steps write there, so they never clobber real entries and
never need to be attended (the engine's 4-D attention mask excludes them). Active sequences are
kept compacted in slots ``0..n-1`` (``move_slots`` fills holes), so attention reads a plain slice
``buf[:n, :, :length]`` and no gather/copy of the cache happens per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from constrain.engine.types import CausalLM


class SlotKVCache:
    """Per-layer key/value buffers plus the write addresses of the forward in flight.

    The model calls ``update(key, value, layer_idx, ...)`` from every attention layer (the
    transformers ``Cache`` protocol); the engine sets ``begin_step`` before each forward.
    """

    is_compileable = False

    def __init__(
        self,
        num_layers: int,
        max_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.max_slots = max_slots
        self.max_len = max_len
        self.scratch = max_len
        shape = (max_slots, num_kv_heads, max_len + 1, head_dim)
        # Every layer's keys and values are views of one tensor, so that compaction moves a slot
        # of all layers in one copy (``move_slots``), not two per layer (~60 launches on SmolLM2).
        self._kv = torch.zeros((2, num_layers, *shape), dtype=dtype, device=device)
        self.keys = list(self._kv[0])
        self.values = list(self._kv[1])
        self._rows = 0
        self._positions: torch.Tensor | None = None  # (rows, T) write columns
        self._view_len = 0
        self._row_index: torch.Tensor | None = None

    @classmethod
    def for_model(cls, model: CausalLM, max_slots: int, max_len: int) -> SlotKVCache:
        """Size the buffers from a transformers config (GQA-aware)."""
        cfg = model.config
        cfg = getattr(cfg, "get_text_config", lambda: cfg)()
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        param = next(model.parameters())
        return cls(cfg.num_hidden_layers, max_slots, max_len, kv_heads, head_dim, param.dtype, param.device)

    def begin_step(self, first_slot: int, positions: torch.Tensor, view_len: int) -> None:
        """Declare the next forward: rows map to slots ``first_slot..first_slot+rows-1``.

        ``positions`` (rows, T) are the cache columns each new token is written to (the scratch
        column for padding); attention then reads columns ``[0, view_len)`` of those slots.
        """
        rows = positions.shape[0]
        if first_slot + rows > self.max_slots or view_len > self.max_len:
            raise ValueError("KV cache overflow: the engine sized the cache too small")
        self._first = first_slot
        self._rows = rows
        self._positions = positions
        self._view_len = view_len
        self._row_index = torch.arange(first_slot, first_slot + rows, device=positions.device).unsqueeze(1)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: object = None, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (rows, H, T, D) keys/values at the declared columns; return the slots' views."""
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        # Advanced indices (rows,1) and (rows,T) around a full slice: the indexed view is (rows,T,H,D).
        k_buf[self._row_index, :, self._positions] = key_states.transpose(1, 2).to(k_buf.dtype)
        v_buf[self._row_index, :, self._positions] = value_states.transpose(1, 2).to(v_buf.dtype)
        end = self._first + self._rows
        return k_buf[self._first:end, :, : self._view_len], v_buf[self._first:end, :, : self._view_len]

    def move_slots(self, moves: Sequence[tuple[int, int, int]]) -> None:
        """For each ``(src, dst, length)``, copy the first ``length`` columns of slot ``src`` into
        ``dst`` (compaction): one strided copy per move covers every layer's keys and values."""
        kv = self._kv
        for src, dst, length in moves:
            if src != dst and length > 0:
                kv[:, :, dst, :, :length].copy_(kv[:, :, src, :, :length])

    # The few Cache-protocol queries transformers may make when it builds masks itself.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._view_len

    def get_mask_sizes(self, *args: object, **kwargs: object) -> tuple[int, int]:
        return self._view_len, 0

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * self.num_layers
