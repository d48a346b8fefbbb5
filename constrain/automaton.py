"""The token automaton: grammar states x vocabulary -> token masks and token transitions.

States are the interned expressions of ``constrain.derivatives``. A state's mask is computed the
first time some sequence reaches it, by a walk of the token trie (``constrain.walkers``: in C++
where the core is built, else its numpy twin), and cached; every matcher of the compiled grammar
shares the cache, so the steady state is a dictionary hit.

States that differ only in repetition counts share one walk, but for the few longest tokens
(``TokenAutomaton.mask``).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from constrain.cache import ByteBudgetCache
from constrain.derivatives import NOTHING, ExprTable
from constrain.token_trie import TokenTrie
from constrain.walkers import HeadWalk, NativeWalker, NumpyWalker, pack_tokens

DEFAULT_MASK_CACHE = 4096
# A union state is masked member by member (each member's head walk cached) up to this many.
MAX_UNION_MEMBERS = 512
# ... and a union of unions of framed members (``_frames_mask``) up to this many (frame, tail) pairs.
MAX_FRAME_PAIRS = 4096

MAX_FORCED_BYTES = 4096

# A head that starts with fewer bytes is masked by a plain walk the first time it is met. Such a
# walk enters few subtrees (a key's or a literal's rest, a digit, punctuation), so it is cheap,
# while a head walk costs 3x as much and most narrow heads are never met again (JSON-schema
# replays of a model's outputs); one met again (objects repeated in an array) is split from then on.
# (Its structure signature, which shares a head's walk between grammars, is not computed either:
# in a cold replay it cost more than the masks.)
MIN_SPLIT_BYTES = 16

# Tokens longer than the clamp limit are walked apart, per state; the limit keeps them this few.
MAX_LONG_TOKENS = 256


@dataclass(frozen=True)
class LongTokens:
    """A vocabulary's few longest tokens, apart from the rest: what clamping repetition counts
    (``ExprTable.clamp``) at ``limit`` bytes rather than at the longest token needs.

    A few long tokens (whitespace runs, rows of dashes: 81 bytes in SmolLM2, 128 in Llama-3) would
    otherwise set the limit, and a string with ``maxLength`` 100 would take a full walk at every
    count below it.
    """

    limit: int  # the smallest limit >= 1 with at most MAX_LONG_TOKENS tokens longer
    longest: int  # bytes of the longest token: clamping there is exact for every token
    short: np.ndarray  # mask words of the tokens of at most ``limit`` bytes
    trie: TokenTrie | None  # the tokens longer than ``limit`` (same ids, the others None); None if there are none

    @classmethod
    def of(cls, token_bytes: Sequence[bytes | None], n_words: int) -> LongTokens:
        lengths = np.fromiter((len(b) if b else 0 for b in token_bytes), dtype=np.int64, count=len(token_bytes))
        ranked = np.sort(lengths)[::-1]
        limit = max(int(ranked[MAX_LONG_TOKENS]) if len(ranked) > MAX_LONG_TOKENS else 0, 1)
        short = pack_tokens(np.nonzero((lengths > 0) & (lengths <= limit))[0], n_words)
        longest = max(int(ranked[0]) if len(ranked) else 0, 1)
        if not np.any(lengths > limit):
            return cls(limit, longest, short, None)
        return cls(limit, longest, short, TokenTrie([b if b and len(b) > limit else None for b in token_bytes]))


class _Walked(NamedTuple):
    """A head's cached walk, with the cache and key it lives under (crossings are cached beside it)."""

    head: int
    walk: HeadWalk
    cache: ByteBudgetCache
    key: tuple[Hashable, ...]

    @property
    def words(self) -> np.ndarray:
        """The tokens allowed within the head (shared: never changed)."""
        return self.walk[0]


