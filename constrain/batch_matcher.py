"""Filling many matchers' bitmask rows in one call, over a pool of threads.

A state met before is a cached mask and a copy; a new state is a trie walk with derivatives in
C++, which releases the GIL, so new states of different grammars can be masked side by side.
``prepare`` computes the masks not cached yet, one group per grammar (a grammar masks its new
states one at a time, under its own lock): the calling thread first, then, past ``HELP_AFTER_S``,
the pool's threads with it; the rows are then filled from the cache in the calling thread.
xgrammar's ``BatchGrammarMatcher`` does the same job with the same verbs; engines that fill rows
their own way call ``prepare`` first.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Literal

import numpy as np

from constrain.arguments import check_instance
from constrain.matcher import Matcher

if TYPE_CHECKING:
    import torch

__all__ = ["BatchMatcher"]

# The calling thread works alone this long before helpers join. A mask of a new state is ~100 us,
# mostly Python under the GIL: handed to the pool one task each, they cost wake-ups and GIL
# hand-offs. Measured on the H200's host (16 threads, Llama-3, bench/batch_fill.py, 64 / 256 rows):
# one thread, 5.2 / 6.2 ms a fill; this, 4.9 / 5.4 (one task per grammar at once: 6.4 / 8.5, an
# earlier run). In a decode loop's steps (a few new states each) one thread was best of all.
HELP_AFTER_S = 0.002


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
        for every ``i`` (``indices`` default: rows ``0 .. len(matchers) - 1``): ``prepare``, then
        every row filled from the cache.

        Every row is attempted; if some raise, the first error is raised afterwards, with a note
        naming its row (the other rows are filled).
        """
        n = len(self._checked(matchers))
        rows = list(range(n)) if indices is None else list(indices)
        budgets = self._budgets(tokens_left, n)
        if len(rows) != n:
            raise ValueError(f"BatchMatcher.batch_fill_next_token_bitmask(indices) has {len(rows)} entries "
                             f"for {n} matchers")
        self.prepare(matchers, budgets)
        errors: list[tuple[int, BaseException]] = []
        for m, row, budget in zip(matchers, rows, budgets):
            try:
                m.fill_next_token_bitmask(bitmask, row, tokens_left=budget)
            except Exception as e:  # every row is attempted; the first error is raised below
                errors.append((row, e))
        if errors:
            row, error = errors[0]
            error.add_note(f"(while filling bitmask row {row} in BatchMatcher.batch_fill_next_token_bitmask)")
            raise error

    def prepare(self, matchers: Sequence[Matcher], tokens_left: Sequence[int | None] | None = None) -> None:
        """Compute, over the pool, the masks the next fills of ``matchers`` need and that are not
        cached yet (the masks are what every later fill of those states reads). A matcher whose
        mask raises is left alone here: its own fill raises the same error."""
        budgets = self._budgets(tokens_left, len(self._checked(matchers)))
        groups: dict[int, list[tuple[Matcher, int | None]]] = {}
        for m, budget in zip(matchers, budgets):
            if not m.mask_is_cached(budget):
                groups.setdefault(id(m._automaton), []).append((m, budget))
        todo = deque(groups.values())
        _drain(todo, time.perf_counter() + HELP_AFTER_S if self.max_threads > 1 else None)
        helpers = []
        if len(todo) > 1 and self.max_threads > 1:
            pool = self._get_pool()
            helpers = [pool.submit(_drain, todo) for _ in range(min(self.max_threads, len(todo)) - 1)]
        _drain(todo)
        for helper in helpers:
            if not helper.cancel():  # it started: wait for the group it took
                helper.result()

    @staticmethod
    def _checked(matchers: Sequence[Matcher]) -> Sequence[Matcher]:
        check_instance(matchers, "BatchMatcher(matchers)", (list, tuple), "a list of constrain.Matcher")
        for i, m in enumerate(matchers):
            check_instance(m, f"BatchMatcher(matchers[{i}])", Matcher, "a constrain.Matcher")
        return matchers

    @staticmethod
    def _budgets(tokens_left: Sequence[int | None] | None, n: int) -> list[int | None]:
        budgets: list[int | None] = [None] * n if tokens_left is None else list(tokens_left)
        if len(budgets) != n:
            raise ValueError(f"BatchMatcher(tokens_left) has {len(budgets)} entries for {n} matchers")
        return budgets

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


def _drain(todo: deque[list[tuple[Matcher, int | None]]], until: float | None = None) -> None:
    """Warm groups taken from ``todo`` until none is left (or, with ``until``, until that
    ``time.perf_counter()``)."""
    while until is None or time.perf_counter() < until:
        try:
            group = todo.popleft()
        except IndexError:
            return
        _warm(group)


def _warm(group: list[tuple[Matcher, int | None]]) -> None:
    """The masks of one grammar's matchers, into its caches."""
    for m, tokens_left in group:
        try:
            m.prepare_mask(tokens_left)
        except Exception:  # the matcher's own fill raises it again, where it is reported
            pass
