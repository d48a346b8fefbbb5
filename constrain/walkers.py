"""Mask walks of the token trie: the C++ walk (``constrain._core``) and its numpy twin.

A ``TokenAutomaton`` asks its walker four things: a state's transitions, its mask, a head's walk
alone (the tokens it allows whatever the tail, and where tokens may cross into a tail) and the
tokens below given trie nodes. Both walkers give the same answers (tests/test_native_*.py); they
number trie nodes differently (level by level, depth first), so a ``HeadWalk`` is read only by
the kind of walker that made it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from constrain.derivatives import byte_flags
from constrain.token_trie import TokenTrie, expand_ranges


class RowSource(Protocol):
    """A byte transition table filled on demand (``constrain.derivatives.ExprTable``); the C++
    walk reads these attributes and calls ``ensure_rows``."""

    rows: np.ndarray          # int32[n, 256]: the state after each byte, 0 when dead
    row_done: np.ndarray      # bool[n]: whether the row is filled
    row_nullable: np.ndarray  # bool[n]: for a filled row, whether the state may end there
    lock: threading.RLock

    def ensure_rows(self, states: np.ndarray | Sequence[int]) -> None: ...
    def first_bytes(self, e: int) -> int: ...
    def work(self) -> AbstractContextManager[None]: ...


# A walk of a head alone, what it decides for every tail: ``(inside, node, group, paths)``.
# ``inside``: mask words of the tokens the head allows (so does the head and any live tail).
# ``node``: the trie nodes entered from a state where the head may end (where tokens may cross
# into the tail), in the walker's numbering and in depth-first order. ``group``: per node, the
# index in ``paths`` of the head's state at the node's parent. ``paths``: per head state, bytes
# that lead the head to it. A plain tuple of arrays and bytes: Python's collector stops tracking
# it, and then the dicts caching it (a dataclass or named tuple it would track for good). A
# grammar caches thousands, and every tracked entry is work for each full collection.
HeadWalk = tuple[np.ndarray, np.ndarray, np.ndarray, tuple[bytes, ...]]


NO_NODES = np.zeros(0, dtype=np.int32)
NO_NODES.flags.writeable = False


def pack_tokens(tokens: np.ndarray, n_words: int) -> np.ndarray:
    """Mask words (int32) with the bits of ``tokens`` set."""
    allowed = np.zeros(n_words * 32, dtype=bool)
    allowed[tokens] = True
    return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)


def _grouped(states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entry, the index of its state among the distinct ones; and one entry of each."""
    _, one, group = np.unique(states, return_index=True, return_inverse=True)
    return group.reshape(-1), one


class NativeWalker:
    """Walks in C++ over the packed trie; rows are filled through the table as walks meet them.

    A walk from a state that loops on many bytes (a string body, a run of digits), or that leads
    to one (a key's first bytes, an opening quote), takes the tokens that keep to the loop (UTF-8
    characters included) from the vocabulary's slice of it and walks only the rest
    (``PackedTrie.mask``, ``Slice`` in cpp/packed_trie.hpp).
    """

    kind = "native"

    def __init__(self, trie: TokenTrie, table: RowSource, n_words: int) -> None:
        assert trie.packed is not None
        self.packed = trie.packed
        self.trie = trie
        self.table = table
        self.n_words = n_words

    def _fit(self, words: np.ndarray) -> np.ndarray:
        """Words for ids past the token bytes (a vocabulary padded to the logits) are zero. Always
        a plain copy: an array from C++ rests on a memoryview, two objects that Python's garbage
        collector walks for as long as a cache keeps the array (a copy of 16 KB costs ~1 us)."""
        missing = self.n_words - len(words)
        return np.concatenate((words, np.zeros(missing, np.int32))) if missing else np.array(words)

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        with self.table.work():
            tokens, nexts = self.packed.transitions(self.table, state)
        return tokens, nexts

    def mask(self, state: int) -> np.ndarray:
        with self.table.work():
            return self._fit(self.packed.mask(self.table, state))

    def head(self, head: int) -> HeadWalk:
        with self.table.work():
            words, nodes, states = self.packed.head_mask(self.table, head)
        if not len(nodes):  # (a key's literal: no token crosses into what follows)
            return self._fit(words), NO_NODES, NO_NODES, ()
        group, one = _grouped(states)
        paths = tuple(self.packed.path(int(nodes[i]))[:-1] for i in one)
        return self._fit(words), np.array(nodes), group, paths  # (a plain copy, as ``_fit``)

    def crossings(self, walked: HeadWalk, first: int) -> tuple[np.ndarray, np.ndarray]:
        _, node, group, _ = walked
        keep = self.packed.outermost(node, byte_flags(first))
        return node[keep], group[keep]

    def below(self, nodes: np.ndarray, parents: np.ndarray) -> np.ndarray:
        with self.table.work():
            return self._fit(self.packed.mask_below(self.table, nodes, parents.astype(np.int32, copy=False)))


