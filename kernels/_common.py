"""Shared plumbing for kernels/: Triton-or-twin dispatch and a counter-based RNG.

Triton decides at import time whether `@triton.jit` compiles or interprets (TRITON_INTERPRET),
so that choice is read once here. CUDA tensors always take the Triton path; CPU tensors take it
only when the interpreter was requested (CI), otherwise they take the pure-torch twin.

The RNG is our own integer hash of (seed, counter), not `tl.rand`, because the same arithmetic is
written in torch below: the twin draws the very same uniforms as the kernel, so runs are
reproducible per row seed on either path.
"""

from __future__ import annotations

import os

import torch

try:  # triton is optional: CPU-only installs (macOS, aarch64) run the twins.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAS_TRITON = False

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

MASK32 = 0xFFFFFFFF
_M1 = 0x7FEB352D
_M2 = 0x2C1B3C6D
_GOLDEN = 0x61C88647  # a large odd constant below 2**31 (Triton literals stay int32)


def use_triton(t: torch.Tensor) -> bool:
    """True when `t` should go through the Triton kernel rather than the torch twin."""
    if not HAS_TRITON:
        return False
    return INTERPRET or t.is_cuda


def _mix_ref(x: torch.Tensor) -> torch.Tensor:
    """lowbias32-style avalanche on uint32 values held in int64."""
    x = x ^ (x >> 16)
    x = (x * _M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _M2) & MASK32
    return x ^ (x >> 16)


def row_key_ref(seed: torch.Tensor) -> torch.Tensor:
    """Twin of `_row_key`: a 32-bit key (in int64) per int64 seed, computed once per row."""
    seed = seed.to(torch.int64)
    lo = seed & MASK32
    hi = (seed >> 32) & MASK32
    return _mix_ref(_mix_ref(lo) ^ hi)


def uniform_ref(key: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Twin of `_uniform`: U(0,1) float32, never 0 or 1, from a row key and an int counter."""
    c = counter.to(torch.int64) & MASK32
    h = _mix_ref(((c * _GOLDEN) & MASK32) ^ key)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


if HAS_TRITON:

    @triton.jit
    def _mix(x):
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x2C1B3C6D
        return x ^ (x >> 16)

    @triton.jit
    def _row_key(seed):
        """uint32 key of an int64 scalar seed (see row_key_ref)."""
        lo = (seed & 0xFFFFFFFF).to(tl.uint32)
        hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        return _mix(_mix(lo) ^ hi)

    @triton.jit
    def _uniform(key, counter):
        """U(0,1) float32 per element of an int32 counter block (see uniform_ref)."""
        h = _mix((counter.to(tl.uint32) * 0x61C88647) ^ key)
        return ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
