"""The token automaton: grammar states x vocabulary -> token masks and token transitions.

States are the interned expressions of ``constrain.derivatives``. A state's mask is computed the
first time some sequence reaches it, by one vectorised walk of the token trie, and cached; every
matcher of the compiled grammar shares the cache, so the steady state is a dictionary hit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import numpy.ma

from constrain.cache import ByteBudgetCache
from constrain.derivatives import NOTHING, ExprTable, byte_flags
from constrain.token_trie import TokenTrie, expand_ranges

DEFAULT_MASK_CACHE = 4096
# A union state is masked member by member (each member's head walk cached) up to this many.
MAX_UNION_MEMBERS = 512

MAX_FORCED_BYTES = 4096

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


@dataclass(frozen=True)
class HeadWalk:
    """A walk of a head alone: what it decides for every tail.

    The other arrays describe the children of the nodes where the head may end (where tokens
    may cross into the tail), one entry each.
    """

    inside: np.ndarray  # mask words of the tokens the head allows (so does the head and any live tail)
    depth: np.ndarray
    node: np.ndarray
    group: np.ndarray  # index of the head's state at the parent, in paths
    paths: list[bytes]  # per head state: bytes that lead the head to it


class TokenAutomaton:
    """Masks and transitions over a vocabulary for one grammar; safe to share between threads.

    ``shared`` is the compiler context's cache: the vocabulary's trie and the head walks of
    rule-free heads, shared by every grammar the context compiles for the same vocabulary.
    """

    def __init__(self, table: ExprTable, vocab, shared: ByteBudgetCache, *,
                 mask_cache_size: int = DEFAULT_MASK_CACHE) -> None:
        self.table = table
        self.vocab = vocab
        self._vocab_key = vocab.fingerprint
        self.shared = shared
        self.trie: TokenTrie = shared.get_or_make(("trie", self._vocab_key), lambda: TokenTrie(vocab.token_bytes))
        table.clamp_limit = max(self.trie.depth, 1)
        self.token_bytes = vocab.token_bytes
        self.eos_token_ids = tuple(vocab.eos_token_ids)
        self.n_words = (vocab.vocab_size + 31) // 32
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._max_next: dict[int, float] = {}
        self._heads = ByteBudgetCache(max_entries=mask_cache_size)  # head walks and their crossings per first bytes
        self._head_states = ByteBudgetCache(max_entries=mask_cache_size)  # per head: its states at paths
        self._mask_cache_size = mask_cache_size
        self._lock = threading.RLock()

    @property
    def initial_state(self) -> int:
        return self.table.start

    def estimated_bytes(self) -> int:
        """A rough estimate of this grammar's memory: its table and its cached masks."""
        return self.table.estimated_bytes() + len(self._masks) * self.n_words * 4

    def is_accepting(self, state: int) -> bool:
        """Whether the document may end here (a stop token is allowed)."""
        return self.table.nullable(state)

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token``, or -1 when the mask forbids it (stop tokens excluded)."""
        if not 0 <= token < len(self.token_bytes):
            return -1
        data = self.token_bytes[token]
        if not data:
            return -1
        rows, done = self.table.rows, self.table.row_done
        s = state
        for b in data:
            if s >= len(done) or not done[s]:
                self.table.ensure_rows((s,))
                rows, done = self.table.rows, self.table.row_done
            s = int(rows[s, b])
            if s == NOTHING:
                return -1
        return s

    def mask(self, state: int) -> np.ndarray:
        """The allowed-token bitmask words (int32) of ``state``, stop tokens included."""
        got = self._masks.get(state)
        if got is not None:
            return got
        with self._lock, self.table.work():  # a new state's mask is bounded by the compile budget
            key = self.table.clamp(state)  # same mask, shared by states differing in counts only
            got = self._masks.get(key)
            if got is None:
                got = self._union_mask(key)
                if got is None:
                    got = self._split_mask(key)
                if got is None:
                    tokens, _ = self.transitions(key)
                    got = self._pack(tokens, self.is_accepting(key))
                self._masks[key] = got
            self._masks[state] = got
            while len(self._masks) > self._mask_cache_size:
                self._masks.popitem(last=False)
            return got

    def _union_mask(self, state: int) -> np.ndarray | None:
        """Mask of ``a | b | ...`` as the union of the members' masks.

        Pays when members are ``FRAME(...) tail`` states (object members in any order, rules
        alive side by side): each member's head walk is cached and shared, where a walk of the
        union itself would be new for every combination of members.
        """
        members = self.table.alternatives(state)
        if members is None or len(members) > MAX_UNION_MEMBERS or not any(
                [self.table.is_framed(m) for m in members]):
            return None
        out = None
        for m in members:
            # Members are rarely met again (they differ in what comes after): not cached.
            got = self._masks.get(m)
            if got is None:
                got = self._split_mask(m)
            if got is None:
                got = self.mask(m)
            out = got.copy() if out is None else np.bitwise_or(out, got, out=out)
        return out

    def _split_mask(self, state: int) -> np.ndarray | None:
        """Mask of ``head tail`` from a walk of ``head`` that is shared by every tail.

        One walk of the head alone serves every state with the same head (every property of
        type string, every nesting depth of a recursive grammar): the tokens it allows are
        allowed whatever the (live) tail. A token can also cross into the tail, at a node where
        the head may end and whose byte the tail can start with; the walk records those places,
        and only the subtrees below them are walked again, from the real state there.
        """
        table = self.table
        parts = table.split(state)
        if parts is None:
            return None
        head, tail = parts
        if table.is_byte_set(head):  # a literal's next byte: the plain walk is already tiny
            return None
        sig = table.signature(head)
        heads: ByteBudgetCache
        key: tuple[Hashable, ...]
        if sig is None:
            heads, key = self._heads, (head,)
        else:  # the signature table is part of the key: its ids mean nothing to another table
            heads, key = self.shared, ("head", self._vocab_key, table.signatures, sig)
        walked = heads.get_or_make(key, lambda: self._walk_head(head))
        first = table.first_bytes(tail)
        crossings = heads.get_or_make((*key, first), lambda: self._crossings(walked, first))
        # The head's states at the crossing nodes' parents, in this grammar's table (a shared walk
        # may come from another grammar).
        starts = self._head_states.get_or_make(key, lambda: [table.derive_bytes(head, path) for path in walked.paths])
        parents = np.array([table.seq(h, tail) for h in starts], dtype=np.int32)
        crossing = self._walk({d: (nodes, parents[group]) for d, (nodes, group) in crossings.items()})[0]
        return walked.inside | self._pack(crossing, self.is_accepting(state))

    def _walk_head(self, head: int) -> HeadWalk:
        """Walk ``head`` alone, recording the children of the nodes where it may end."""
        tokens, _, ends = self._walk(self._root_seeds(head), record=True)
        trie = self.trie
        ends.append((0, np.zeros(0, np.int64), np.zeros(0, np.int32)))  # none at all is fine too
        depth = np.concatenate([np.full(len(nodes), d) for d, nodes, _ in ends])
        node = np.concatenate([nodes for _, nodes, _ in ends])
        _, one, group = np.unique(np.concatenate([p for _, _, p in ends]), return_index=True, return_inverse=True)
        # One path per distinct head state: the bytes that lead the head to a node of that state.
        paths = [trie.prefix(int(trie.parent[node[i]])) for i in one]
        return HeadWalk(self._pack(tokens, False), depth, node, group, paths)

    def _crossings(self, walked: HeadWalk, first: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Where tokens cross into tails that start with the bytes ``first``: by depth, the nodes
        and the group of the head's state at their parents.

        A node crosses when the head may end at its parent and its byte is in ``first``. Below a
        crossing node the real walk covers everything, so crossing nodes under it are left out.
        """
        trie = self.trie
        pick = np.nonzero(byte_flags(first)[trie.byte[walked.node]])[0]
        nodes = walked.node[pick]
        order = np.lexsort((-trie.rank_end[nodes], trie.rank_start[nodes]))
        pick, start, end = pick[order], trie.rank_start[nodes[order]], trie.rank_end[nodes[order]]
        outer = np.ones(len(pick), dtype=bool)  # subtrees nest, so the outer ones come first
        outer[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
        pick = pick[outer]
        depths = walked.depth[pick]
        crossings = {}
        for d in np.unique(depths).tolist():
            mine = pick[depths == d]
            crossings[d] = (walked.node[mine], walked.group[mine])
        return crossings

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """Every allowed non-stop token of ``state`` and the state each one leads to.

        Walked by the C++ core where it is built; ``_walk`` is its twin (tests/test_native_walk.py).
        """
        native = self.trie.native_transitions(self.table, state)
        if native is not None:
            return native
        tokens, nexts, _ = self._walk(self._root_seeds(state))
        return tokens, nexts

    def _root_seeds(self, state: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Seeds of a whole walk from ``state``: every node of depth 0, entered from ``state``."""
        n = len(self.trie.levels[0].byte) if self.trie.levels else 0
        return {0: (np.arange(n), np.full(n, state, dtype=np.int32))}

    def _walk(self, seeds: dict[int, tuple[np.ndarray, np.ndarray]],
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

    def max_next_completion(self, state: int) -> float:
        """The longest shortest-completion over the states the allowed tokens lead to.

        A budget of that many bytes after the next token leaves the mask unchanged, so the
        budget-aware close only needs its own mask below it. Cached per state.
        """
        got = self._max_next.get(state)
        if got is None:
            _, nexts = self.transitions(state)
            got = 0.0
            if len(nexts):
                seen = np.zeros(int(nexts.max()) + 1, dtype=bool)
                seen[nexts] = True
                got = max(self.table.min_completion(int(e)) for e in np.nonzero(seen)[0])
            self._max_next[state] = got
        return got

    def budget_mask(self, state: int, max_bytes: float) -> np.ndarray:
        """Tokens after which the document can still be completed in at most ``max_bytes`` bytes."""
        table = self.table
        tokens, nexts = self.transitions(state)
        if len(tokens):
            fits = np.zeros(int(nexts.max()) + 1, dtype=bool)
            fits[nexts] = True
            for e in np.nonzero(fits)[0]:
                fits[e] = table.min_completion(int(e)) <= max_bytes
            tokens = tokens[fits[nexts]]
        return self._pack(tokens, self.is_accepting(state))

    def terminated_mask(self) -> np.ndarray:
        """The mask after a stop token: only stop tokens (engines pad finished rows with them)."""
        return self._pack(np.zeros(0, np.int64), True)

    def _pack(self, tokens: np.ndarray, accepting: bool) -> np.ndarray:
        allowed = np.zeros(self.n_words * 32, dtype=bool)
        allowed[tokens] = True
        if accepting:
            allowed[list(self.eos_token_ids)] = True
        return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every valid continuation of ``state`` starts with (jump-forward text)."""
        out = bytearray()
        s = state
        while len(out) < MAX_FORCED_BYTES and not self.table.nullable(s):
            row = self.table.row(s)
            live = np.nonzero(row)[0]
            if len(live) != 1:
                break
            out.append(int(live[0]))
            s = int(row[live[0]])
        return bytes(out)
