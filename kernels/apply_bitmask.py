"""Apply a packed token bitmask to logits in place: disallowed tokens become -inf.

Layout (shared with xgrammar / llguidance): int32 `(batch, ceil(vocab/32))`, bit j of word i
allows token 32*i + j. Soundness first: a logits column that the bitmask does not cover (padded
logits wider than 32 * words) is treated as disallowed, unlike xgrammar which leaves it alone.

Traffic: a block whose tokens are all masked is written with -inf without reading the logits; a
block of all-allowed tokens is left alone; a mixed block is read and written whole, because
scattered masked stores (xgrammar's way) cost partial-sector read-modify-writes in L2/HBM that are
dearer than one full read plus one full write (`read_mixed=False` gives the masked-store variant).
Grid = (rows, vocab blocks), non-persistent, so a large batch fills the card.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, tl, triton, use_triton


def unpack_bitmask(bitmask: torch.Tensor, n_cols: int) -> torch.Tensor:
    """(r, words) int32 -> (r, n_cols) bool; columns past the bitmask's coverage are False."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool()
    bits = bits.reshape(*bitmask.shape[:-1], bitmask.shape[-1] * 32)
    if bits.shape[-1] >= n_cols:
        return bits[..., :n_cols]
    pad = torch.zeros(*bits.shape[:-1], n_cols - bits.shape[-1], dtype=torch.bool, device=bits.device)
    return torch.cat([bits, pad], dim=-1)


def apply_token_bitmask_inplace_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Pure-torch twin of `apply_token_bitmask_inplace`."""
    rows = torch.arange(logits.shape[0], device=logits.device) if indices is None else indices.long()
    allowed = unpack_bitmask(bitmask[rows.to(bitmask.device)].to(logits.device), logits.shape[-1])
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


if HAS_TRITON:

    @triton.jit
    def _apply_bitmask_kernel(
        logits_ptr,
        bitmask_ptr,
        indices_ptr,
        n_cols,
        n_words,
        logits_stride,
        bitmask_stride,
        HAS_INDICES: tl.constexpr,
        BLOCK: tl.constexpr,
        READ_MIXED: tl.constexpr,
    ):
        pid_row = tl.program_id(0)
        if HAS_INDICES:
            row = tl.load(indices_ptr + pid_row).to(tl.int64)
        else:
            row = pid_row.to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        in_row = offs < n_cols
        word_idx = offs >> 5
        words = tl.load(
            bitmask_ptr + row * bitmask_stride + word_idx, mask=in_row & (word_idx < n_words), other=0
        )
        allowed = ((words >> (offs & 31)) & 1) != 0
        ptrs = logits_ptr + row * logits_stride + offs
        if READ_MIXED:
            # A block with both allowed and masked tokens is read and written whole: full-line
            # writes avoid the partial-sector read-modify-write that masked stores cost.
            n_allowed = tl.sum((allowed & in_row).to(tl.int32), 0)
            if n_allowed > 0:
                x = tl.load(ptrs, mask=in_row & allowed, other=float("-inf"))
                tl.store(ptrs, x, mask=in_row)
            else:
                tl.store(ptrs, float("-inf"), mask=in_row)
        else:
            tl.store(ptrs, float("-inf"), mask=in_row & ~allowed)


def _launch_config(n_cols: int) -> tuple[int, int]:
    """(BLOCK, num_warps): swept on the H200 (see BENCHMARKS.md)."""
    return 1024, 4


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: torch.Tensor | None = None,
    *,
    block: int | None = None,
    num_warps: int | None = None,
    read_mixed: bool = True,
) -> None:
    """Set logits of tokens the bitmask disallows to -inf, in place.

    logits: (batch, vocab) float32/float16/bfloat16, last dim contiguous.
    bitmask: (batch, words) int32; rows are indexed like logits rows.
    indices: optional int tensor of the rows to mask (mixed constrained/unconstrained batches);
    other rows are left untouched.
    """
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
        bitmask = bitmask.reshape(1, -1)
    if bitmask.dtype != torch.int32:
        raise TypeError("bitmask must be int32")
    if logits.stride(-1) != 1 or bitmask.stride(-1) != 1:
        raise ValueError("logits and bitmask need a contiguous last dimension")
    if not use_triton(logits):
        apply_token_bitmask_inplace_ref(logits, bitmask, indices)
        return
    n_rows = logits.shape[0] if indices is None else indices.numel()
    if n_rows == 0:
        return
    n_cols = logits.shape[-1]
    b, w = _launch_config(n_cols)
    block, num_warps = block or b, num_warps or w
    if indices is not None:
        indices = indices.to(device=logits.device, dtype=torch.int32)
    grid = (n_rows, triton.cdiv(n_cols, block))
    _apply_bitmask_kernel[grid](
        logits,
        bitmask,
        indices if indices is not None else logits,
        n_cols,
        bitmask.shape[-1],
        logits.stride(0),
        bitmask.stride(0),
        HAS_INDICES=indices is not None,
        BLOCK=block,
        READ_MIXED=read_mixed,
        num_warps=num_warps,
    )
