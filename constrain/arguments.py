"""Checks of public arguments: a bad one is a TypeError or ValueError that names it and where.

The public verbs are called from engines in hot loops, so callers test the common case inline
(``type(x) is int``) and come here only to convert or to explain.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def type_name(value: object) -> str:
    return type(value).__name__


def check_int(value: Any, name: str) -> int:
    """``value`` as an int (numpy integers too); TypeError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type_name(value)} {value!r}")
    return int(value)


def check_index(value: Any, name: str, size: int, what: str) -> int:
    """``value`` as an int in ``[0, size)``; ``what`` says what the range is."""
    i = check_int(value, name)
    if not 0 <= i < size:
        raise ValueError(f"{name}={i} is outside [0, {size}) ({what})")
    return i


def check_instance(value: Any, name: str, types: type | tuple[type, ...], expected: str) -> None:
    """TypeError naming ``name`` unless ``value`` is one of ``types`` (``expected`` in words)."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {expected}, got {type_name(value)} {value!r:.80}")
