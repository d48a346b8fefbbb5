"""The token bitmask layout shared with xgrammar, llguidance and outlines-core.

``int32`` tensor of shape ``(batch, ceil(vocab_size / 32))``; bit ``j`` of word ``i`` allows token
``32 * i + j``. Size it to the model's padded logits width, not the tokenizer's length.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from constrain.arguments import check_index

if TYPE_CHECKING:
    import torch

    bitmask_dtype: torch.dtype


def __getattr__(name: str) -> Any:
    """``bitmask_dtype`` (``torch.int32``), importing torch only when asked for: ``import constrain``
    leaves torch out (about a second, and ~150,000 objects for every garbage collection to walk in
    a process that compiles without it)."""
    if name == "bitmask_dtype":
        import torch

        return torch.int32
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bitmask_words(vocab_size: int) -> int:
    """Number of int32 words per row for ``vocab_size`` logits."""
    return (vocab_size + 31) // 32


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """A CPU bitmask of ``batch`` rows with every token allowed (-1 = all bits set)."""
    import torch

    return torch.full((batch, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def bitmask_row(bitmask: torch.Tensor | np.ndarray, index: int, n_words: int) -> torch.Tensor | np.ndarray:
    """Row ``index`` of ``bitmask`` to write ``n_words`` words into, after checking the layout.

    CPU tensors come back as numpy views (a third of torch's per-call overhead); a narrower row
    would lose the last tokens (the EOS word, often), so it is an error, not a silent cut. (On
    every decode step of every row: the checks take the cheapest attribute for each question.)
    """
    torch_ = sys.modules.get("torch")  # (not imported: no value can be a tensor)
    if type(bitmask) is not np.ndarray and torch_ is not None and isinstance(bitmask, torch_.Tensor):
        if bitmask.dtype is not torch_.int32:
            raise TypeError(f"bitmask must have dtype torch.int32 (see allocate_token_bitmask), got {bitmask.dtype}")
        index = _row_index(bitmask.shape, index, n_words)
        if not bitmask.is_cpu:
            device_row: torch.Tensor = bitmask[index]
            return device_row
        array: np.ndarray = bitmask.numpy()
    elif isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise TypeError(f"bitmask must have dtype int32 (see allocate_token_bitmask), got numpy {bitmask.dtype}")
        index = _row_index(bitmask.shape, index, n_words)
        array = bitmask
    else:
        raise TypeError(f"bitmask must be an int32 torch.Tensor or numpy array, got {type(bitmask).__name__}")
    row: np.ndarray = array[index]
    return row


def _row_index(shape: tuple[int, ...], index: int, n_words: int) -> int:
    """``index`` checked against a bitmask of ``shape`` for a vocabulary of ``n_words`` words."""
    if len(shape) != 2:
        raise ValueError(f"bitmask must be 2-D (batch, words), got shape {tuple(shape)}")
    if shape[1] < n_words:
        raise ValueError(f"bitmask rows have {shape[1]} words but the vocabulary needs {n_words} "
                         f"(allocate_token_bitmask(batch, vocab.vocab_size) sizes them)")
    if type(index) is not int or not 0 <= index < shape[0]:
        index = check_index(index, "fill_next_token_bitmask(index)", shape[0], "the rows of the bitmask")
    return index
