"""Caches weighed in bytes, and structure ids that grammars share, for ``GrammarCompiler``.

Nothing here is module-level state: every cache belongs to a compiler context (or to one
grammar), so two contexts never share memory or ids and ``clear()`` really frees what it held.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol, TypeGuard, TypeVar, runtime_checkable

import numpy as np

V = TypeVar("V")

# Python's own cost of a small container entry (key, pointers, object header), roughly.
ENTRY_BYTES = 100

# Per ``settle()``: the growing values fetched or inserted since the last settle (they are the ones
# in use, so growing) are weighed again, and this many others in turn, the least recently weighed
# (weighing all of hundreds of grammars at every compile doubled the p50 compile) ...
SETTLE_REWEIGHS = 4
# ... and at most this many entries go (each may free a grown grammar's tables, 0.1-1 ms). A larger
# debt is paid over the next settles.
SETTLE_EVICTIONS = 64


@runtime_checkable
class Growing(Protocol):
    """A value that keeps growing after it is cached (a compiled grammar extends lazily)."""

    def estimated_bytes(self) -> int: ...


def is_growing(value: object) -> TypeGuard[Growing]:
    """``isinstance(value, Growing)`` without its cost (a protocol check takes tens of µs on
    Python 3.11, and every cached head walk, list and tuple element is weighed)."""
    return callable(getattr(type(value), "estimated_bytes", None))


def nbytes_of(value: object) -> int:
    """Rough memory of a cached value: numpy arrays, bytes and the containers holding them."""
    if type(value) is int:  # (the states lists hold: first, as the commonest and cheapest)
        return ENTRY_BYTES // 4
    if is_growing(value):
        return value.estimated_bytes()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray)):
        return len(value) + ENTRY_BYTES // 2
    if isinstance(value, (list, tuple)):
        return ENTRY_BYTES + sum(nbytes_of(v) + 8 for v in value)
    if isinstance(value, dict):
        return ENTRY_BYTES + sum(nbytes_of(v) + ENTRY_BYTES for v in value.values())
    if hasattr(value, "__dict__"):
        return ENTRY_BYTES + sum(nbytes_of(v) for v in vars(value).values())
    return ENTRY_BYTES // 4


class ByteBudgetCache:
    """A thread-safe LRU mapping whose entries are weighed in bytes (and optionally counted).

    Past ``max_bytes`` (or ``max_entries``) the least recently used entries go. An insertion
    evicts only enough to make room for itself. A value that grows after insertion (``Growing``:
    a compiled grammar) is weighed again by ``settle()``, which then pays for the growth: those
    fetched or inserted since the last settle (in use, so growing) and a few others in turn;
    ``nbytes`` weighs them all. Other values are weighed once.

    Growth happens while masks are filled, and an insertion that paid for it there would free
    grammars inside a mask: 170 evictions, 27 ms, in one mask of bench/HISTORY.md's session 22.
    ``GrammarCompiler`` settles its cache once per compile instead, where the user expects latency.
    """

    def __init__(self, max_bytes: int | None = None, max_entries: int | None = None) -> None:
        for name, limit in (("max_bytes", max_bytes), ("max_entries", max_entries)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
                raise ValueError(f"ByteBudgetCache: {name} must be a non-negative int or None, got {limit!r}")
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        # Plain dicts (``_entries`` in recency order, oldest first), with values and weights apart:
        # Python's collector stops tracking a dict that holds nothing it tracks (ints, arrays,
        # tuples of them: a grammar's masks and head walks), so an idle grammar's caches cost its
        # full collections nothing. An OrderedDict is always tracked, and each full collection
        # visited every entry of every cache: tens of ms, inside whichever mask it landed in.
        self._entries: dict[Hashable, Any] = {}
        self._sizes: dict[Hashable, int] = {}
        self._growing: dict[Hashable, None] = {}  # the least recently weighed first
        self._touched: dict[Hashable, None] = {}  # growing values fetched or inserted since the last settle
        self._nbytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    @property
    def nbytes(self) -> int:
        """Bytes held now (growing values weighed afresh)."""
        with self._lock:
            if self._growing:  # (a grammar's own caches hold none: weighing one asks this of two)
                self._reweigh(self._growing)
            return self._nbytes

    def get(self, key: Hashable) -> Any | None:
        """The value under ``key`` (now the most recent), or None."""
        with self._lock:
            got = self._entries.pop(key, None)
            if got is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries[key] = got  # now the most recent
            if key in self._growing:
                self._touched[key] = None
            return got

    def get_or_make(self, key: Hashable, make: Callable[[], V]) -> V:
        """``self[key]``, made by ``make()`` on a miss (outside the lock: makes may be slow)."""
        got = self.get(key)
        if got is not None:
            return got
        value = make()
        self.put(key, value)
        return value

    def put(self, key: Hashable, value: object) -> None:
        """Insert ``value`` as the most recent entry, evicting the oldest while over the limits
        until they made room for it. A value larger than ``max_bytes`` alone is not kept (and
        evicts nothing)."""
        size = nbytes_of(value)
        with self._lock:
            old = self._sizes.pop(key, None)
            if old is not None:
                del self._entries[key]
                self._nbytes -= old
                self._growing.pop(key, None)
                self._touched.pop(key, None)
            if self.max_bytes is not None and size > self.max_bytes:
                return
            self._entries[key] = value
            self._sizes[key] = size
            self._nbytes += size
            if is_growing(value):
                self._growing[key] = None
                self._touched[key] = None
            self._evict(room=size)

    def settle(self) -> None:
        """Weigh again the growing values fetched or inserted since the last settle and
        ``SETTLE_REWEIGHS`` others, then evict down to the limits, at most ``SETTLE_EVICTIONS``
        entries (the rest of a larger debt waits for the next settle)."""
        with self._lock:
            touched, self._touched = self._touched, {}
            self._reweigh(touched)
            self._reweigh(itertools.islice((k for k in self._growing if k not in touched), SETTLE_REWEIGHS))
            self._evict(room=None, most=SETTLE_EVICTIONS)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._sizes.clear()
            self._growing.clear()
            self._touched.clear()
            self._nbytes = 0

    def _reweigh(self, keys: Iterable[Hashable]) -> None:
        """Weigh again the growing values under ``keys``; each is then the most recently weighed."""
        for key in list(keys):
            del self._growing[key]
            self._growing[key] = None  # now the most recently weighed
            now = nbytes_of(self._entries[key])
            self._nbytes += now - self._sizes[key]
            self._sizes[key] = now

    def _evict(self, room: int | None, most: int | None = None) -> None:
        """Evict the oldest entries while over the limits (at most ``most`` of them, None: no
        bound), and over ``max_bytes`` only until ``room`` bytes went (None: all the way down)."""
        freed = gone = 0
        while self._entries and (most is None or gone < most):
            over_bytes = self.max_bytes is not None and self._nbytes > self.max_bytes and (room is None or freed < room)
            over_entries = self.max_entries is not None and len(self._entries) > self.max_entries
            if not (over_bytes or over_entries):
                return
            gone += 1
            key = next(iter(self._entries))
            del self._entries[key]
            self._growing.pop(key, None)
            self._touched.pop(key, None)
            size = self._sizes.pop(key)
            self._nbytes -= size
            freed += size


class Signatures:
    """Ids of expression structures, equal across the grammars that share this table.

    Grammars compiled by one context share walks keyed by these ids. Keys holding ids also hold
    the table, so ids of different tables (another context, or this one after ``clear()``) can
    never be confused.
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()

    def intern(self, key: tuple[Any, ...]) -> int:
        """The id of structure ``key`` (a new id the first time it is seen)."""
        with self._lock:
            got = self._ids.get(key)
            if got is None:
                got = self._ids[key] = len(self._ids)
            return got

    def estimated_bytes(self) -> int:
        return len(self._ids) * 2 * ENTRY_BYTES

    def __len__(self) -> int:
        return len(self._ids)