class TokenAutomaton:
    """Masks and transitions over a vocabulary for one grammar; safe to share between threads.

    ``shared`` is the compiler context's cache: the vocabulary's trie and the head walks of
    rule-free heads, shared by every grammar the context compiles for the same vocabulary.
    ``native`` picks the walker: the C++ one (None: where the core is built) or its numpy twin.
    """

    def __init__(self, table: ExprTable, vocab, shared: ByteBudgetCache, *,
                 mask_cache_size: int = DEFAULT_MASK_CACHE, native: bool | None = None) -> None:
        self.table = table
        self.vocab = vocab
        self._vocab_key = vocab.fingerprint
        self.shared = shared
        self.trie: TokenTrie = shared.get_or_make(("trie", self._vocab_key), lambda: TokenTrie(vocab.token_bytes))
        self.token_bytes = vocab.token_bytes
        self.eos_token_ids = tuple(vocab.eos_token_ids)
        self.n_words = (vocab.vocab_size + 31) // 32
        self.long_tokens: LongTokens = shared.get_or_make(
            ("long tokens", self._vocab_key), lambda: LongTokens.of(vocab.token_bytes, self.n_words))
        if native is None:
            native = self.trie.packed is not None
        walker = NativeWalker if native else NumpyWalker
        self.walker: NativeWalker | NumpyWalker = walker(self.trie, table, self.n_words)
        # Walks of the long tokens alone, from a state whose counts clamping changed (clamped at
        # the longest token), and their masks per such clamped state.
        long_trie = self.long_tokens.trie
        self._long_walker = None if long_trie is None else walker(long_trie, table, self.n_words)
        self._long_masks = ByteBudgetCache(max_entries=mask_cache_size)
        self._masks: dict[int, np.ndarray] = {}  # oldest first; a plain dict, never tracked by the collector
        self._max_next: dict[int, float] = {}
        # Per state, the budget-aware close's levels, and its masks where asked (``_close_levels``),
        # as many masks in all as the mask cache holds.
        self._closes = ByteBudgetCache(max_bytes=mask_cache_size * self.n_words * 4)
        self._heads = ByteBudgetCache(max_entries=mask_cache_size)  # head walks and their crossings per first bytes
        self._head_states = ByteBudgetCache(max_entries=mask_cache_size)  # per head: its states at paths
        self._narrow_seen: dict[int, None] = {}  # narrow heads met once (``_split_mask``; a dict of ints: untracked)
        self._mask_cache_size = mask_cache_size
        self._lock = threading.RLock()

    @property
    def initial_state(self) -> int:
        return self.table.start

    def estimated_bytes(self) -> int:
        """A rough estimate of this grammar's memory: its table and its cached masks."""
        return (self.table.estimated_bytes() + len(self._masks) * self.n_words * 4 + self._closes.nbytes
                + self._long_masks.nbytes)

    def is_accepting(self, state: int) -> bool:
        """Whether the document may end here (a stop token is allowed)."""
        return self.table.nullable(state)

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token``, or -1 when the mask forbids it (stop tokens excluded)."""
        after = self.walk(state, (token,))
        return after[0] if after else -1

    def walk(self, state: int, tokens: Iterable[int]) -> list[int]:
        """The states after each of ``tokens`` in turn from ``state``, up to the first one the
        mask forbids (stop tokens included): ``next_state`` for a run of tokens, at two thirds of
        its cost per token (a matcher catching up with tokens an engine already took)."""
        tb, step = self.token_bytes, self.table.step_bytes
        size = len(tb)
        out: list[int] = []
        for t in tokens:
            data = tb[t] if 0 <= t < size else None
            if not data:
                break
            state = step(state, data)
            if state == NOTHING:
                break
            out.append(state)
        return out

    def mask(self, state: int) -> np.ndarray:
        """The allowed-token bitmask words (int32) of ``state``, stop tokens included.

        States differing only in repetition counts share the walk of their clamped state (every
        count cut to ``long_tokens.limit``, see ``ExprTable.clamp``): a token of at most that many
        bytes is allowed in one exactly when in the other. The few longer tokens are walked from
        the state clamped at the longest token (shared in turn by the states with counts beyond
        it), so the mask is exact: the clamped state's for the short tokens, the long walk's for
        the rest. (With no longer tokens, the clamped state's mask is the state's.)
        """
        got = self._masks.get(state)
        if got is not None:
            return got
        with self._lock, self.table.work():  # a new state's mask is bounded by the compile budget
            long_tokens = self.long_tokens
            key = self.table.clamp(state, long_tokens.limit)
            got = self._masks.get(key)
            if got is None:
                got = self._union_mask(key)
                if got is None:
                    got = self._split_mask(key)
                if got is None:
                    got = self._with_stops(self.walker.mask(key), self.is_accepting(key))
                self._masks[key] = got
            if key != state and self._long_walker is not None:
                walker, long_key = self._long_walker, self.table.clamp(state, long_tokens.longest)
                words = (got & long_tokens.short) | self._long_masks.get_or_make(long_key, lambda: walker.mask(long_key))
                words = self._with_stops(words, self.is_accepting(state))
                if not np.array_equal(words, got):  # else (counts past the longest token) one array serves both
                    got = words
            self._masks[state] = got
            masks = self._masks
            while len(masks) > self._mask_cache_size:
                del masks[next(iter(masks))]
            return got

    def mask_is_cached(self, state: int, max_bytes: float | None = None) -> bool:
        """Whether ``mask(state)`` is a cache hit and, with ``max_bytes`` (the budget-aware close),
        whether that budget is known to leave the mask unchanged."""
        if state not in self._masks:
            return False
        if max_bytes is None:
            return True
        got = self._max_next.get(state)
        return got is not None and got <= max_bytes

    def _union_mask(self, state: int) -> np.ndarray | None:
        """Mask of ``a | b | ...`` as the union of the members' masks.

        Pays when members are ``FRAME(...) tail`` states (object members in any order, rules
        alive side by side): each member's head walk is cached and shared, where a walk of the
        union itself would be new for every combination of members. Where the union starts with
        few bytes (the rest of an object's next key), the members are walked together (about half
        the cost of one walk each, on 300 JSONSchemaBench schemas), and of them only their frames
        (``_keys_words``: their rows serve every set of keys left); so are the members whose heads
        start with few bytes beside a pattern's or any key's member.
        """
        table = self.table
        members = table.alternatives(state)
        if members is None or len(members) > MAX_UNION_MEMBERS:
            return None
        if self._narrow(state):  # an object's next key: its frames walked together, or the plain walk
            if not all([table.is_framed(m) for m in members]):
                return None
            return self._with_stops(self._keys_words(members), self.is_accepting(state))
        if not any([table.is_framed(m) for m in members]):
            return self._frames_mask(state, members)
        out = np.zeros(self.n_words, dtype=np.int32)
        keys = []  # members whose head starts with few bytes (the rest of a key): walked together
        for m in members:
            # Members are rarely met again (they differ in what comes after): not cached. A split
            # member's shared words are ORed in as they are (no copy, no stop tokens of its own:
            # the union may end exactly where a member may).
            got = self._masks.get(m)
            if got is None:
                halves = table.split(m)
                if halves is not None and self._narrow(halves[0]):
                    keys.append(m)
                    continue
                parts = self._split_parts(m)
                if parts is not None:
                    for words in parts:
                        np.bitwise_or(out, words, out=out)
                    continue
                got = self.mask(m)
            np.bitwise_or(out, got, out=out)
        if keys:  # (Github_ultra/o13934: 165 keys beside a pattern's, 27 ms one by one)
            np.bitwise_or(out, self._keys_words(keys), out=out)
        return self._with_stops(out, self.is_accepting(state))

    def _keys_words(self, members: Sequence[int]) -> np.ndarray:
        """The words (stop tokens apart) of a union of framed members whose heads start with few
        bytes (the rest of an object's next key: ``FRAME(key": value) remainder`` each), from one
        walk of the union of their frames alone.

        A walk of the members themselves derives every key prefix under every member's remainder,
        and the remainders differ in every state of the object (each set of keys left is another
        union): 300-700 µs a state for 47 keys, all of it new expressions. The frames' derivatives
        are the same in every such state, so their rows are filled once; only the unions of the
        few frames a prefix leaves alive are new. Tokens that cross from a frame into what follows
        (a key, its value and more) are walked below the crossing nodes from the real states
        there, as in ``_split_parts``.
        """
        table, walker = self.table, self.walker
        halves = [table.split(m) for m in members]
        walked = walker.head(table.alt([h[0] for h in halves if h is not None]))  # (not cached: the union is new)
        words = walked[0]
        if len(walked[1]):
            first = 0
            for tail in {h[1] for h in halves if h is not None}:
                first |= table.first_bytes(tail)
            nodes, group = walker.crossings(walked, first)
            if len(nodes):
                union = table.alt(list(members))
                parents = np.array([table.derive_bytes(union, path) for path in walked[3]], dtype=np.int32)
                words = words | walker.below(nodes, parents[group])
        return words

    def _narrow(self, e: int) -> bool:
        """Whether ``e`` starts with fewer than ``MIN_SPLIT_BYTES`` bytes: its walk meets few tokens."""
        return self.table.first_bytes(e).bit_count() < MIN_SPLIT_BYTES

    def _split_mask(self, state: int) -> np.ndarray | None:
        """Mask of ``head tail`` from a walk of ``head`` that is shared by every tail (see
        ``_split_parts``); None where it does not split."""
        parts = self._split_parts(state)
        if parts is None:
            return None
        words = parts[0] | parts[1] if len(parts) > 1 else parts[0].copy()
        return self._with_stops(words, self.is_accepting(state))

    def _split_parts(self, state: int) -> tuple[np.ndarray, ...] | None:
        """The words of ``head tail`` from a walk of ``head`` that is shared by every tail: the
        head walk's (shared: not to be changed) and, where tokens cross into the tail, those; stop
        tokens apart. None where the state does not split.

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
        if self._narrow(head) and head not in self._narrow_seen:
            self._narrow_seen[head] = None  # a narrow head met once: the plain walk (no signature either)
            return None
        walked = self._head_walk(head)
        crossed = self._crossed(walked, tail)
        return (walked.words,) if crossed is None else (walked.words, crossed)

    def _head_walk(self, head: int) -> _Walked:
        """The walk of ``head`` alone, cached: per grammar, or per structure signature in the
        shared cache (every grammar of the vocabulary)."""
        table, walker = self.table, self.walker
        sig = table.signature(head)
        heads: ByteBudgetCache
        key: tuple[Hashable, ...]
        if sig is None:
            heads, key = self._heads, (head,)
        else:  # the signature table is part of the key: its ids mean nothing to another table
            heads, key = self.shared, ("head", self._vocab_key, walker.kind, table.signatures, sig)
        return _Walked(head, heads.get_or_make(key, lambda: walker.head(head)), heads, key)

    def _crossed(self, walked: _Walked, tail: int) -> np.ndarray | None:
        """The words of the tokens that cross from ``walked``'s head into ``tail`` (the subtrees
        below the crossing nodes, walked from the real states there); None where none can."""
        table, walker, head, key = self.table, self.walker, walked.head, walked.key
        if not len(walked.walk[1]):  # (a key's literal: no token crosses into what follows)
            return None
        first = table.first_bytes(tail)
        nodes, group = walked.cache.get_or_make((*key, first), lambda: walker.crossings(walked.walk, first))
        if not len(nodes):
            return None
        # The head's states at the crossing nodes' parents, in this grammar's table (a shared walk
        # may come from another grammar).
        paths = walked.walk[3]
        starts = self._head_states.get_or_make(key, lambda: tuple(table.derive_bytes(head, path) for path in paths))
        parents = np.array([table.seq(h, tail) for h in starts], dtype=np.int32)
        return walker.below(nodes, parents[group])

    def _frames_mask(self, state: int, members: Sequence[int]) -> np.ndarray | None:
        """Mask of a union of unions of framed members, each under its own tail (an object's
        members in any order under each branch of an ``anyOf``, ``if``/``then`` or
        ``dependencies``: ``({k1 ...|k2 ...} "}") | ({k1 ...|k3 ...} "}") ...``), from one head
        walk per distinct frame; None where the state is not such a union.

        The same frames recur under every branch with other remainders, and a walk of the union
        derives each (key prefix, branch) pair: after ``{"`` of a 45-key manifest schema with 9
        branches, 10,851 new expressions and 16-24 ms. A frame's head walk is shared by every
        branch and every later state of the object, and a tail is built only where a token can
        cross into it. Taken where frames recur (at least two members per frame); a union of
        distinct framed members is ``_union_mask``'s.
        """
        table = self.table
        first = table.split(members[0])
        if first is None or table.alternatives(first[0]) is None:
            return None  # (the usual union: no member is a union under a tail)
        frames: dict[int, list[tuple[int, ...]]] = {}  # frame -> its tails, innermost first
        work: list[tuple[int, tuple[int, ...]]] = [(m, ()) for m in members]
        pairs = 0
        while work:
            e, tails = work.pop()
            inner = table.alternatives(e)
            if inner is not None:
                work += [(m, tails) for m in inner]
                continue
            parts = table.split(e)
            if parts is None:
                return None
            head, tail = parts
            if table.is_framed(e):
                frames.setdefault(head, []).append((tail, *tails))
            elif table.alternatives(head) is not None:
                work.append((head, (tail, *tails)))
            else:
                return None
            pairs += 1
            if pairs > MAX_FRAME_PAIRS:
                return None
        if pairs < 2 * len(frames):
            return None
        out = np.zeros(self.n_words, dtype=np.int32)
        for head, chains in frames.items():
            walked = self._head_walk(head)
            np.bitwise_or(out, walked.words, out=out)
            if not len(walked.walk[1]):
                continue  # (no token crosses into any of its tails)
            for chain in chains:
                tail = chain[-1]
                for inner_tail in reversed(chain[:-1]):
                    tail = table.seq(inner_tail, tail)
                crossed = self._crossed(walked, tail)
                if crossed is not None:
                    np.bitwise_or(out, crossed, out=out)
        return self._with_stops(out, self.is_accepting(state))

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """Every allowed non-stop token of ``state`` and the state each one leads to."""
        return self.walker.transitions(state)

    def max_next_completion(self, state: int) -> float:
        """The longest shortest-completion over the states the allowed tokens lead to.

        A budget of that many bytes after the next token leaves the mask unchanged, so the
        budget-aware close only needs its own mask below it. Cached per state.
        """
        got = self._max_next.get(state)
        if got is None:
            levels = self.next_completions(state)
            got = self._max_next[state] = levels[-1] if levels else 0.0
        return got

    def next_completions(self, state: int) -> list[float]:
        """The distinct shortest completions (bytes), ascending, of the states the allowed
        non-stop tokens lead to: the budgets at which the budget-aware mask changes."""
        return self._closes.get_or_make(("levels", state), lambda: self._close_levels(state)[0])

    def budget_mask(self, state: int, max_bytes: float) -> np.ndarray:
        """Tokens after which the document can still be completed in at most ``max_bytes`` bytes."""
        levels, masks = self._closes.get_or_make(("masks", state), lambda: self._close_levels(state, masks=True))
        k = bisect.bisect_right(levels, max_bytes)
        words = masks[k - 1].copy() if k else np.zeros(self.n_words, np.int32)
        return self._with_stops(words, self.is_accepting(state))

    def _close_levels(self, state: int, masks: bool = False) -> tuple[list[float], list[np.ndarray]]:
        """``next_completions(state)`` and, with ``masks``, per level the mask of the tokens whose
        next state's shortest completion is at most that level (stop tokens apart): one walk of
        the vocabulary for every level. Why all levels at once: a close is asked at one level and,
        as the budget shrinks, at the lower ones; each asked alone walked the whole vocabulary
        again (~1 ms a walk of a wide state on a 128k vocabulary). Why the levels alone first:
        most states asked whether the close binds never need its masks."""
        tokens, nexts = self.transitions(state)
        if not len(tokens):
            return [], []
        seen = np.zeros(int(nexts.max()) + 1, dtype=bool)  # (a state-indexed table: no sort of the tokens)
        seen[nexts] = True
        distinct = np.flatnonzero(seen)
        completions = np.array([self.table.min_completion(int(e)) for e in distinct])
        levels = np.unique(completions)
        out: list[np.ndarray] = []
        if masks:
            level_of = np.zeros(len(seen), dtype=np.uint16 if len(levels) < 1 << 16 else np.int64)
            level_of[distinct] = np.searchsorted(levels, completions)
            level = level_of[nexts]
            order = np.argsort(level, kind="stable")  # (a radix sort of 16-bit keys)
            cuts = np.searchsorted(level[order], np.arange(len(levels)), side="right")
            words, start = np.zeros(self.n_words, np.int32), 0
            for cut in cuts.tolist():
                words = words | pack_tokens(tokens[order[start:cut]], self.n_words)
                out.append(words)
                start = cut
        return [float(v) for v in levels], out

    def terminated_mask(self) -> np.ndarray:
        """The mask after a stop token: only stop tokens (engines pad finished rows with them)."""
        return self._pack(np.zeros(0, np.int64), True)

    def _pack(self, tokens: np.ndarray, accepting: bool) -> np.ndarray:
        return self._with_stops(pack_tokens(tokens, self.n_words), accepting)

    def _with_stops(self, words: np.ndarray, accepting: bool) -> np.ndarray:
        """``words`` (a fresh array: changed in place) with the stop tokens' bits set if ``accepting``."""
        if accepting:
            for t in self.eos_token_ids:
                words.view(np.uint32)[t >> 5] |= np.uint32(1 << (t & 31))
        return words

    def forced_bytes(self, state: int) -> bytes:
        """The bytes every valid continuation of ``state`` starts with (jump-forward text)."""
        return self.table.forced_bytes(state, MAX_FORCED_BYTES)
