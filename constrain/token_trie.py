"""The vocabulary as a byte trie laid out level by level in numpy arrays.

A mask walk advances every live trie node of one depth at once (a vectorised gather through the
automaton's transition rows) and only descends into children of live nodes, so a state that
expects a literal touches a handful of nodes while a state inside a free string touches most of
them without a Python loop per token.

Nodes are numbered level by level (all of depth 0, then depth 1, ...), in byte order within a
level, so the children of a node, the tokens ending at a node and the tokens below a node are
each one contiguous range.

Where the C++ core is built, the trie also carries its packed depth-first twin
(``constrain._core.PackedTrie``), whose walks are flat loops in native code (``constrain.walkers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

try:
    from constrain import _core
except ImportError:  # a source tree without the built extension: the numpy walk serves alone
    _core = None  # type: ignore[assignment]


@dataclass(frozen=True)
class TrieLevel:
    """Nodes at one depth (the nodes for prefixes of length depth+1): nodes start .. start+n-1."""

    start: int
    byte: np.ndarray    # uint8[n]: the byte that leads into the node (a view of TokenTrie.byte)
    parent: np.ndarray  # int64[n]: the parent's index within the previous level (0 at depth 0)


class TokenTrie:
    """Byte trie of all token ids that have bytes. Built once per vocabulary."""

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        """Trie of the ids of ``token_bytes`` that have bytes."""
        self.levels: list[TrieLevel] = []
        ids = [i for i in range(len(token_bytes)) if token_bytes[i]]
        ids.sort(key=lambda i: token_bytes[i] or b"")
        self.size = len(ids)  # tokens in the trie
        empty = np.zeros(0, np.int64)
        # Per node (numbered as in the module docstring):
        self.byte = np.zeros(0, np.uint8)
        self.parent = empty  # -1 at depth 0
        self.child_start = self.child_end = empty  # children are nodes child_start .. child_end-1
        self.tok_start = self.tok_end = empty  # tokens ending here: end_tokens[tok_start:tok_end]
        # Tokens at or below it: rank_start .. rank_end-1 in byte order (the order of nodes at a depth).
        self.rank_start = self.rank_end = empty
        self.end_tokens = np.zeros(0, np.int32)
        self.end_node = empty
        self.packed: _core.PackedTrie | None = None  # where the core is built and every token fits
        if _core is not None:
            try:
                self.packed = _core.PackedTrie(token_bytes)
            except ValueError:  # a token over 255 bytes: the numpy walk covers this vocabulary
                pass
        if ids:
            lengths = np.fromiter((len(t or b"") for t in token_bytes), dtype=np.int64, count=len(token_bytes))
            data = np.frombuffer(b"".join(t or b"" for t in token_bytes), dtype=np.uint8)
            self._build(np.asarray(ids, dtype=np.int64), data, np.cumsum(lengths) - lengths, lengths)
        # The node arrays never change once built: weighed here, not at each of the compiler
        # cache's settles (this trie grows only by its packed trie's slices).
        self._array_bytes = (sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray))
                             + sum(level.parent.nbytes for level in self.levels))  # (a level's bytes are a view)

    @property
    def depth(self) -> int:
        return len(self.levels)

    def estimated_bytes(self) -> int:
        """Bytes held: the node arrays and the packed trie with the slices it keeps (which grow)."""
        return self._array_bytes + (self.packed.nbytes if self.packed is not None else 0)

    def prefix(self, node: int) -> bytes:
        """The bytes that lead from the root to ``node``."""
        out = bytearray()
        while node >= 0:
            out.append(int(self.byte[node]))
            node = int(self.parent[node])
        return bytes(reversed(out))

    def _build(self, ids: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Lay out the trie of ``ids`` (sorted by their bytes ``data[starts[i]:starts[i]+lengths[i]]``).

        All depths are computed at once over flat arrays: numpy calls per level, for tens of
        levels, would cost more than the work itself.
        """
        k = len(ids)
        length, start = lengths[ids], starts[ids]
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
        # sort by depth gives the node numbers, and the node of any token's path at depth d is
        # the last node of that level created by it or by a token before it.
        created = length - lcp
        first_q = np.cumsum(created) - created
        depth_q, _ = expand_ranges(lcp, length)
        tok_q = np.repeat(np.arange(k), created)
        n, width = len(depth_q), int(length.max())
        small = np.uint8 if width <= 256 else np.int64  # a stable sort of bytes is a radix sort
        order = np.argsort(depth_q.astype(small), kind="stable")
        node_of = np.empty(n, np.int64)  # creation index -> node number
        node_of[order] = np.arange(n)
        depth, tok = depth_q[order], tok_q[order]
        offset = np.zeros(width + 1, np.int64)
        offset[1:] = np.cumsum(np.bincount(depth, minlength=width))
        # Parents: the token's node one level up (the one created before, in creation order), or
        # for a token's first node the last node one level up created by an earlier token.
        parent_q = np.empty(n, np.int64)
        parent_q[1:] = node_of[:-1]
        makers = np.nonzero(created)[0]
        up = lcp[makers] - 1
        keys = depth * k + tok
        parent_q[first_q[makers]] = np.where(up >= 0, np.searchsorted(keys, up * k + makers) - 1, -1)
        self.parent = parent = parent_q[order]
        children = np.bincount(parent[offset[1]:], minlength=n)
        self.child_start = offset[1] + np.cumsum(children) - children
        self.child_end = self.child_start + children
        # A token ends at the last node it created; a token equal to the one before it, at that one's.
        ends = node_of[np.maximum.accumulate(np.where(created > 0, first_q + created - 1, -1))]
        by_node = np.argsort(ends, kind="stable")
        per_node = np.bincount(ends, minlength=n)
        self.tok_start = np.cumsum(per_node) - per_node
        self.tok_end = self.tok_start + per_node
        self.end_tokens = ids[by_node].astype(np.int32)
        self.end_node = ends[by_node]  # the node each of end_tokens ends at
        self.byte = data[start[tok] + depth]
        self.rank_start = tok
        # A node's subtree holds the tokens from its creator up to the creator of its next sibling,
        # or, for a last child, up to where its parent's subtree ends.
        self.rank_end = np.empty(n, np.int64)
        parent_end = np.array([k])
        for d in range(width):
            a, b = int(offset[d]), int(offset[d + 1])
            up = parent[a:b] - offset[d - 1] if d else np.zeros(b - a, np.int64)
            ends_here = parent_end[up]
            sibling = np.nonzero(up[1:] == up[:-1])[0]
            ends_here[sibling] = tok[a:b][sibling + 1]
            self.rank_end[a:b] = parent_end = ends_here
            self.levels.append(TrieLevel(a, self.byte[a:b], up))


def expand_ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``arange(starts[i], ends[i])`` for all i; also return each range's length."""
    lens = ends - starts
    if len(lens) == 1:  # common in walks (one live node), and a quarter of the numpy calls
        return np.arange(starts[0], ends[0], dtype=np.int64), lens
    reach = np.cumsum(lens)
    total = int(reach[-1]) if len(reach) else 0
    if total == 0:
        return np.zeros(0, np.int64), lens
    return np.arange(total, dtype=np.int64) + np.repeat(starts + lens - reach, lens), lens