class NumpyWalker:
    """The reference twin: every live trie node of one depth advanced at once by a numpy gather."""

    kind = "numpy"

    def __init__(self, trie: TokenTrie, table: RowSource, n_words: int) -> None:
        self.trie = trie
        self.table = table
        self.n_words = n_words
        self._level_starts = np.array([level.start for level in trie.levels], dtype=np.int64)

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        tokens, nexts, _ = self.walk(self._root_seeds(state))
        return tokens, nexts

    def mask(self, state: int) -> np.ndarray:
        return pack_tokens(self.transitions(state)[0], self.n_words)

    def head(self, head: int) -> HeadWalk:
        tokens, _, ends = self.walk(self._root_seeds(head), record=True)
        trie = self.trie
        ends.append((0, np.zeros(0, np.int64), np.zeros(0, np.int32)))  # none at all is fine too
        node = np.concatenate([nodes for _, nodes, _ in ends])
        states = np.concatenate([p for _, _, p in ends])
        order = np.argsort(trie.rank_start[node] * (trie.depth + 1) + self._depth(node), kind="stable")
        node, states = node[order], states[order]  # depth-first: by first token below, then depth
        group, one = _grouped(states)
        # One path per distinct head state: the bytes that lead the head to a node of that state.
        paths = tuple(trie.prefix(int(trie.parent[node[i]])) for i in one)
        return pack_tokens(tokens, self.n_words), node, group, paths

    def crossings(self, walked: HeadWalk, first: int) -> tuple[np.ndarray, np.ndarray]:
        """A node crosses when the head may end at its parent and its byte is in ``first``. Below
        a crossing node the real walk covers everything, so crossing nodes under it are left out."""
        trie = self.trie
        _, node, group, _ = walked
        pick = np.nonzero(byte_flags(first)[trie.byte[node]])[0]
        nodes = node[pick]
        start, end = trie.rank_start[nodes], trie.rank_end[nodes]
        outer = np.ones(len(pick), dtype=bool)  # depth-first order: an outer node comes before those below it
        outer[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
        pick = pick[outer]
        return node[pick], group[pick]

    def below(self, nodes: np.ndarray, parents: np.ndarray) -> np.ndarray:
        depths = self._depth(nodes)
        seeds = {d: (nodes[depths == d], parents[depths == d]) for d in np.unique(depths).tolist()}
        return pack_tokens(self.walk(seeds)[0], self.n_words)

    def _depth(self, nodes: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._level_starts, nodes, side="right") - 1

    def _root_seeds(self, state: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Seeds of a whole walk from ``state``: every node of depth 0, entered from ``state``."""
        n = len(self.trie.levels[0].byte) if self.trie.levels else 0
        return {0: (np.arange(n), np.full(n, state, dtype=np.int32))}

    def walk(self, seeds: dict[int, tuple[np.ndarray, np.ndarray]],
             record: bool = False) -> tuple[np.ndarray, np.ndarray, list]:
        """Tokens allowed below ``seeds`` and the states they lead to; with ``record``, the ends.

        ``seeds`` maps a depth to nodes of that level and the states their parents have: the walk
        enters them from there. With ``record``, every child (live or not) of a node whose state
        is nullable comes back in ``(depth, nodes, parent states)``. A level is handled sparsely
        (only children of live nodes) while few nodes are live, densely (one gather over the
        whole level) once many are. Tokens are read off the live nodes of all levels at the end.
        """
        table, trie, levels = self.table, self.trie, self.trie.levels
        live_nodes, live_states = [], []
        ended: list[tuple[int, np.ndarray, np.ndarray]] = []  # (depth, nodes, parent states)
        dense_levels = []  # (first node, state of every node of the level) for levels walked densely
        depth = min(seeds, default=len(levels))
        idx = np.zeros(0, np.int64)  # live nodes of this level (sparse) ...
        st = np.zeros(0, np.int32)  # ... and their states; dense: the state of every node (0: dead)
        dense = False
        with table.work():
            while depth < len(levels):
                level = levels[depth]
                if depth in seeds:
                    nodes, parents = seeds[depth]
                    self._ensure_rows(parents)
                    fresh = table.rows[parents, trie.byte[nodes]]
                    if record:
                        _record(ended, depth, nodes, parents, table.row_nullable)
                    if dense:
                        st[nodes - level.start] = fresh
                    else:
                        keep = np.nonzero(fresh)[0]
                        idx, st = np.concatenate((idx, nodes[keep])), np.concatenate((st, fresh[keep]))
                if dense:
                    dense_levels.append((level.start, st))
                    live = int(np.count_nonzero(st))
                else:
                    live_nodes.append(idx)
                    live_states.append(st)
                    live = len(idx)
                if depth + 1 == len(levels):
                    break
                if not live:  # nothing to descend into: on to the next seeds, if any
                    depth = min((d for d in seeds if d > depth), default=len(levels))
                    idx, st, dense = np.zeros(0, np.int64), np.zeros(0, np.int32), False
                    continue
                child = levels[depth + 1]
                if live * 8 >= len(level.byte):  # dense step: one gather over the whole next level
                    full = st if dense else _scatter(idx - level.start, st, len(level.byte))
                    parent_states = full[child.parent]
                    self._ensure_rows(parent_states)
                    st, dense = table.rows[parent_states, child.byte], True
                    if record:
                        _record(ended, depth + 1, None, parent_states, table.row_nullable, child.start)
                else:  # sparse step: only the children of live nodes
                    if dense:
                        local = np.nonzero(st)[0]
                        idx, st, dense = local + level.start, st[local], False
                    children, counts = expand_ranges(trie.child_start[idx], trie.child_end[idx])
                    parent_states = np.repeat(st, counts)
                    self._ensure_rows(parent_states)
                    nxt = table.rows[parent_states, trie.byte[children]]
                    if record:
                        _record(ended, depth + 1, children, parent_states, table.row_nullable)
                    keep = np.nonzero(nxt)[0]
                    idx, st = children[keep], nxt[keep]
                depth += 1
        tok_parts, next_parts = [], []
        if live_nodes:
            idx = np.concatenate(live_nodes)
            ends, counts = expand_ranges(trie.tok_start[idx], trie.tok_end[idx])
            tok_parts.append(trie.end_tokens[ends])
            next_parts.append(np.repeat(np.concatenate(live_states), counts))
        for start, full in dense_levels:  # tokens ending on a dense level: one contiguous range
            lo, hi = trie.tok_start[start], trie.tok_end[start + len(full) - 1]
            s = full[trie.end_node[lo:hi] - start]
            keep = np.nonzero(s)[0]
            tok_parts.append(trie.end_tokens[lo:hi][keep])
            next_parts.append(s[keep])
        if not tok_parts:
            return np.zeros(0, np.int32), np.zeros(0, np.int32), ended
        return (np.concatenate(tok_parts), np.concatenate(next_parts).astype(np.int32, copy=False), ended)

    def _ensure_rows(self, states: np.ndarray) -> None:
        try:
            missing = states[~self.table.row_done[states]]
        except IndexError:  # states newer than the row table
            missing = states
        if len(missing):
            self.table.ensure_rows(np.unique(missing))


def _scatter(idx: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=values.dtype)
    out[idx] = values
    return out


def _record(ends: list, depth: int, nodes: np.ndarray | None, parents: np.ndarray, nullable: np.ndarray,
            start: int = 0) -> None:
    """Add to ``ends`` the ``nodes`` (None: the whole level, from node ``start``) whose parent's
    state is nullable."""
    hit = np.nonzero(nullable[parents])[0]
    if len(hit):
        ends.append((depth, hit + start if nodes is None else nodes[hit], parents[hit]))
