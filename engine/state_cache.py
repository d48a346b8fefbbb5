"""Constraint states of every grammar in one GPU ``StateTable``, filled lazily by the host.

Why one table for all grammars: the fused sampler reads one mask table by per-row index, and a
batch mixes requests with different constraints. Each (grammar, local state) gets a dense
global row id the first time it is seen; the table's hash maps (global state, token) to the
global next state. Rows and transitions come from constrain (``state_mask``, ``next_state``,
``state_transitions``): this module never computes a mask itself.

Misses (a (state, token) pair or a next state the table does not hold yet) are resolved here,
in one batch per step. The ``EXPAND_ON_MISS``-th step that misses out of a state also loads
*all* its transitions in one vectorised call (``state_transitions``), so later steps through
that state need no host work. Not sooner: most states are left a few times and never met again,
and the bulk load is a walk of the whole vocabulary plus hashing (~2-10 ms), where a miss costs
one ``next_state``; rows missing out of one state in the same step count once (rows of one
schema writing the same text meet each state together). Replayed engine-bench outputs (SmolLM2,
256 rows, CPU): loading at the 2nd step 53 loads, 389 ms of host work; at the 8th 9 loads, 199 ms.
How a load is stored:
- small states (keys, punctuation, enum values: few tokens, few next states): every pair goes
  into the hash; a next state's mask row is stored when a row first reaches it (the table
  reports a pair whose target row is absent as a miss), because computing the rows of all up
  to 64 targets up front cost 15-20 ms of host time per expansion, mostly for states no
  sequence ever visits;
- wide states (string bodies: ~120k allowed tokens, ~99% of them back into the same state):
  the most common next state becomes the state's *default* (``StateTable.set_default``) and only
  the other pairs (a few hundred to a few thousand) are hashed. Hashing all ~120k pairs instead
  cost ~100 ms of host time per state, and filling them one miss at a time missed almost every
  step with random weights (up to 10,589 host round trips per run on the H200).
A wide state whose tokens spread over many next states with no dominant one (bounded-length
strings) stays lazy: one (state, token) pair per miss.

The budget-aware close (``close``): near the end of a budget a row's mask is its state's with
the tokens removed whose next state's shortest completion no longer fits. That mask depends on
the budget only through how many of the next states' distinct completion lengths fit
(``constrain.matcher.budget_level``), so it is stored once per (state, level) as a row of its
own, which leaves by its state's transitions (``StateTable.set_alias``): a row under the close
costs a dictionary lookup and a state patch per step, and its sampled token advances on the GPU
like any other. Why not per-token completion lengths on the GPU (mask AND length[next[s, t]] <=
left): that needs every transition of a state in the table (most states load theirs lazily, a
string body has ~120k) and a lookup per vocabulary token per row, where the close mask is
shared by every budget of its level and by every request at that state.

Drafts (``Scheduler._draft``) walk through the same cache on the host: ``successor`` (the
(state, token) pairs the host resolved), ``row`` (a state's mask row, also kept on the host to
test a draft token's bit), ``min_completion`` / ``binds`` / ``close`` (the budget-aware close)
and ``token_row`` (one-token rows: forced text riding along a draft), so verification gathers
every position's mask by its table row and the walk makes no matcher call at states it has
seen. What the cache does not know yet it learns from a matcher standing at the state (an
``at()`` callback: the row's matcher walked there), once per state for every request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from constrain import CompiledGrammar
from constrain.kernels import StateTable
from constrain.matcher import TERMINATED, budget_level

EXPAND_ON_MISS = 8  # the step missing out of a state that loads all its transitions (see the docstring)
EXPAND_MAX_NEXT = 64  # load all transitions of a state when they reach at most this many states
EXPAND_MAX_TOKENS = 4096  # ... and it allows at most this many tokens; wider states get a default
MAX_EXCEPTIONS = 16384  # a wide state gets a default when at most this many tokens leave it elsewhere


class StateSource(Protocol):
    """What the cache asks of a matcher standing at a state it learns (``Matcher``'s verbs)."""

    @property
    def state(self) -> int: ...

    def fill_next_token_bitmask(self, bitmask: np.ndarray, index: int = 0) -> None: ...

    def min_completion_bytes(self) -> float: ...

    def next_completions(self) -> list[float]: ...


At = Callable[[], StateSource]  # a matcher standing at the state asked about (walked there on demand)


class StateCache:
    """Global state ids over several compiled grammars, backed by one ``kernels.StateTable``.

    Ids ``0..scratch_rows-1`` are not grammar states: batch row ``i`` writes a mask of its own
    there (a matcher with no compiled grammar) and points its state at it; no transition leaves
    them, so the step after always misses back to the host. Close rows (``close``) and token
    rows (``token_row``) are masks of their own too, never a state a row stands in; chain rows
    (``chain``) are, for one step each.
    """

    def __init__(self, mask_words: int, device: torch.device | str, states: int = 1024,
                 transitions: int = 1 << 16, scratch_rows: int = 0) -> None:
        self.table = StateTable(mask_words, device=device, state_capacity=states, transition_capacity=1024)
        self.table.reserve(states, transitions)
        self._grammars: dict[int, tuple[CompiledGrammar, int]] = {}  # id(cg) -> (cg, index)
        self._ids: dict[tuple[int, int], int] = {}  # (grammar index, local) -> global
        self.scratch_rows = scratch_rows
        # global - scratch_rows -> (cg, local); a close row maps to its state's, a token row to None
        self._where: list[tuple[CompiledGrammar, int] | None] = []
        self._misses_out: dict[int, int] = {}  # state -> misses out of it so far
        self._host: dict[int, np.ndarray] = {}  # row id -> its mask words, for every row in the table
        self._default: dict[int, int] = {}  # global id -> its default next global id
        self._succ: dict[tuple[int, int], int] = {}  # (global id, token) -> next global id, host-resolved
        self._min: dict[int, float] = {}  # global id -> its min_completion_bytes()
        self._levels: dict[int, list[float]] = {}  # global id -> its next_completions()
        self._close: dict[tuple[int, int], int] = {}  # (global id, budget level) -> close row id
        self._close_at: dict[tuple[int, int], int] = {}  # (global id, tokens left) -> close row id
        self._tokens: dict[int, int] = {}  # token -> the row allowing only it
        self._chains: dict[tuple[int, tuple[int, ...]], int] = {}  # (row, forced tokens) -> ``chain``'s row
        # Per state, what the scheduler derives once and every later run over this backend reuses
        # (the cache knows no tokenizer and no budget margin): the canonical tokens of the state's
        # forced text, and the bytes left from which its budget-aware close is its plain mask
        # with whether that bound is exact (``Scheduler._budget_row``).
        self.forced: dict[int, list[int]] = {}
        self.plain_from: dict[int, tuple[float, bool]] = {}
        self.misses = 0
        self.expansions = 0
        self.defaults = 0  # wide states given a default next state
        self.close_rows = 0  # close masks computed (once per state and budget level)
        self.chain_rows = 0  # one-token rows of forced text taken a token a step (``chain``)

    def enter(self, cg: CompiledGrammar, local: int) -> int:
        """Global id of ``cg``'s state ``local``, its mask row stored (a row starts or jumps there)."""
        gid = self.state_id(cg, local)
        if gid not in self._host:
            self._store([gid])
        return gid

    def local(self, gid: int) -> int:
        """The grammar's own id of state ``gid`` (``TERMINATED`` after a stop token)."""
        return self._state(gid)[1]

    def successor(self, gid: int, token: int) -> int | None:
        """The state after ``token`` where the host resolved the pair already, else None."""
        return self._succ.get((gid, token))

    def learn_successor(self, gid: int, token: int, local: int) -> int:
        """Record that ``token`` leads ``gid`` to its grammar's state ``local`` (a matcher took
        it); returns that state's global id."""
        nxt = self._succ[(gid, token)] = self.state_id(self._state(gid)[0], local)
        return nxt

    def walk(self, gid: int, tokens: Sequence[int]) -> int | None:
        """The state after ``tokens`` from ``gid`` (forced text), its mask row stored; None where
        the grammar refuses one. Each pair is resolved by the grammar once and then remembered
        (``successor``): forced text met again costs dictionary lookups."""
        for t in tokens:
            nxt = self._next(gid, t)
            if nxt is None:
                return None
            gid = nxt
        if gid not in self._host:
            self._store([gid])
        return gid

    def _next(self, gid: int, token: int) -> int | None:
        """``walk``'s one step, no mask row stored."""
        nxt = self._succ.get((gid, token))
        if nxt is None:
            cg, local = self._state(gid)
            local = cg.next_state(local, token)
            if local < 0:
                return None
            nxt = self.learn_successor(gid, token, local)
        return nxt

    def chain(self, gid: int, tokens: Sequence[int]) -> int | None:
        """Id of the row where forced text ``tokens`` is taken a token a step from state ``gid``
        (``Scheduler._force``'s tail): a row per token whose mask is that token alone and whose
        one transition leads to the next token's row, the last to the state after the text (its
        mask row stored); each row stands for the state it is taken at (``local``). None where the
        grammar refuses a token. Built once per (state, text); asked again of a chain's own row,
        it answers that row (a row stepping along its tail on the GPU needs no patch)."""
        key = (gid, tuple(tokens))
        got = self._chains.get(key)
        if got is not None or not tokens:
            return got
        states = [gid]
        for t in tokens:
            nxt = self._next(states[-1], t)
            if nxt is None:
                return None
            states.append(nxt)
        end = states[-1]
        self._store([end])
        rows = [self._new_row(self._state(g)) for g in states[:-1]]
        for j in range(len(tokens)):
            rest = tuple(tokens[j:])
            self._chains[(states[j], rest)] = self._chains[(rows[j], rest)] = rows[j]
        self._add_rows(rows, self._one_hot(tokens))
        self.chain_rows += len(rows)
        self.table.add_transitions(np.array(rows), np.array(tokens), np.array(rows[1:] + [end]))
        return rows[0]

    def row(self, gid: int, at: At) -> np.ndarray:
        """State ``gid``'s mask words (its row stored first if it is not): the state after a stop
        token has no grammar state, so its row comes from the matcher there."""
        got = self._host.get(gid)
        if got is None:
            if self.local(gid) == TERMINATED:
                words = np.zeros((1, self.table.words), dtype=np.int32)
                at().fill_next_token_bitmask(words, 0)
                self._add_rows([gid], words)
            else:
                self._store([gid])
            got = self._host[gid]
        return got

    def host_row(self, row: int) -> np.ndarray:
        """The mask words of a row already in the table (a state's, a close or a token row)."""
        return self._host[row]

    def min_completion(self, gid: int, at: At) -> float:
        """State ``gid``'s ``min_completion_bytes()``."""
        got = self._min.get(gid)
        if got is None:
            got = self._min[gid] = at().min_completion_bytes()
        return got

    def max_next_completion(self, gid: int, at: At) -> float:
        """The longest of ``gid``'s next states' shortest completions (-inf with none): the close
        binds exactly where the bytes left after the next token fall below it."""
        levels = self._next_completions(gid, at)
        return levels[-1] if levels else float("-inf")

    def close(self, gid: int, at: At, tokens_left: int, fill: Callable[[], np.ndarray]) -> int:
        """Id of the row holding state ``gid``'s budget-aware close mask at ``tokens_left`` (the
        close binds there). ``fill()`` computes the mask (the host rule, fallback included) the
        first time the state meets the budget's level; if it raises, nothing is stored."""
        cid = self._close_at.get((gid, tokens_left))
        if cid is not None:
            return cid
        key = (gid, budget_level(self._next_completions(gid, at), tokens_left))
        cid = self._close.get(key)
        if cid is None:
            words = np.array(fill(), dtype=np.int32).reshape(1, -1)
            cid = self._close[key] = self._new_row(self._state(gid))
            self._add_rows([cid], words)
            self.table.set_alias(cid, gid)
            self.close_rows += 1
        self._close_at[(gid, tokens_left)] = cid
        return cid

    def token_row(self, token: int) -> int:
        """Id of a row allowing ``token`` alone (the mask of forced text riding along a draft)."""
        tid = self._tokens.get(token)
        if tid is None:
            tid = self._tokens[token] = self._new_row(None)
            self._add_rows([tid], self._one_hot([token]))
        return tid

    def _one_hot(self, tokens: Sequence[int]) -> np.ndarray:
        """Mask rows (len(tokens), words), row j allowing ``tokens[j]`` alone."""
        t = np.asarray(tokens, dtype=np.int64)
        words = np.zeros((len(t), self.table.words), dtype=np.uint32)
        words[np.arange(len(t)), t >> 5] = np.left_shift(np.uint32(1), (t & 31).astype(np.uint32))
        return words.view(np.int32)

    def write_scratch(self, rows: Sequence[int], masks: torch.Tensor) -> None:
        """Mask rows ``masks`` (len(rows), words) into the scratch ids of batch ``rows``."""
        self.table.add_states(torch.as_tensor(rows), masks)

    def resolve(self, states: Sequence[int], tokens: Sequence[int]) -> list[int]:
        """Next global state of each (state, token) miss; -1 where the token is not allowed.

        Stores the rows and transitions in the table, so the same pair never misses again.
        """
        out, pairs, new = [], [], []
        for gid in set(states):  # rows standing in one state together count as one miss out of it
            seen = self._misses_out[gid] = self._misses_out.get(gid, 0) + 1
            if seen == EXPAND_ON_MISS:
                new.extend(self._expand(gid, *self._state(gid)))
        for gid, tok in zip(states, tokens):
            self.misses += 1
            cg, local = self._state(gid)
            nxt = cg.next_state(local, int(tok))
            if nxt < 0:
                out.append(-1)
                continue
            ng = self._succ[(gid, int(tok))] = self.state_id(cg, nxt)
            new.append(ng)
            if self._default.get(gid) != ng:  # the default needs no key
                pairs.append((gid, int(tok), ng))
            out.append(ng)
        self._store(new)
        if pairs:
            arr = np.array(pairs, dtype=np.int64)
            self.table.add_transitions(arr[:, 0], arr[:, 1], arr[:, 2])
        return out

    def _expand(self, gid: int, cg: CompiledGrammar, local: int) -> list[int]:
        """Load the transitions out of ``gid`` in one go (see the module docstring); returns the
        ids whose mask rows should be stored now."""
        toks, nxts = cg.state_transitions(local)
        if len(toks) == 0:
            return []
        nxts = np.asarray(nxts)
        distinct, counts = np.unique(nxts, return_counts=True)
        if len(toks) <= EXPAND_MAX_TOKENS:
            if len(distinct) > EXPAND_MAX_NEXT:
                return []
            keep = np.ones(len(toks), dtype=bool)
            dflt = None
        else:  # wide: default = the most common next state, hash the rest
            dflt = int(distinct[int(np.argmax(counts))])
            keep = nxts != dflt
            if int(keep.sum()) > MAX_EXCEPTIONS:
                return []
        self.expansions += 1
        glob = {int(n): self.state_id(cg, int(n)) for n in distinct}
        if keep.any():
            sub = nxts[keep]
            targets = np.fromiter((glob[int(n)] for n in sub), dtype=np.int64, count=len(sub))
            self.table.add_transitions(np.full(len(sub), gid), np.asarray(toks)[keep], targets)
        if dflt is None:
            return []  # targets' rows are stored on first visit (see the module docstring)
        # after every exception is hashed: from now on no token of gid misses (bar new rows)
        self.defaults += 1
        self._default[gid] = glob[dflt]
        self.table.set_default(gid, glob[dflt])
        return [glob[dflt]]  # other targets' rows are stored on their first (rare) visit

    def state_id(self, cg: CompiledGrammar, local: int) -> int:
        """Global id of ``cg``'s state ``local`` (no mask row stored: ``enter`` stores one)."""
        entry = self._grammars.get(id(cg))
        if entry is None:
            entry = self._grammars[id(cg)] = (cg, len(self._grammars))
        key = (entry[1], int(local))
        gid = self._ids.get(key)
        if gid is None:
            gid = self._ids[key] = self._new_row((cg, int(local)))
        return gid

    def _new_row(self, where: tuple[CompiledGrammar, int] | None) -> int:
        """A new dense row id, standing for ``where`` (None: no state's)."""
        self._where.append(where)
        return len(self._where) - 1 + self.scratch_rows

    def _state(self, gid: int) -> tuple[CompiledGrammar, int]:
        where = self._where[gid - self.scratch_rows]
        assert where is not None, f"row {gid} is a token row, not a state"
        return where

    def _next_completions(self, gid: int, at: At) -> list[float]:
        levels = self._levels.get(gid)
        if levels is None:
            levels = self._levels[gid] = at().next_completions()
        return levels

    def _store(self, gids: Sequence[int]) -> None:
        """Mask rows of the given states that the table does not hold yet."""
        todo = sorted({g for g in gids if g not in self._host})
        if todo:
            self._add_rows(todo, np.stack([cg.state_mask(local) for cg, local in map(self._state, todo)]))

    def _add_rows(self, ids: list[int], rows: np.ndarray) -> None:
        """Mask rows (len(ids), words) into the table, and their host copies."""
        self.table.add_states(torch.as_tensor(ids), torch.from_numpy(rows))
        self._host.update(zip(ids, rows))
