"""apply_token_bitmask_inplace: Triton kernel == torch twin == a per-bit reading of the layout."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kernels import DEVICE, needs_kernels, rand_words

from constrain.kernels import apply_token_bitmask_inplace, apply_token_bitmask_inplace_ref, unpack_bitmask


def test_unpack_bitmask_layout() -> None:
    """Bit j of word i allows token 32*i + j; columns past the words are disallowed."""
    words = torch.tensor([[1 - 2**31, 0b100]], dtype=torch.int32)  # bits 0 and 31, then bit 2
    allowed = unpack_bitmask(words, 70)
    assert allowed[0].nonzero().flatten().tolist() == [0, 31, 34]
    assert allowed.shape == (1, 70)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab,mask_vocab", [(100, 100), (64, 64), (130, 100), (90, 160)])
def test_apply_matches_twin(dtype: torch.dtype, vocab: int, mask_vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab + mask_vocab)
    logits = torch.randn(5, vocab, generator=g).to(dtype).to(DEVICE)
    bm = rand_words((5, (mask_vocab + 31) // 32), g).to(DEVICE)
    for indices in (None, torch.tensor([4, 1, 1], device=DEVICE)):
        a, r = logits.clone(), logits.clone()
        apply_token_bitmask_inplace(a, bm, indices, block=64)
        apply_token_bitmask_inplace_ref(r, bm, indices)
        assert torch.equal(a, r)
        rows = range(5) if indices is None else indices.tolist()
        allowed = unpack_bitmask(bm, vocab)
        for i in range(5):
            if i in rows:  # exactly the disallowed tokens are -inf, the rest untouched
                assert torch.equal(a[i] == float("-inf"), ~allowed[i])
                assert torch.equal(a[i][allowed[i]], logits[i][allowed[i]])
            else:
                assert torch.equal(a[i], logits[i])


@needs_kernels
@pytest.mark.parametrize("read_mixed", [True, False])
def test_apply_variants_and_all_or_nothing_blocks(read_mixed: bool) -> None:
    """Blocks that are fully masked / fully allowed / mixed, through both store strategies."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 256, generator=g).to(DEVICE)
    bm = rand_words((3, 8), g)
    bm[0, :2] = 0
    bm[1, 2:4] = -1
    bm = bm.to(DEVICE)
    a, r = logits.clone(), logits.clone()
    apply_token_bitmask_inplace(a, bm, block=64, read_mixed=read_mixed)
    apply_token_bitmask_inplace_ref(r, bm)
    assert torch.equal(a, r)


@needs_kernels
@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 4),
    vocab=st.integers(1, 150),
    extra_words=st.integers(-2, 2),
    seed=st.integers(0, 2**31),
)
def test_apply_random_shapes(rows: int, vocab: int, extra_words: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    words = max(1, (vocab + 31) // 32 + extra_words)
    logits = torch.randn(rows, vocab, generator=g).to(DEVICE)
    bm = rand_words((rows, words), g).to(DEVICE)
    a, r = logits.clone(), logits.clone()
    apply_token_bitmask_inplace(a, bm, block=32)
    apply_token_bitmask_inplace_ref(r, bm)
    assert torch.equal(a, r)
