"""Per-row sampling over masked logits: greedy, temperature, top-k, top-p, seeded.

Why per-row parameters in one batched op: continuous batching mixes requests with different
sampling settings in one step, and a request's output must not depend on who else is in the
batch. Randomness is therefore a pure function of (request seed, draw index), turned into the
fused kernel's per-row seed, so a seeded request reproduces exactly, alone or batched, on the
CPU twin or the GPU kernel.

Masks come from constrain's matchers (filled into one bitmask); this module only hands them to
kernels/: the fused masked sampler reads each row's bitmask row inside the kernel, so masked
logits are never materialised.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from constrain.kernels import apply_token_bitmask_inplace as _apply_bitmask
from constrain.kernels import sample as _fused_sample
from constrain.kernels import to_device

logger = logging.getLogger("constrain")

_MIX = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens. ``temperature == 0`` means greedy (the default: structured
    outputs are usually wanted deterministic). ``top_k == 0`` and ``top_p == 1`` disable those
    filters. ``seed=None`` draws a random seed per request."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def resolved_seed(self) -> int:
        return self.seed if self.seed is not None else random.getrandbits(63)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    """Disallowed tokens -> -inf in place, for ``rows`` (None: all rows). Used where the logits
    must stay materialised (the HF logits processor); the engine samples through the fused path."""
    if rows is not None and rows.numel() == 0:
        return
    _apply_bitmask(logits, bitmask, rows)


def step_seed(seed: int, draw: int) -> int:
    """The kernel's per-step seed for draw ``draw`` of a request seeded ``seed``.

    The fused sampler's randomness is a pure function of (seed, logits); deriving a fresh seed
    per draw keeps a request reproducible, and independent of its batch neighbours.
    """
    return ((seed * _MIX) ^ (draw * 0xBF58476D1CE4E5B9 + 1)) & _MASK63


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    draws: Sequence[int],
    bitmask: torch.Tensor | None = None,
    mask_rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """One token per row, masked and filtered in one fused pass (kernels.sample).

    ``bitmask`` rows apply to the batch rows listed in ``mask_rows`` (row i uses bitmask row i);
    other rows are unconstrained. Greedy rows (temperature 0) take the masked argmax. A row whose
    mask allows nothing comes back as -1, which the scheduler reports as a bug.
    """
    b = logits.shape[0]
    dev = logits.device
    index = None
    if bitmask is not None and mask_rows:
        idx = [-1] * b
        for r in mask_rows:
            idx[r] = r
        index = to_device(idx, torch.int32, dev)
    else:
        bitmask = None
    temperature = to_device([p.temperature for p in params], torch.float32, dev)
    filtered = any(p.temperature > 0 and (p.top_k > 0 or p.top_p < 1) for p in params)
    top_k = to_device([p.top_k for p in params], torch.int32, dev) if filtered else None
    top_p = to_device([p.top_p for p in params], torch.float32, dev) if filtered else None
    step = to_device([step_seed(s, d) for s, d in zip(seeds, draws)], torch.int64, dev)
    tokens, _ = _fused_sample(logits, bitmask, index, temperature=temperature, top_k=top_k, top_p=top_p,
                              seeds=step, max_top_k=max(p.top_k for p in params) if filtered else None)
    return tokens
