"""Per-row sampling over masked logits: greedy, temperature, top-k, top-p, seeded.

Why per-row parameters in one batched op: continuous batching mixes requests with different
sampling settings in one step, and a request's output must not depend on who else is in the
batch. Randomness is therefore a pure function of (request seed, token index): the same
counter-based uniform the kernels/ sampling kernel draws, so a seeded request reproduces exactly,
alone or batched, on CPU or GPU.

Masks come from constrain's matchers (filled into one bitmask); this module only *applies* them,
through ``kernels.apply_token_bitmask_inplace`` when available.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

logger = logging.getLogger("constrain")

try:
    from kernels.apply_bitmask import apply_token_bitmask_inplace as _apply_bitmask
except ImportError:  # pragma: no cover - kernels/ is part of this repo; kept for partial installs
    _apply_bitmask = None

try:
    from kernels._common import uniform_ref as _uniform
except ImportError:  # pragma: no cover
    _uniform = None


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
    """Disallowed tokens -> -inf in place, for ``rows`` (None: all rows)."""
    if rows is not None and rows.numel() == 0:
        return
    if _apply_bitmask is not None:
        _apply_bitmask(logits, bitmask, rows)
        return
    idx = torch.arange(logits.shape[0], device=logits.device) if rows is None else rows
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    bits = ((bitmask[idx].unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, : logits.shape[1]]
    if bits.shape[1] < logits.shape[1]:  # columns the bitmask does not cover are never allowed
        bits = torch.nn.functional.pad(bits, (0, logits.shape[1] - bits.shape[1]), value=False)
    logits[idx] = logits[idx].masked_fill(~bits, float("-inf"))


def _uniforms(seeds: Sequence[int], counters: Sequence[int], device: torch.device) -> torch.Tensor:
    s = torch.as_tensor(list(seeds), dtype=torch.int64)
    c = torch.as_tensor(list(counters), dtype=torch.int64)
    if _uniform is not None:
        return _uniform(s, c).to(device)
    gens = [torch.Generator().manual_seed((int(a) * 1_000_003 + int(b)) & (2**63 - 1)) for a, b in zip(s, c)]
    return torch.stack([torch.rand((), generator=g) for g in gens]).clamp_(1e-7, 1 - 1e-7).to(device)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    counters: Sequence[int],
) -> torch.Tensor:
    """One token id per row of (already masked) float logits ``(rows, vocab)``.

    Greedy rows take the argmax; the others are filtered (top-k, then top-p over the temperature
    -scaled distribution) and sampled by inverse CDF with a uniform from (seed, counter).
    """
    out = logits.argmax(dim=-1)
    hot = [i for i, p in enumerate(params) if p.temperature > 0]
    if not hot:
        return out
    dev = logits.device
    idx = torch.as_tensor(hot, device=dev)
    temps = torch.as_tensor([params[i].temperature for i in hot], device=dev, dtype=logits.dtype)
    scaled = logits[idx] / temps.unsqueeze(1)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(sorted_logits.shape[1], device=dev).unsqueeze(0)
    top_k = torch.as_tensor([params[i].top_k or sorted_logits.shape[1] for i in hot], device=dev)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    top_p = torch.as_tensor([params[i].top_p for i in hot], device=dev, dtype=probs.dtype)
    before = probs.cumsum(dim=-1) - probs  # mass strictly before each rank; rank 0 always kept
    probs = probs.masked_fill(before >= top_p.unsqueeze(1), 0.0)
    cdf = probs.cumsum(dim=-1)
    u = _uniforms([seeds[i] for i in hot], [counters[i] for i in hot], dev).to(cdf.dtype)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).clamp_(max=cdf.shape[1] - 1)
    out[idx] = order.gather(1, pick).squeeze(1)
    return out
