"""The token automaton: grammar states x vocabulary -> token masks and token transitions.

States are the interned expressions of ``constrain.derivatives``. A state's mask is computed the
first time some sequence reaches it, by one vectorised walk of the token trie, and cached; every
matcher of the compiled grammar shares the cache, so the steady state is a dictionary hit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from constrain.derivatives import NOTHING, ExprTable
from constrain.token_trie import TokenTrie, expand_ranges

DEFAULT_MASK_CACHE = 4096
# Splitting a state pays only when few tokens cross from the head into the tail: at most
# 1/SPLIT_MAX_CROSSING of the vocabulary, else the crossing walk costs as much as a plain one.
SPLIT_MAX_CROSSING = 8
SPLIT_DOES_NOT_PAY = object()
# A union state is masked member by member (each member's head walk cached) up to this many.
MAX_UNION_MEMBERS = 512

MAX_FORCED_BYTES = 4096

def _scatter(idx: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=values.dtype)
    out[idx] = values
    return out


_tries: dict[object, TokenTrie] = {}
# Head walks of rule-free heads, shared by every grammar compiled for the same vocabulary.
_shared_heads: OrderedDict[tuple, object] = OrderedDict()
_tries_lock = threading.Lock()


def trie_for(vocab) -> TokenTrie:
    """The token trie of ``vocab``, built once per vocabulary and process."""
    key = getattr(vocab, "fingerprint", None) or id(vocab)
    with _tries_lock:
        trie = _tries.get(key)
        if trie is None:
            trie = _tries[key] = TokenTrie(vocab.token_bytes)
        return trie


class TokenAutomaton:
    """Masks and transitions over a vocabulary for one grammar; safe to share between threads."""

    def __init__(self, table: ExprTable, vocab, *, mask_cache_size: int = DEFAULT_MASK_CACHE) -> None:
        self.table = table
        self.vocab = vocab
        self.trie = trie_for(vocab)
        self._vocab_key = getattr(vocab, "fingerprint", None) or id(vocab)
        table.clamp_limit = max(self.trie.depth, 1)
        self.token_bytes = vocab.token_bytes
        self.eos_token_ids = tuple(vocab.eos_token_ids)
        self.n_words = (vocab.vocab_size + 31) // 32
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._max_next: dict[int, float] = {}
        self._heads: OrderedDict[tuple[int, int], tuple[np.ndarray, TokenTrie | None]] = OrderedDict()
        self._mask_cache_size = mask_cache_size
        self._lock = threading.RLock()

    @property
    def initial_state(self) -> int:
        return self.table.start

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
        with self._lock:
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

        The head is walked with the tail replaced by a marker that only records which first bytes
        the tail accepts. Tokens that stay inside the head are decided there, once for every
        state with the same head and the same tail first-bytes (every property of type string,
        every nesting depth of a recursive grammar). Only the few tokens that cross into the tail
        are walked again from the real state, over a small trie of just those tokens.
        """
        table = self.table
        parts = table.split(state)
        if parts is None:
            return None
        head, tail = parts
        if table.is_byte_set(head):  # a literal's next byte: the plain walk is already tiny
            return None
        first = table.first_bytes(tail)
        sig = table.signature(head)
        heads = self._heads if sig is None else _shared_heads
        key = (head, first) if sig is None else (self._vocab_key, sig, first)
        cached = heads.get(key)
        if cached is None:
            tokens, ends = self.transitions(table.seq(head, table.mark(first)))
            flags = np.zeros(int(ends.max(initial=0)) + 1, dtype=bool)
            flags[ends] = True
            for e in np.nonzero(flags)[0]:
                flags[e] = table.has_dep(int(e))
            crossing = flags[ends]
            inside = self._pack(tokens[~crossing], False)
            dependent = tokens[crossing]
            if len(dependent) * SPLIT_MAX_CROSSING > self.trie.size:
                cached = SPLIT_DOES_NOT_PAY  # most tokens cross: a plain walk is cheaper
            else:
                cached = (inside, self.trie.restrict(dependent))
            with _tries_lock:
                heads[key] = cached
                while len(heads) > self._mask_cache_size:
                    heads.popitem(last=False)
        if cached is SPLIT_DOES_NOT_PAY:
            return None
        inside, sub = cached
        crossing_tokens = self.transitions(state, sub)[0]
        return inside | self._pack(crossing_tokens, self.is_accepting(state))

    def transitions(self, state: int, trie: TokenTrie | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every allowed non-stop token of ``state`` and the state each one leads to.

        Walks the trie level by level. A level is handled sparsely (only children of live nodes)
        while few nodes are live, densely (one gather over the whole level) once many are.
        """
        table, levels = self.table, (trie or self.trie).levels
        if not levels or state == NOTHING:
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        tok_parts, next_parts = [], []
        with table.lock:
            table.ensure_rows((state,))
            idx: np.ndarray | None = None  # sparse: live node indices; dense: None
            st = table.rows[state, levels[0].byte]  # dense state per node (0 = dead)
            for depth, level in enumerate(levels):
                if idx is None:
                    live_tokens = st[level.end_nodes]
                    keep = np.nonzero(live_tokens)[0]
                    tok_parts.append(level.end_tokens[keep])
                    next_parts.append(live_tokens[keep])
                    live = np.count_nonzero(st)
                else:
                    ends, counts = expand_ranges(level.tok_start[idx], level.tok_end[idx])
                    tok_parts.append(level.end_tokens[ends])
                    next_parts.append(np.repeat(st, counts))
                    live = len(idx)
                if depth + 1 == len(levels) or live == 0:
                    break
                child = levels[depth + 1]
                if live * 8 >= len(level.byte):  # dense step
                    dense = st if idx is None else _scatter(idx, st, len(level.byte))
                    parent_states = dense[child.parent]
                    self._ensure_rows(parent_states)
                    st, idx = table.rows[parent_states, child.byte], None
                else:  # sparse step
                    if idx is None:
                        idx = np.nonzero(st)[0]
                        st = st[idx]
                    children, counts = expand_ranges(level.child_start[idx], level.child_end[idx])
                    parent_states = np.repeat(st, counts)
                    self._ensure_rows(parent_states)
                    nxt = table.rows[parent_states, child.byte[children]]
                    keep = np.nonzero(nxt)[0]
                    idx, st = children[keep], nxt[keep]
        tokens = np.concatenate(tok_parts).astype(np.int32, copy=False)
        return tokens, np.concatenate(next_parts).astype(np.int32, copy=False)

    def _ensure_rows(self, states: np.ndarray) -> None:
        done = self.table.row_done
        if len(done) > 0 and states.max(initial=0) < len(done):
            missing = states[~done[states]]
        else:
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
