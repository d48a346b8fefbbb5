"""The token bitmask layout shared with xgrammar, llguidance and outlines-core.

``int32`` tensor of shape ``(batch, ceil(vocab_size / 32))``; bit ``j`` of word ``i`` allows token
``32 * i + j``. Size it to the model's padded logits width, not the tokenizer's length.
"""

from __future__ import annotations

import torch

bitmask_dtype = torch.int32


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words per row for ``vocab_size`` logits."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """A CPU bitmask of ``batch`` rows with every token allowed (-1 = all bits set)."""
    return torch.full((batch, bitmask_words(vocab_size)), -1, dtype=bitmask_dtype)
