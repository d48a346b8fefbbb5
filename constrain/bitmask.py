"""The token bitmask layout shared with xgrammar, llguidance and outlines-core.

``int32`` tensor of shape ``(batch, ceil(vocab_size / 32))``; bit ``j`` of word ``i`` allows token
``32 * i + j``. Size it to the model's padded logits width, not the tokenizer's length.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from constrain.arguments import check_index

try:
    from constrain import _core
except ImportError:  # a source tree without the built extension: numpy writes the rows
    _core = None  # type: ignore[assignment]

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


def write_row(bitmask: torch.Tensor | np.ndarray, index: int, words: np.ndarray) -> None:
    """Write the mask ``words`` (int32) into row ``index`` of ``bitmask``, zeros after them, after
    checking the layout: a narrower row would lose the last tokens (the EOS word, often), so it is
    an error, not a silent cut.

    On every decode step of every row, so the checks take the cheapest attribute for each question,
    and a CPU tensor's row is written through its address by the native core: ``Tensor.numpy()``
    alone took 4-13 us between a sampler's steps (cold caches), most of a cached mask's fill.
    """
    n = len(words)
    tensor = _TORCH or _torch_types()  # (None while torch is not imported: no value can be a tensor)
    if tensor is not None and type(bitmask) is not np.ndarray and isinstance(bitmask, tensor[0]):
        if bitmask.dtype is not tensor[1]:
            raise TypeError(f"bitmask must have dtype torch.int32 (see allocate_token_bitmask), got {bitmask.dtype}")
        shape = bitmask.shape
        if len(shape) != 2 or shape[1] < n or type(index) is not int or not 0 <= index < shape[0]:
            index = _row_index(shape, index, n)  # (the call only where a check fails or converts)
        if not bitmask.is_cpu:
            device_row = bitmask[index]
            device_row[:n].copy_(tensor[2].from_numpy(words))
            device_row[n:].zero_()
            return
        if _core is not None:
            # Words from one row to the next: shape[1] (is_contiguous, cheaper than stride()), or a
            # view's row stride where its words are adjacent (None: numpy writes the row).
            step = shape[1] if bitmask.is_contiguous() else _row_step(bitmask.stride())
            if step is not None:
                _core.write_row(bitmask.data_ptr() + 4 * step * index, shape[1], words)
                return
        row: np.ndarray = bitmask.numpy()[index]
    elif isinstance(bitmask, np.ndarray):
        if bitmask.dtype != np.int32:
            raise TypeError(f"bitmask must have dtype int32 (see allocate_token_bitmask), got numpy {bitmask.dtype}")
        row = bitmask[_row_index(bitmask.shape, index, n)]
    else:
        raise TypeError(f"bitmask must be an int32 torch.Tensor or numpy array, got {type(bitmask).__name__}")
    row[:n] = words
    row[n:] = 0


_TORCH: tuple[Any, Any, Any] | None = None  # (torch.Tensor, torch.int32, torch), once torch is imported


def _torch_types() -> tuple[Any, Any, Any] | None:
    """``_TORCH``, set on the first call after torch is imported (read through a global, the checks
    of a cached mask's fill cost a third less between a sampler's steps, cold caches)."""
    global _TORCH
    torch_ = sys.modules.get("torch")
    if torch_ is not None:
        _TORCH = (torch_.Tensor, torch_.int32, torch_)
    return _TORCH


def _row_step(stride: tuple[int, ...]) -> int | None:
    """A row-contiguous view's row stride in words, None where a row's words are apart."""
    return stride[0] if stride[1] == 1 else None


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
