"""The vocabulary as a byte trie laid out level by level in numpy arrays.

A mask walk advances every live trie node of one depth at once (a vectorised gather through the
automaton's transition rows) and only descends into children of live nodes, so a state that
expects a literal touches a handful of nodes while a state inside a free string touches most of
them without a Python loop per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TrieLevel:
    """Nodes at one depth (the nodes for prefixes of length depth+1)."""

    byte: np.ndarray         # uint8[n]: the byte that leads into the node
    parent: np.ndarray       # int64[n]: index of the parent node in the previous level (0 at depth 0)
    child_start: np.ndarray  # int64[n]: children of node i are next level's [child_start[i], child_end[i])
    child_end: np.ndarray
    tok_start: np.ndarray    # int64[n]: tokens ending at node i are end_tokens[tok_start[i]:tok_end[i]]
    tok_end: np.ndarray
    end_tokens: np.ndarray   # int32: token ids ending at this depth, grouped by node
    end_nodes: np.ndarray    # int64: the node each of end_tokens ends at


class TokenTrie:
    """Byte trie of all token ids that have bytes. Built once per vocabulary."""

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        """Trie of the ids of ``token_bytes`` that have bytes."""
        lengths = np.fromiter((len(t or b"") for t in token_bytes), dtype=np.int64, count=len(token_bytes))
        self._data = np.frombuffer(b"".join(t or b"" for t in token_bytes), dtype=np.uint8)
        self._start = np.cumsum(lengths) - lengths
        self._length = lengths
        ids = [i for i in range(len(token_bytes)) if token_bytes[i]]
        ids.sort(key=lambda i: token_bytes[i])
        sorted_ids = np.asarray(ids, dtype=np.int64)
        self._by_rank = sorted_ids
        self._rank = np.full(len(token_bytes), -1, np.int64)  # position in byte order; -1: no bytes
        self._rank[sorted_ids] = np.arange(len(sorted_ids))
        self.levels: list[TrieLevel] = []
        self.size = 0  # tokens in the trie
        self._build(sorted_ids)

    @property
    def depth(self) -> int:
        return len(self.levels)

    def restrict(self, ids: np.ndarray) -> TokenTrie:
        """The trie of just the tokens ``ids`` of this trie (equal to ``TokenTrie`` of their bytes).

        Split masks need a small trie of their crossing tokens for every new head; this one
        reuses the vocabulary's byte order and bytes instead of sorting token bytes in Python.
        """
        ranks = np.sort(self._rank[np.asarray(ids, dtype=np.int64)])
        ranks = ranks[ranks >= 0]
        if len(ranks) > 1:
            ranks = ranks[np.concatenate(([True], ranks[1:] != ranks[:-1]))]
        out = object.__new__(TokenTrie)
        out._data, out._start, out._length = self._data, self._start, self._length
        out._rank = out._by_rank = None
        out.levels = []
        out._build(self._by_rank[ranks])
        return out

    def _build(self, ids: np.ndarray) -> None:
        """Lay out the trie of ``ids`` (sorted by their bytes) level by level.

        All depths are computed at once over flat arrays, then sliced into levels: a trie of a
        few thousand tokens is some 70 levels deep, and numpy calls per level would cost more
        than the work itself.
        """
        k = len(ids)
        self.size = k  # tokens in the trie
        if not k:
            return
        data, length, start = self._data, self._length[ids], self._start[ids]
        # Longest common prefix of each token with the one before it in byte order.
        lcp = np.zeros(k, np.int64)
        if k > 1:
            shorter = np.minimum(length[1:], length[:-1])
            pos, _ = expand_ranges(np.zeros(k - 1, np.int64), shorter)
            pair = np.repeat(np.arange(k - 1), shorter)
            differ = np.nonzero(data[start[1:][pair] + pos] != data[start[:-1][pair] + pos])[0]
            first = np.ones(len(differ), bool)
            first[1:] = pair[differ[1:]] != pair[differ[:-1]]
            lcp[1:] = shorter
            lcp[1 + pair[differ[first]]] = pos[differ[first]]
        # Token t creates the nodes of its path at depths lcp[t] .. length[t]-1 ("creation
        # order": by token, then depth). A level lists its nodes by creating token, so a stable
        # sort by depth gives the level order, and the node of any token's path at depth d is
        # the last node of that level created by it or by a token before it.
        created = length - lcp
        first_q = np.cumsum(created) - created
        depth_q, _ = expand_ranges(lcp, length)
        tok_q = np.repeat(np.arange(k), created)
        n, width = len(depth_q), int(length.max())
        small = np.uint8 if width <= 256 else np.int64  # a stable sort of bytes is a radix sort
        order = np.argsort(depth_q.astype(small), kind="stable")
        level_of = np.empty(n, np.int64)  # creation index -> position in level order
        level_of[order] = np.arange(n)
        depth, tok = depth_q[order], tok_q[order]
        byte = data[start[tok] + depth]
        offset = np.zeros(width + 1, np.int64)
        offset[1:] = np.cumsum(np.bincount(depth, minlength=width))
        # Parents: the token's node one level up (the one created before, in creation order), or
        # for a token's first node the last node one level up created by an earlier token.
        parent_q = np.empty(n, np.int64)
        parent_q[1:] = level_of[:-1]
        makers = np.nonzero(created)[0]
        up = lcp[makers] - 1
        keys = depth * k + tok
        parent_q[first_q[makers]] = np.where(up >= 0, np.searchsorted(keys, up * k + makers) - 1, -1)
        parent = parent_q[order]
        children = np.bincount(parent[offset[1]:], minlength=n)
        child_start = offset[1] + np.cumsum(children) - children
        # A token ends at the last node it created; a token equal to the one before it, at that one's.
        ends_q = np.maximum.accumulate(np.where(created > 0, first_q + created - 1, -1))
        ends = level_of[ends_q]
        by_node = np.argsort((length - 1).astype(small), kind="stable")  # within a depth ends rise with t
        ends = ends[by_node]
        per_node = np.bincount(ends, minlength=n)
        tok_offset = np.zeros(width + 1, np.int64)
        tok_offset[1:] = np.cumsum(np.bincount(length - 1, minlength=width))
        tok_start = np.cumsum(per_node) - per_node - tok_offset[depth]
        child_start -= offset[np.minimum(depth + 1, width)]  # local to the next level
        parent_local = np.where(parent >= 0, parent - offset[np.maximum(depth - 1, 0)], 0)
        end_tokens = ids[by_node].astype(np.int32)
        end_local = ends - offset[depth[ends]]
        for d in range(width):
            a, b = offset[d], offset[d + 1]
            ta, tb = tok_offset[d], tok_offset[d + 1]
            self.levels.append(TrieLevel(
                byte[a:b], parent_local[a:b], child_start[a:b], child_start[a:b] + children[a:b],
                tok_start[a:b], tok_start[a:b] + per_node[a:b], end_tokens[ta:tb], end_local[ta:tb],
            ))


def expand_ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``arange(starts[i], ends[i])`` for all i; also return each range's length."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64), lens
    offsets = np.cumsum(lens) - lens
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, lens)
    return idx, lens
