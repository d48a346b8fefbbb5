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

    def __init__(self, token_bytes: Sequence[bytes | None], only: Sequence[int] | None = None) -> None:
        """Trie of the ids of ``token_bytes`` that have bytes (restricted to ``only`` if given)."""
        ids = [i for i in (range(len(token_bytes)) if only is None else only) if token_bytes[i]]
        ids.sort(key=lambda i: token_bytes[i])
        self.levels: list[TrieLevel] = []
        self.size = len(ids)  # tokens in the trie
        if not ids:
            return
        toks = [token_bytes[i] for i in ids]
        lengths = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
        width = int(lengths.max())
        mat = np.frombuffer(b"".join(t.ljust(width, b"\0") for t in toks), dtype=np.uint8)
        mat = mat.reshape(len(toks), width)
        # Longest common prefix of each token with the one before it in sorted order.
        lcp = np.zeros(len(toks), dtype=np.int64)
        if len(toks) > 1:
            diff = mat[1:] != mat[:-1]
            first = np.where(diff.any(axis=1), diff.argmax(axis=1), width)
            lcp[1:] = np.minimum(first, np.minimum(lengths[1:], lengths[:-1]))
        sorted_ids = np.asarray(ids, dtype=np.int32)
        prev_node = prev_sel = None  # node index / token positions at the previous depth
        for depth in range(width):
            sel = np.nonzero(lengths > depth)[0]
            starts = lcp[sel] < depth + 1
            starts[0] = True
            node = np.cumsum(starts) - 1
            n = int(node[-1]) + 1
            first_tok = sel[starts]
            byte = mat[first_tok, depth].copy()
            ending = lengths[sel] == depth + 1
            end_nodes = node[ending]
            end_tokens = sorted_ids[sel[ending]]
            tok_start = np.searchsorted(end_nodes, np.arange(n), side="left")
            tok_end = np.searchsorted(end_nodes, np.arange(n), side="right")
            parent = np.zeros(n, np.int64)
            if prev_node is not None:
                parent = prev_node[np.searchsorted(prev_sel, first_tok)]
            level = TrieLevel(
                byte, parent, np.zeros(n, np.int64), np.zeros(n, np.int64), tok_start, tok_end, end_tokens, end_nodes
            )
            if prev_node is not None:
                prev = self.levels[-1]
                prev.child_start[:] = np.searchsorted(parent, np.arange(len(prev.byte)), side="left")
                prev.child_end[:] = np.searchsorted(parent, np.arange(len(prev.byte)), side="right")
            self.levels.append(level)
            prev_node, prev_sel = node, sel

    @property
    def depth(self) -> int:
        return len(self.levels)


def expand_ranges(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``arange(starts[i], ends[i])`` for all i; also return each range's length."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64), lens
    offsets = np.cumsum(lens) - lens
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, lens)
    return idx, lens
