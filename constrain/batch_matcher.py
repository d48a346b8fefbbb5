"""Filling many matchers' bitmask rows in one call, over a pool of threads.

A state met before is a cached mask and a copy; a new state is a trie walk with derivatives in
C++, which releases the GIL, so new states of different grammars are masked side by side. The
rows whose masks are cached are filled in the calling thread (threads would only add overhead);
the others go to the pool, one task per grammar (a grammar computes its new masks one at a time,
under its own lock). xgrammar's ``BatchGrammarMatcher`` does the same job with the same verbs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
import torch

from constrain.arguments import check_instance
from constrain.matcher import Matcher

__all__ = ["BatchMatcher"]


class BatchMatcher:
    """Fills the next-token bitmask rows of many matchers at once.

    ``max_threads``: threads of the pool ("auto": the machine's CPUs, at most 16). The pool is
    made at the first fill that needs it and ends with ``close()`` (or the ``with`` block).
    """

    def __init__(self, max_threads: int | Literal["auto"] = "auto") -> None:
        if max_threads == "auto":
            self.max_threads = min(16, os.cpu_count() or 1)
        elif isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1:
            raise ValueError(f"BatchMatcher(max_threads) must be a positive int or 'auto', got {max_threads!r}")
        else:
            self.max_threads = max_threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def batch_fill_next_token_bitmask(self, matchers: Sequence[Matcher], bitmask: torch.Tensor | np.ndarray,
                                      indices: Sequence[int] | None = None, *,
                                      tokens_left: Sequence[int | None] | None = None) -> None:
        """``matchers[i].fill_next_token_bitmask(bitmask, indices[i], tokens_left=tokens_left[i])``
        for every ``i`` (``indices`` default: rows ``0 .. len(matchers) - 1``).

        Every row is attempted; if some raise, the first error is raised afterwards, with a note
        naming its row (the other rows are filled).
        """
        check_instance(matchers, "BatchMatcher.batch_fill_next_token_bitmask(matchers)", (list, tuple),
                       "a list of constrain.Matcher")
        n = len(matchers)
        rows = list(range(n)) if indices is None else list(indices)
        budgets = [None] * n if tokens_left is None else list(tokens_left)
        for name, values in (("indices", rows), ("tokens_left", budgets)):
            if len(values) != n:
                raise ValueError(f"BatchMatcher.batch_fill_next_token_bitmask({name}) has {len(values)} entries "
                                 f"for {n} matchers")
        groups: dict[int, list[tuple[Matcher, int, int | None]]] = {}
        errors: list[tuple[int, BaseException]] = []
        for i, m in enumerate(matchers):
            check_instance(m, f"BatchMatcher.batch_fill_next_token_bitmask(matchers[{i}])", Matcher,
                           "a constrain.Matcher")
            if m.mask_is_cached(budgets[i]):
                _fill(m, bitmask, rows[i], budgets[i], errors)
            else:
                groups.setdefault(id(m._automaton), []).append((m, rows[i], budgets[i]))
        if len(groups) == 1 or self.max_threads == 1:
            for group in groups.values():
                _fill_group(group, bitmask, errors)
        elif groups:
            pool = self._get_pool()
            for done in [pool.submit(_fill_group, group, bitmask, errors) for group in groups.values()]:
                done.result()
        if errors:
            row, error = min(errors, key=lambda e: e[0])
            error.add_note(f"(while filling bitmask row {row} in BatchMatcher.batch_fill_next_token_bitmask)")
            raise error

    def _get_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_threads, thread_name_prefix="constrain-fill")
            return self._pool

    def close(self) -> None:
        """End the pool's threads (a later fill makes a new pool)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()

    def __enter__(self) -> BatchMatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fill(m: Matcher, bitmask: torch.Tensor | np.ndarray, row: int, tokens_left: int | None,
          errors: list[tuple[int, BaseException]]) -> None:
    try:
        m.fill_next_token_bitmask(bitmask, row, tokens_left=tokens_left)
    except Exception as e:  # every row is attempted; the caller raises the first
        errors.append((row, e))


def _fill_group(group: list[tuple[Matcher, int, int | None]], bitmask: torch.Tensor | np.ndarray,
                errors: list[tuple[int, BaseException]]) -> None:
    for m, row, tokens_left in group:
        _fill(m, bitmask, row, tokens_left, errors)
