"""Brzozowski derivatives over the grammar IR: the byte-level automaton, explored lazily.

Every IR expression is interned ("hash-consed") into an ``ExprTable`` and gets an integer id, so
a parser state is just an id: the expression that remains to be matched. The derivative of an
expression by a byte is the expression that must match the rest of the input; equal remainders
share an id, which is what makes states cacheable across matchers and sequences.

Rule references (``Ref``) are expanded only when a derivative needs them, so recursion costs
memory proportional to the depth actually used: the chain of pending ``Seq`` tails *is* the
pushdown stack. Left recursion would expand forever; it is detected and reported.

Intersection and complement are native to derivatives; they are why a state that is not
``NOTHING`` can still have an empty language, so such states get an explicit liveness search.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple, Protocol, cast

import numpy as np

from constrain.budget import DEFAULT_BUDGET, DEFAULT_MAX_STATES, BudgetExceededError, CompileBudget
from constrain.cache import Signatures
from constrain.grammars import ir
from constrain.grammars.analysis import INFINITE, MAX_NESTING, MinLength, measure_rules, nesting_error
from constrain.grammars.errors import GrammarError

# Expression kinds.
K_NOTHING, K_EMPTY, K_BYTES, K_SEQ, K_ALT, K_AND, K_NOT, K_REPEAT, K_REF, K_FRAME, K_UNORDERED = range(11)
_NO_CUT = 1 << 62  # no cycle was cut below this node (see ``ExprTable.nullable``)

NOTHING = 0
EMPTY = 1
ALL_BYTES = (1 << 256) - 1

# How far a liveness search of an intersection/complement state may explore before giving up
# (and treating the state as live: a wrong guess can only stall a walk, never admit a bad byte).
LIVENESS_BUDGET = 4096
# The longest shortest string of a member tried as a witness of an intersection's life.
MAX_WITNESS_BYTES = 64
# States explored to bound the completions inside an intersection (``ExprTable.clamp``): a
# pattern's counted words under a maxLength keep ~60 states a word.
MAX_CLOSURE_STATES = 8192
# Rounds of ``ExprTable._clamp_intersection``'s search for the counts that may go.
MAX_CLAMP_ROUNDS = 4
# References a structure signature looks through: a piece worth sharing names a rule or two (a
# string's character), and the bound keeps a chain of thousands of rules off the Python stack.
SIGNATURE_REFS = 8
__all__ = ["DEFAULT_MAX_STATES", "ExprTable", "StateLimitError", "matches"]
# The time and memory budgets are checked once per this many new expressions (and per new row).
BUDGET_CHECK_EVERY = 256
# Rough bytes per interned expression (its lists, intern key and derivative entries), per
# transition row (the dense int32 row and its flags) and per cache entry, for the memory budget.
EXPR_BYTES = 400
ROW_BYTES = 256 * 4 + 2
ENTRY_BYTES = 64  # an entry of the clamp and closure caches


class StateLimitError(BudgetExceededError):
    """The constraint needs more automaton states than ``CompileBudget.max_states`` allows."""


class _Unordered(NamedTuple):
    """An ``ir.Unordered`` node as interned expressions; its states are ``(index, seen, count)``."""

    items: tuple[int, ...]
    required: int  # bitmask over items
    extra: int
    first: int
    sep: int
    last: int
    lo: int
    hi: int | None
    item_mins: list[float]  # shortest lengths (exact, as for rules)
    part_mins: tuple[float, float, float, float]  # extra, first, sep, last


class ExprTable:
    """Interned expressions, their derivatives and their byte transition rows.

    Thread-safe: every method that creates expressions takes ``self.lock``.
    """

    def __init__(self, grammar: ir.Grammar, *, budget: CompileBudget = DEFAULT_BUDGET,
                 signatures: Signatures | None = None) -> None:
        self.lock = threading.RLock()
        # Structure ids shared with the other grammars of one compiler context (see ``signature``).
        self.signatures = Signatures() if signatures is None else signatures
        self._byte_flags: dict[int, np.ndarray] = {}  # byte class -> its bytes as flags (rows fill by class)
        self.budget = budget
        self.max_states = budget.max_states
        self._deadline: float | None = None  # end of the current unit of work (see ``work``)
        self._level = 0  # current recursion depth of the methods that descend (see ``_descend``)
        self._kind: list[int] = []
        self._args: list[tuple] = []
        self._nullable: list[bool | None] = []
        self._boolean: list[bool] = []  # contains And/Not: language may be empty though not NOTHING
        self._counted: list[bool] = []  # contains a repetition with counted bounds
        self._clamped: dict[int, dict[int, int | None]] = {}  # limit -> e -> e clamped
        self._closure_bounds: dict[int, int] = {}  # see ``_closure_bound``
        self._sigs: dict[int, int | None] = {}
        self._intern: dict[tuple, int] = {}
        self._deriv: dict[int, int] = {}
        self._classes: dict[int, tuple[int, ...]] = {}
        self._live: dict[int, bool] = {}
        self._rule_ids = {name: i for i, name in enumerate(grammar.rules)}
        self._rule_names = list(grammar.rules)
        self._rule_nodes = list(grammar.rules.values())
        self._rule_body: list[int | None] = [None] * len(self._rule_nodes)
        # Lower bounds until the exact lengths replace them (``_settle``).
        self._rule_min: dict[str, float] = dict(grammar.min_lengths)
        self._unordered: list[_Unordered] = []
        self._unordered_body: dict[int, int] = {}
        self._first: dict[int, int] = {}
        self._first_busy: set[int] = set()
        self._min: dict[int, float] = {}
        self._bound: dict[int, float] = {}  # _min_bound, for states not known exactly
        # Keyed by identity: equal-but-distinct subtrees would cost a deep __eq__ per lookup, and
        # interning merges them anyway.
        self._converted: dict[int, int] = {}
        # The nodes whose nullable / byte classes are being computed, with their depth in that
        # computation: a cycle through rules is cut there, and what was computed under a cut of
        # a node still open is not cached (it assumed that node's answer; see ``nullable``).
        self._null_open: dict[int, int] = {}
        self._null_cut = _NO_CUT
        self._class_open: dict[int, int] = {}
        self._class_cut = _NO_CUT
        self._deriving: set[int] = set()
        self._new(K_NOTHING, (), False, False)
        self._new(K_EMPTY, (), True, False)
        # Dense transition rows, filled lazily: rows[s, b] = derivative of state s by byte b.
        self.rows = np.zeros((1024, 256), dtype=np.int32)
        self.row_done = np.zeros(1024, dtype=bool)
        # row_nullable[s]: nullable(s), for states with rows (a walk asks it of whole levels).
        self.row_nullable = np.zeros(1024, dtype=bool)
        self.row_nullable[EMPTY] = True
        self.row_done[NOTHING] = True
        self.rows[EMPTY] = NOTHING
        self.row_done[EMPTY] = True
        # Rows filled: what the memory accounting counts (a row never filled stays an untouched
        # zero page: the capacity would count ~15x a compiled schema's real memory).
        self._rows_filled = 2
        if grammar.start not in self._rule_ids:
            raise GrammarError(f"grammar has no start rule {grammar.start!r}")
        with self.work():
            measure_rules(grammar.rules, self._exact_min, grammar.rule_lengths, self._settle)
            self.start = self._convert(ir.Ref(grammar.start))
        # The start rule derives nothing even with intersections and complements at their lower
        # bounds: empty by its structure, which the front end's ``Grammar.unsatisfiable`` explains.
        self.empty_by_structure = grammar.start not in grammar.min_lengths

    @property
    def rule_lengths(self) -> list[float]:
        """Each rule's shortest string (``INFINITE``: unproductive), in ``grammar.rules`` order."""
        return [self._rule_min.get(name, INFINITE) for name in self._rule_names]

    def _exact_min(self, node: ir.Node) -> float:
        """Shortest match of an intersection or complement, by searching derivatives:
        an unsatisfiable one (``pattern`` against ``minLength``) makes its rule unproductive, so
        no walk is ever offered the way into it."""
        return self.min_completion(self._convert(node))

    def _settle(self, lengths: dict[str, float]) -> None:
        """Exact lengths of rules, final before the rules using them are measured; the shortest
        completions found with the lower bounds they replace are forgotten."""
        changed = [(name, n) for name, n in lengths.items() if self._rule_min.get(name, INFINITE) != n]
        for name, n in changed:
            if n < INFINITE:
                self._rule_min[name] = n
            else:
                del self._rule_min[name]  # (absent: unproductive, as in ``measure_rules``' lengths)
        if changed:
            self._min.clear()
            self._bound.clear()

    @contextmanager
    def work(self) -> Iterator[None]:
        """One unit of compilation work (the first compile, or a new state met while decoding),
        holding the lock; ``CompileBudget.seconds`` bounds it. Reentrant: the outermost unit
        sets the deadline."""
        with self.lock:
            if self._deadline is not None:
                yield
                return
            self._deadline = time.monotonic() + self.budget.seconds
            try:
                yield
            finally:
                self._deadline = None

    def _descend(self) -> None:
        """Enter one more level of recursion; the caller leaves it with ``self._level -= 1`` in a
        ``finally``. Raises before the interpreter's own limit would."""
        self._level += 1
        if self._level > MAX_NESTING:  # sequences and unions of any length count as one level
            self._level -= 1
            raise nesting_error()

    def estimated_bytes(self) -> int:
        """A rough estimate of this table's memory: expressions, their caches and the rows."""
        entries = sum(map(len, self._clamped.values())) + len(self._closure_bounds)
        return len(self._kind) * EXPR_BYTES + self._rows_filled * ROW_BYTES + entries * ENTRY_BYTES

    def _check_budget(self) -> None:
        """Raise ``BudgetExceededError`` once the current unit of work or the memory is over."""
        budget = self.budget
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise BudgetExceededError(
                "seconds", budget.seconds, f"compiling took more than {budget.seconds:g} s")
        used = self.estimated_bytes()
        if used > budget.max_bytes:
            raise BudgetExceededError(
                "max_bytes", budget.max_bytes, f"the automaton needs about {used >> 20} MiB")

    # ------------------------------------------------------------------ interning

    def __len__(self) -> int:
        return len(self._kind)

    def _new(self, kind: int, args: tuple, nullable: bool | None, boolean: bool) -> int:
        key = (kind, *args)
        found = self._intern.get(key)
        if found is not None:
            return found
        i = len(self._kind)
        if i >= self.max_states:
            raise StateLimitError(
                "max_states", self.max_states, f"the constraint needs more than {self.max_states} automaton states")
        if i and i % BUDGET_CHECK_EVERY == 0:
            self._check_budget()
        self._kind.append(kind)
        self._args.append(args)
        self._nullable.append(nullable)
        self._boolean.append(boolean)
        self._counted.append(False)
        self._intern[key] = i
        return i

    def _mk_bytes(self, mask: int) -> int:
        return NOTHING if mask == 0 else self._new(K_BYTES, (mask,), False, False)

    def _mk_seq(self, a: int, b: int) -> int:
        if a == NOTHING or b == NOTHING:
            return NOTHING
        if a == EMPTY:
            return b
        if b == EMPTY:
            return a
        if self._kind[a] == K_SEQ:  # keep sequences right-nested: (x y) z -> x (y z)
            heads = []
            while self._kind[a] == K_SEQ:
                x, a = self._args[a]
                heads.append(x)
            b = self._mk_seq(a, b)
            for x in reversed(heads):  # heads of a right-nested spine are no sequences
                b = self._mk_seq(x, b)
            return b
        na, nb = self._nullable[a], self._nullable[b]
        nullable = None if na is None or nb is None else (na and nb)
        return self._flag(self._new(K_SEQ, (a, b), nullable, self._boolean[a] or self._boolean[b]), (a, b))

    def _mk_alt(self, items: Sequence[int]) -> int:
        if len(items) == 1 and self._kind[items[0]] != K_ALT:
            return items[0]  # what the rest would build (most calls: a sequence's derivative by its head)
        flat: set[int] = set()
        mask = 0
        for i in items:
            k = self._kind[i]
            if k == K_ALT:
                parts = self._args[i][0]
            else:
                parts = (i,)
            for p in parts:
                if p == NOTHING:
                    continue
                if self._kind[p] == K_BYTES:
                    mask |= self._args[p][0]
                else:
                    flat.add(p)
        # Left-factor sequences sharing a head: x a | x b -> x (a | b). Keeps derivatives of big
        # enums and key sets small.
        by_head: dict[int, list[int]] = {}
        for p in flat:
            if self._kind[p] == K_SEQ:
                by_head.setdefault(self._args[p][0], []).append(p)
        for head, group in by_head.items():
            if len(group) > 1:
                for p in group:
                    flat.discard(p)
                flat.add(self._mk_seq(head, self._mk_alt([self._args[p][1] for p in group])))
        if mask:
            flat.add(self._mk_bytes(mask))
        if not flat:
            return NOTHING
        if len(flat) == 1:
            return next(iter(flat))
        members = tuple(sorted(flat))
        ns = [self._nullable[m] for m in members]
        nullable = True if any(n is True for n in ns) else (None if any(n is None for n in ns) else False)
        return self._flag(self._new(K_ALT, (members,), nullable, any(self._boolean[m] for m in members)), members)

    def _mk_and(self, items: Sequence[int]) -> int:
        flat: set[int] = set()
        for i in items:
            parts = self._args[i][0] if self._kind[i] == K_AND else (i,)
            for p in parts:
                if p == NOTHING:
                    return NOTHING
                if self._kind[p] == K_NOT and self._args[p][0] == NOTHING:
                    continue  # everything (``not`` of a branch the input has left): x & everything == x
                flat.add(p)
        if not flat:
            return self._mk_not(NOTHING)
        kinds = {self._kind[p] for p in flat}
        if kinds == {K_BYTES}:
            mask = ALL_BYTES
            for p in flat:
                mask &= self._args[p][0]
            return self._mk_bytes(mask)
        if EMPTY in flat:
            return EMPTY if all([self.nullable(p) for p in flat]) else NOTHING
        if len(flat) == 1:
            return next(iter(flat))
        members = tuple(sorted(flat))
        ns = [self._nullable[m] for m in members]
        nullable = False if any(n is False for n in ns) else (None if any(n is None for n in ns) else True)
        return self._flag(self._new(K_AND, (members,), nullable, True), members)

    def _mk_not(self, a: int) -> int:
        if self._kind[a] == K_NOT:
            return self._args[a][0]
        na = self._nullable[a]
        return self._flag(self._new(K_NOT, (a,), None if na is None else not na, True), (a,))

    def _mk_repeat(self, a: int, lo: int, hi: int | None) -> int:
        if hi == 0 or a == EMPTY:
            return EMPTY
        if a == NOTHING:
            return EMPTY if lo == 0 else NOTHING
        if lo == 1 and hi == 1:
            return a
        if lo and self.nullable(a):  # a nullable: a{n,m} == a{0,m}
            lo = 0
        out = self._flag(self._new(K_REPEAT, (a, lo, hi), True if lo == 0 else self._nullable[a], self._boolean[a]), (a,))
        if lo > 0 or hi is not None:
            self._counted[out] = True
        return out

    def _flag(self, e: int, children: Sequence[int]) -> int:
        for c in children:
            if self._counted[c]:
                self._counted[e] = True
        return e

    def split(self, e: int) -> tuple[int, int] | None:
        """``(head, tail)`` when ``e`` is a sequence, else None."""
        return self._args[e] if self._kind[e] == K_SEQ else None

    def spine(self, e: int) -> list[int]:
        """The parts of a sequence, in order (its heads, then the last tail): sequences are
        right-nested, so questions about one iterate over this instead of recursing per part."""
        parts = []
        while self._kind[e] == K_SEQ:
            head, e = self._args[e]
            parts.append(head)
        parts.append(e)
        return parts

    def rule_body(self, rule: int) -> int:
        """The expression a reference to ``rule`` expands to."""
        if not 0 <= rule < len(self._rule_body):
            raise IndexError(f"ExprTable.rule_body: no rule {rule}")
        with self.lock:
            return self._body(rule)

    def seq(self, a: int, b: int) -> int:
        with self.lock:
            return self._mk_seq(a, b)

    def alt(self, items: Sequence[int]) -> int:
        """The union of ``items`` (no items: the empty language)."""
        with self.lock:
            return self._mk_alt(items)

    def clamp(self, e: int, limit: int) -> int:
        """``e`` with each repetition count that a token of at most ``limit`` bytes cannot reach
        made unbounded, and each minimum cut to that reach.

        Within one token, a repetition whose item's matches have at least m bytes (m >= 1) starts
        at most T = (limit - 1) // m + 1 iterations, and completes fewer than T before it leaves
        them for what follows. So ``item{lo,hi}`` and ``item{min(lo, T),}`` (for ``hi >= T``)
        agree on the strings of at most ``limit`` bytes that can start a match and on the matches
        of fewer bytes: all that a sequence, union or repetition around them asks of them.
        States that differ only in such counts (the 37th character of a string with maxLength
        100, the 5th item of an array with maxItems 50) share one walk; ``TokenAutomaton`` clamps
        at a limit below its few longest tokens and walks those apart, from the state clamped at
        the longest. Inside an intersection a count binds beyond the token (``pattern`` with
        ``maxLength``: a token is allowed when a completion after it fits the count): see
        ``_clamp_intersection``. Complements are left whole.
        """
        def rule(m: float, lo: int, hi: int | None) -> tuple[int, int | None]:
            reach = _started(limit, m)
            return min(lo, reach), None if hi is None or hi >= reach else hi

        with self.lock:
            memo = self._clamped.setdefault(limit, {})
            out = self._recount(e, rule, memo, limit)
        assert out is not None  # (neither gives up)
        return out

    def _clamp_intersection(self, e: int, limit: int) -> int:
        """U, ``e`` with the counts that no match of at most ``limit + B`` bytes reaches made
        unbounded (B bounds the shortest completion of every state of U); ``e`` itself when U
        has more than MAX_CLOSURE_STATES states or no count can go.

        Exact for a token t of at most ``limit`` bytes: U holds ``e``, and the two agree on the
        strings of at most ``limit + B`` bytes. If t leads somewhere live in U, a completion w of
        at most B bytes follows; t w has at most ``limit + B`` bytes, so it is in ``e`` too. U is
        also the cheaper walk: an unbounded count loops where a bounded one makes a new state at
        every byte, and with the other side of the intersection, a product of them. (Counts inside
        a complement stay: unbounded, the complement's language would shrink, and U would no
        longer hold ``e``.) The counts that bind stay exact and the rest go (a ``pattern`` with
        ``{0,99}`` words near its last word, under ``maxLength`` 5000): B depends on which stay,
        so it is found again until no count that went is within its reach.
        """
        lifted: list[tuple[float, int]] = []  # (m, hi) of each count made unbounded
        reach = 0  # the B the counts are lifted for (grows until U's own B is within it)

        def relax(m: float, lo: int, hi: int | None) -> tuple[int, int | None]:
            if hi is None or hi <= _completed(limit, m) or hi < _completed(limit + reach, m):
                return lo, hi
            lifted.append((m, hi))
            return lo, None

        for _ in range(MAX_CLAMP_ROUNDS):
            lifted.clear()
            relaxed = self._recount(e, relax, {}, None)
            assert relaxed is not None
            if relaxed == e:
                return e
            bound = self._closure_bound(relaxed)
            if bound < 0:
                return e
            if all(hi >= _completed(limit + bound, m) for m, hi in lifted):
                return relaxed
            reach = bound  # (larger than the last: each lifted count was within the last reach)
        return e

    def _recount(self, e: int, rule: Callable[[float, int, int | None], tuple[int, int | None] | None],
                 memo: dict[int, int | None], clamp_at: int | None) -> int | None:
        """``e`` rebuilt with each repetition's counts ``rule(m, lo, hi)`` (m: a lower bound on the
        length of its item's non-empty matches), each intersection clamped at ``clamp_at`` (None:
        its members rebuilt alike), complements whole; None once ``rule`` gives None. The one
        traversal under ``clamp`` and ``_clamp_intersection``."""
        if not self._counted[e]:
            return e
        if e in memo:
            return memo[e]
        self._descend()
        try:
            k, a = self._kind[e], self._args[e]
            out: int | None = e
            if k in (K_SEQ, K_ALT, K_FRAME) or (k == K_AND and clamp_at is None):
                parts = self.spine(e) if k == K_SEQ else a[0] if k in (K_ALT, K_AND) else [a[0]]
                got = [self._recount(m, rule, memo, clamp_at) for m in parts]
                done = cast(list[int], got)
                if None in got:
                    out = None
                elif k == K_SEQ:
                    out = EMPTY
                    for m in reversed(done):
                        out = self._mk_seq(m, out)
                else:
                    out = (self._mk_alt(done) if k == K_ALT else self._mk_and(done) if k == K_AND
                           else self._mk_frame(done[0]))
            elif k == K_REPEAT:
                item = self._recount(a[0], rule, memo, clamp_at)
                counts = None if item is None else rule(max(1, self._min_bound(a[0])), a[1], a[2])
                out = None if item is None or counts is None else self._mk_repeat(item, *counts)
            elif k == K_AND and clamp_at is not None:
                out = self._clamp_intersection(e, clamp_at)
        finally:
            self._level -= 1
        memo[e] = out
        return out

    def _closure_bound(self, u: int) -> int:
        """The longest shortest completion (bytes) over the states ``u`` reaches, -1 if they are
        more than MAX_CLOSURE_STATES; it bounds every state of the closure too, and is kept for them
        (-1 for the states explored when they were too many: each one's closure is as likely too
        large, and exploring it again at every new state is what the cap is there to stop)."""
        got = self._closure_bounds.get(u)
        if got is not None:
            return got
        index = {u: 0}
        states: list[int] = [u]
        sources: list[list[int]] = [[]]  # per state, the states with a byte to it
        i = 0
        while i < len(states):
            for c in self.byte_classes(states[i]):
                nxt = self._d(states[i], (c & -c).bit_length() - 1)
                if nxt == NOTHING:
                    continue
                j = index.get(nxt)
                if j is None:
                    if len(states) == MAX_CLOSURE_STATES:
                        for s in states:
                            self._closure_bounds.setdefault(s, -1)
                        return -1
                    j = index[nxt] = len(states)
                    states.append(nxt)
                    sources.append([])
                sources[j].append(i)
            i += 1
        dist = [-1] * len(states)
        queue = [j for j, s in enumerate(states) if self.nullable(s)]
        for j in queue:
            dist[j] = 0
        bound = 0
        for j in queue:  # (grows as it goes: breadth first, backwards from the states that may end)
            bound = dist[j]
            for p in sources[j]:
                if dist[p] < 0:
                    dist[p] = dist[j] + 1
                    queue.append(p)
        for s in states:
            self._closure_bounds.setdefault(s, bound)
        return bound

    def signature(self, e: int) -> int | None:
        """An id of ``e``'s structure, equal across the grammars sharing ``self.signatures``;
        None if it uses a recursive rule (see ``structure_signature``)."""
        return structure_signature(self, e, self._sigs)

    def node(self, e: int) -> tuple[int, tuple]:
        """``(kind, args)`` of expression ``e``: what ``structure_signature`` reads."""
        return self._kind[e], self._args[e]

    def alternatives(self, e: int) -> tuple[int, ...] | None:
        """The members of a union state (``a | b``, an Unordered state, either one inside a frame
        or followed by more), whose masks together make its mask; None for other states.

        A frame followed by more counts too: ``FRAME(({k1 ...|k2 ...}) "}") tail``, an object's
        next key with the members it may still have, is new for every set of members seen so far,
        where each member's own head walk (``FRAME(k1 ...)``) is shared by all of them."""
        k, a = self._kind[e], self._args[e]
        if k == K_ALT:
            return a[0]
        if k == K_FRAME:
            return self.alternatives(a[0])
        with self.lock:
            if k == K_UNORDERED:
                body = self._expand_unordered(e)
                return self._args[body][0] if self._kind[body] == K_ALT else None
            if k == K_SEQ and self._kind[a[0]] in (K_ALT, K_UNORDERED, K_FRAME):
                members = self.alternatives(a[0])
                return None if members is None else tuple(self._mk_seq(m, a[1]) for m in members)
        return None

    def first_bytes(self, e: int) -> int:
        """A superset of the bytes ``e`` can start with (a bitmask), without taking derivatives.

        Cheap where a transition row would not be: an Unordered state's row expands and derives
        every member that may come next. A union's derivative skips the members whose first
        bytes lack the byte, so this may include bytes that lead nowhere but never miss one."""
        got = self._first.get(e)
        if got is not None:
            return got
        with self.lock:
            if e in self._first_busy:  # only left recursion cycles here; stay a superset
                return ALL_BYTES
            self._first_busy.add(e)
            self._descend()
            try:
                k, a = self._kind[e], self._args[e]
                if k == K_BYTES:
                    out = a[0]
                elif k == K_SEQ:
                    out = 0
                    for m in self.spine(e):
                        out |= self.first_bytes(m)
                        if not self.nullable(m):
                            break
                elif k == K_ALT:
                    out = 0
                    for m in a[0]:
                        out |= self.first_bytes(m)
                elif k == K_AND:
                    out = ALL_BYTES
                    for m in a[0]:
                        out &= self.first_bytes(m)
                elif k in (K_REPEAT, K_FRAME):
                    out = self.first_bytes(a[0])
                elif k == K_REF:
                    out = self.first_bytes(self._body(a[0]))
                elif k == K_UNORDERED:
                    out = self._unordered_first(e)
                elif k in (K_NOTHING, K_EMPTY):
                    out = 0
                else:  # complement
                    out = ALL_BYTES
            finally:
                self._level -= 1
                self._first_busy.discard(e)
            self._first[e] = out
            return out

    def _unordered_first(self, e: int) -> int:
        d, seen, count = self._args[e]
        u = self._unordered[d]
        out = self.first_bytes(u.last) if count and u.required & ~seen == 0 and count >= u.lo else 0
        if u.hi is None or count < u.hi:
            lead = u.first if count == 0 else u.sep
            out |= self.first_bytes(lead)
            if self.nullable(lead):
                for j, item in enumerate(u.items):
                    if not seen >> j & 1:
                        out |= self.first_bytes(item)
                out |= self.first_bytes(u.extra)
        return out

    def is_framed(self, e: int) -> bool:
        """Whether ``e`` is ``FRAME(...) tail``: a state whose head walk is shared across tails."""
        return self._kind[e] == K_SEQ and self._kind[self._args[e][0]] == K_FRAME

    def is_byte_set(self, e: int) -> bool:
        return self._kind[e] == K_BYTES

    def _mk_frame(self, e: int) -> int:
        """What is left of one rule's body after a derivative entered it.

        Semantically transparent; it keeps the boundary between the current rule and the rules
        waiting after it, so the state reads as a stack ``FRAME(top) FRAME(..) tail``. Its head
        (the top frame) is the same at every nesting depth, which is what lets masks be shared
        across depths (see ``TokenAutomaton._split_mask``).
        """
        k = self._kind[e]
        if k in (K_NOTHING, K_EMPTY, K_FRAME, K_BYTES):
            return e
        if k == K_SEQ and self._kind[self._args[e][0]] == K_FRAME:  # frames at the head: flatten
            frames = []
            while self._kind[e] == K_SEQ and self._kind[self._args[e][0]] == K_FRAME:
                head, e = self._args[e]
                frames.append(head)
            out = self._mk_frame(e)
            for head in reversed(frames):
                out = self._mk_seq(head, out)
            return out
        return self._flag(self._new(K_FRAME, (e,), self._nullable[e], self._boolean[e]), (e,))

    def _mk_ref(self, rule: int) -> int:
        return self._new(K_REF, (rule,), None, False)

    def _mk_unordered(self, d: int, seen: int, count: int) -> int:
        """Unordered node ``d`` after the items in bitmask ``seen`` and ``count`` members (capped).

        NOTHING when it cannot be completed: a required item cannot match, or the member count
        bounds can no longer be met (only these can change along the way, so later states of an
        Unordered without count bounds need no check)."""
        u = self._unordered[d]
        if (seen == count == 0 or u.lo or u.hi is not None) and self._unordered_min(d, seen, count) == INFINITE:
            return NOTHING
        return self._new(K_UNORDERED, (d, seen, count), None, False)

    def _unordered_min(self, d: int, seen: int, count: int) -> float:
        """A lower bound, like a rule's (see ``rule_min_lengths``): states are searched exactly."""
        u = self._unordered[d]
        extra, first, sep, last = u.part_mins
        return ir.unordered_min_length(u.item_mins, u.required, extra, (first, sep, last), u.lo, u.hi, seen, count)

    def _expand_unordered(self, e: int) -> int:
        """One step of an Unordered state: close here, or write one more member.

        Each member (with its separator) is a frame, like a rule's body: the state inside it is
        ``FRAME(rest of member) Unordered(...)``, whose head is the same whichever members came
        before, so its mask walk is shared by all of them (see ``alternatives``)."""
        body = self._unordered_body.get(e)
        if body is not None:
            return body
        d, seen, count = self._args[e]
        u = self._unordered[d]
        options = []
        if u.required & ~seen == 0 and count >= u.lo:
            options.append(EMPTY if count == 0 else u.last)
        if u.hi is None or count < u.hi:
            lead = u.first if count == 0 else u.sep
            nxt = min(count + 1, max(1, u.lo, u.hi or 0))  # counts past every bound behave alike
            for j, item in enumerate(u.items):
                if not seen >> j & 1 and item != NOTHING:
                    member = self._mk_frame(self._mk_seq(lead, item))
                    options.append(self._mk_seq(member, self._mk_unordered(d, seen | 1 << j, nxt)))
            if u.extra != NOTHING:
                member = self._mk_frame(self._mk_seq(lead, u.extra))
                options.append(self._mk_seq(member, self._mk_unordered(d, seen, nxt)))
        body = self._unordered_body[e] = self._mk_alt(options)
        return body

    # ------------------------------------------------------------------ IR conversion

    def _convert(self, node: ir.Node) -> int:
        """Intern an IR tree (one level of recursion per level of nesting)."""
        done = self._converted.get(id(node))
        if done is not None:
            return done
        self._descend()
        try:
            if isinstance(node, ir.Bytes):
                out = self._mk_bytes(node.mask)
            elif isinstance(node, ir.Seq):
                out = EMPTY
                for item in reversed(node.items):
                    out = self._mk_seq(self._convert(item), out)
            elif isinstance(node, ir.Alt):
                out = self._mk_alt([self._convert(i) for i in node.items])
            elif isinstance(node, ir.And):
                out = self._mk_and([self._convert(i) for i in node.items])
            elif isinstance(node, ir.Not):
                out = self._mk_not(self._convert(node.item))
            elif isinstance(node, ir.Repeat):
                out = self._mk_repeat(self._convert(node.item), node.min, node.max)
            elif isinstance(node, ir.Unordered):
                parts = (node.extra, node.first, node.sep, node.last)
                size = MinLength(self._rule_min, self._exact_min)
                extra, first, sep, last = (self._convert(p) for p in parts)
                part_mins = (size(node.extra), size(node.first), size(node.sep), size(node.last))
                self._unordered.append(_Unordered(
                    tuple(self._convert(i) for i in node.items), node.required_mask(), extra, first, sep, last,
                    node.min, node.max, [size(i) for i in node.items], part_mins))
                out = self._mk_unordered(len(self._unordered) - 1, 0, 0)
            elif isinstance(node, ir.Ref):
                rule = self._rule_ids.get(node.name)
                if rule is None:
                    raise GrammarError(f"reference to undefined rule {node.name!r}")
                out = self._mk_ref(rule) if self._rule_min.get(node.name, INFINITE) < INFINITE else NOTHING
            else:
                raise TypeError(f"not an IR node: {node!r}")
        finally:
            self._level -= 1
        self._converted[id(node)] = out
        return out

    def _body(self, rule: int) -> int:
        body = self._rule_body[rule]
        if body is None:
            body = self._rule_body[rule] = self._convert(self._rule_nodes[rule])
        return body

    # ------------------------------------------------------------------ semantics

    def nullable(self, e: int) -> bool:
        """Whether ``e`` matches the empty string (the document may end here).

        A cycle through rules is cut (answered False) at the node already open; the answers of the
        nodes between are cached only once that node's own answer is known, since they assumed it
        (``r1: | "b" r0 | "x" r0+``, ``r0: r1``: ``r0`` asked while ``r1``'s body is open)."""
        n = self._nullable[e]
        if n is not None:
            return n
        with self.lock:
            depth = self._null_open.get(e)
            if depth is not None:  # a cycle through rules: this path adds no empty match
                self._null_cut = min(self._null_cut, depth)
                return False
            depth = self._null_open[e] = len(self._null_open)
            outer_cut, self._null_cut = self._null_cut, _NO_CUT
            self._descend()
            try:
                k, a = self._kind[e], self._args[e]
                if k == K_REF:
                    n = self.nullable(self._body(a[0]))
                elif k == K_UNORDERED:  # may close here (members cannot be empty: see Unordered)
                    u, seen, count = self._unordered[a[0]], a[1], a[2]
                    n = u.required & ~seen == 0 and count >= u.lo and (count == 0 or self.nullable(u.last))
                elif k == K_FRAME:
                    n = self.nullable(a[0])
                elif k == K_SEQ:
                    n = True
                    for m in self.spine(e):
                        if not self.nullable(m):
                            n = False
                            break
                elif k == K_ALT:
                    n = any([self.nullable(m) for m in a[0]])
                elif k == K_AND:
                    n = all([self.nullable(m) for m in a[0]])
                elif k == K_NOT:
                    n = not self.nullable(a[0])
                elif k == K_REPEAT:
                    n = a[1] == 0 or self.nullable(a[0])
                else:
                    n = k == K_EMPTY
            finally:
                self._level -= 1
                del self._null_open[e]
                cut = self._null_cut
                self._null_cut = min(outer_cut, cut if cut < depth else _NO_CUT)
            if cut >= depth:  # not computed under the assumption of an enclosing node's answer
                self._nullable[e] = n
            return n

    def derive(self, e: int, byte: int) -> int:
        """The expression left to match after ``byte``."""
        out = self._deriv.get(e * 256 + byte)
        if out is not None:
            return out
        with self.lock:
            return self._d(e, byte)

    def _d(self, e: int, b: int) -> int:
        """``derive`` for callers holding the lock (the recursion itself)."""
        key = e * 256 + b
        out = self._deriv.get(key)
        if out is not None:
            return out
        self._descend()
        try:
            if self._kind[e] in (K_REF, K_UNORDERED):  # every cycle of derivatives passes through one
                if key in self._deriving:
                    raise GrammarError("left-recursive grammar: a rule can reach itself without consuming input")
                self._deriving.add(key)
                try:
                    out = self._derive(e, b)
                finally:
                    self._deriving.discard(key)
            else:
                out = self._derive(e, b)
        finally:
            self._level -= 1
        self._deriv[key] = out
        return out

    def _derive(self, e: int, b: int) -> int:
        k, a = self._kind[e], self._args[e]
        if k == K_BYTES:
            return EMPTY if (a[0] >> b) & 1 else NOTHING
        if k == K_SEQ:  # along the spine while the heads may be empty
            parts = []
            while self._kind[e] == K_SEQ:
                head, e = self._args[e]
                parts.append(self._mk_seq(self._d(head, b), e))
                if not self.nullable(head):
                    return self._mk_alt(parts)
                done = self._deriv.get(e * 256 + b)
                if done is not None:
                    parts.append(done)
                    return self._mk_alt(parts)
            parts.append(self._d(e, b))
            return self._mk_alt(parts)
        if k == K_ALT:  # members that cannot start with ``b`` derive to NOTHING: skipped
            first = self._first
            return self._mk_alt([self._d(m, b) for m in a[0]
                                 if (first[m] if m in first else self.first_bytes(m)) >> b & 1])
        if k == K_AND:
            return self._mk_and([self._d(m, b) for m in a[0]])
        if k == K_NOT:
            return self._mk_not(self._d(a[0], b))
        if k == K_REPEAT:
            item, lo, hi = a
            rest = self._mk_repeat(item, max(lo - 1, 0), None if hi is None else hi - 1)
            return self._mk_seq(self._d(item, b), rest)
        if k == K_REF:
            return self._mk_frame(self._d(self._body(a[0]), b))
        if k == K_UNORDERED:
            return self._d(self._expand_unordered(e), b)
        if k == K_FRAME:
            return self._mk_frame(self._d(a[0], b))
        return NOTHING

    def derive_bytes(self, e: int, data: bytes) -> int:
        """The expression left to match after ``data``."""
        for b in data:
            e = self.derive(e, b)
        return e

    def byte_classes(self, e: int) -> tuple[int, ...]:
        """A partition of the 256 bytes such that bytes of one part have equal derivatives."""
        got = self._classes.get(e)
        if got is not None:
            return got
        with self.lock:
            depth = self._class_open.get(e)
            if depth is not None:  # a cycle through rules adds no first byte of its own
                self._class_cut = min(self._class_cut, depth)
                return (ALL_BYTES,)
            depth = self._class_open[e] = len(self._class_open)
            outer_cut, self._class_cut = self._class_cut, _NO_CUT
            self._descend()
            try:
                k, a = self._kind[e], self._args[e]
                if k == K_BYTES:
                    parts: tuple[int, ...] = tuple(p for p in (a[0], ALL_BYTES ^ a[0]) if p)
                elif k == K_SEQ:  # the heads that may be empty and the one after them
                    parts = (ALL_BYTES,)
                    for m in self.spine(e):
                        parts = _refine(parts, self.byte_classes(m))
                        if not self.nullable(m):
                            break
                elif k in (K_ALT, K_AND):
                    parts = (ALL_BYTES,)
                    for m in a[0]:
                        parts = _refine(parts, self.byte_classes(m))
                elif k in (K_NOT, K_REPEAT, K_FRAME):
                    parts = self.byte_classes(a[0])
                elif k == K_REF:
                    parts = self.byte_classes(self._body(a[0]))
                elif k == K_UNORDERED:
                    parts = self.byte_classes(self._expand_unordered(e))
                else:
                    parts = (ALL_BYTES,)
            finally:
                self._level -= 1
                del self._class_open[e]
                cut = self._class_cut
                self._class_cut = min(outer_cut, cut if cut < depth else _NO_CUT)
            if cut >= depth:  # see ``nullable``
                self._classes[e] = parts
            return parts

    def min_completion(self, e: int) -> float:
        """Bytes in the shortest string that completes ``e`` (``INFINITE`` if none was found)."""
        got = self._min.get(e)
        if got is not None:
            return got
        with self.lock:  # exact by search at intersections and complements
            return self._structural_min(e, self._min, self.min_completion, self._search_min)

    def _search_min(self, e: int) -> float:
        """Best-first (A*) search for the nearest accepting derivative (intersections,
        complements), guided by ``_min_bound``; INFINITE when there is none; when the search gives
        up, the least bound left on its frontier (a lower bound: no shorter string is accepted).

        The bound keeps the search on the structure's shortest way, checked against the
        intersection: ``{...required keys...} & not(1)`` needs a few hundred states, where a
        breadth-first search of every byte class gave up at 4096 with a bound far too low, and the
        budget-aware close trusted it (schema seed 1049 of the fuzz run: an empty close)."""
        best = {e: 0}
        heap = [(self._min_bound(e), 0, e)]  # (bound, -depth, state): the deepest of a bound first
        while heap and len(best) < LIVENESS_BUDGET:
            _, neg, s = heapq.heappop(heap)
            depth = -neg
            if depth > best.get(s, INFINITE):
                continue  # reached again by a shorter way
            if self.nullable(s):
                return depth
            for part in self.byte_classes(s):
                n = self.derive(s, (part & -part).bit_length() - 1)
                if n == NOTHING or self._live.get(n) is False or depth + 1 >= best.get(n, INFINITE):
                    continue
                bound = self._min_bound(n)
                if bound == INFINITE:
                    continue
                best[n] = depth + 1
                heapq.heappush(heap, (depth + 1 + bound, -depth - 1, n))
        return heap[0][0] if heap else INFINITE

    def _min_bound(self, e: int) -> float:
        """A lower bound on ``min_completion(e)`` from the structure alone, never searching: an
        intersection is bounded by its longest member's bound, a complement by 0."""
        got = self._min.get(e)
        if got is not None:
            return got
        got = self._bound.get(e)
        if got is not None:
            return got
        return self._structural_min(e, self._bound, self._min_bound, self._boolean_bound)

    def _boolean_bound(self, e: int) -> float:
        """``_min_bound`` of an intersection or complement."""
        if self._kind[e] == K_AND:
            return max([self._min_bound(m) for m in self._args[e][0]])
        return 0

    def _structural_min(self, e: int, cache: dict[int, float], recurse: Callable[[int], float],
                        boolean: Callable[[int], float]) -> float:
        """The shortest completion of ``e`` by its structure, with ``recurse`` for its parts and
        ``boolean`` for an intersection or complement (where structure alone cannot tell), cached
        in ``cache``: one recursion for the exact length and for its lower bound."""
        self._descend()
        try:
            k, a = self._kind[e], self._args[e]
            if k in (K_AND, K_NOT):
                out = boolean(e)
            elif k == K_BYTES:
                out = 1
            elif k == K_EMPTY:
                out = 0
            elif k == K_SEQ:
                out = sum([recurse(m) for m in self.spine(e)])
            elif k == K_ALT:
                out = min([recurse(m) for m in a[0]])
            elif k == K_REPEAT:
                out = 0 if a[1] == 0 else a[1] * recurse(a[0])
            elif k == K_REF:
                out = self._rule_min.get(self._rule_names[a[0]], INFINITE)
            elif k == K_UNORDERED:
                out = self._unordered_min(*a)
            elif k == K_FRAME:
                out = recurse(a[0])
            else:
                out = INFINITE
        finally:
            self._level -= 1
        cache[e] = out
        return out

    def is_live(self, e: int) -> bool:
        """Whether some byte string leads from ``e`` to acceptance.

        Structural where it can be (a sequence is live when both parts are), so the search for
        an accepting string only ever runs on the intersection or complement itself, never on
        the rest of the document around it.
        """
        if e == NOTHING:
            return False
        if not self._boolean[e]:
            return True  # smart constructors reduce every empty regular expression to NOTHING
        got = self._live.get(e)
        if got is not None:
            return got
        with self.lock:
            self._descend()
            try:
                k, a = self._kind[e], self._args[e]
                if k == K_SEQ:
                    live = True
                    for m in self.spine(e):
                        if not self.is_live(m):
                            live = False
                            break
                elif k == K_ALT:
                    live = any([self.is_live(m) for m in a[0]])
                elif k == K_REPEAT:
                    live = a[1] == 0 or self.is_live(a[0])
                elif k == K_FRAME:
                    live = self.is_live(a[0])
                else:
                    live = self._witness_live(e) or self._search_live(e)
            finally:
                self._level -= 1
            self._live[e] = live
            return live

    def _witness_live(self, e: int) -> bool:
        """Whether the shortest string of a plain member of the intersection ``e`` (one with no
        intersection or complement inside: its shortest completion is exact by structure) is a
        string of every member: life proven with a derivative per byte of each member, where the
        search derives every byte class of the intersection itself (a pattern under a maxLength:
        ~20 new intersections per state a walk meets, each searched in turn)."""
        if self._kind[e] != K_AND:
            return False
        members = self._args[e][0]
        for plain in members:
            if self._boolean[plain]:
                continue
            witness = self._shortest_string(plain)
            if witness is not None and all(
                    m == plain or self.nullable(self.derive_bytes(m, witness)) for m in members):
                return True
        return False

    def _shortest_string(self, e: int) -> bytes | None:
        """A shortest string of the plain expression ``e`` (lowest byte of each class), at most
        MAX_WITNESS_BYTES long; None past that or where the structure's length is not exact."""
        out = bytearray()
        s = e
        while not self.nullable(s):
            left = self.min_completion(s)
            if len(out) == MAX_WITNESS_BYTES or left == INFINITE:
                return None
            for part in self.byte_classes(s):
                b = (part & -part).bit_length() - 1
                n = self._d(s, b)
                if n != NOTHING and self.min_completion(n) == left - 1:
                    out.append(b)
                    s = n
                    break
            else:
                return None
        return bytes(out)

    def _search_live(self, e: int) -> bool:
        """Best-first (A*) search from an intersection/complement state for acceptance, guided by
        ``_min_bound`` (a breadth-first search expands every byte class of every state up to the
        depth of the nearest acceptance: aerleon's hostname pattern, 31k new states in one head
        walk, 23k this way; nearest-bound-first without the depth, 141k).

        It stops at the first state known live (or accepting, or free of And/Not), and every
        state on the path to it is live too: recorded, so the searches of neighbouring states (a
        string body's next byte, the next token's states) end within a few steps. When
        everything reachable was explored without success, all of it is dead.
        """
        parent = {e: e}
        heap = [(self._min_bound(e), 0, e)]  # (depth + bound, -depth, state): the deepest of a bound first
        while heap and len(parent) < LIVENESS_BUDGET:
            _, neg, s = heapq.heappop(heap)
            if self.nullable(s) or (s != e and (not self._boolean[s] or self._live.get(s))):
                while True:  # the path back to e is live
                    self._live[s] = True
                    if s == e:
                        return True
                    s = parent[s]
            for part in self.byte_classes(s):
                n = self.derive(s, (part & -part).bit_length() - 1)
                if n == NOTHING or n in parent or self._live.get(n) is False:
                    continue
                bound = self._min_bound(n)
                if bound == INFINITE:
                    continue  # no completion at all: dead
                parent[n] = s
                heapq.heappush(heap, (1 - neg + bound, neg - 1, n))
        if heap:
            return True  # gave up: a wrong "live" can only stall a walk, never admit a bad byte
        for s in parent:
            self._live[s] = False
        return False

    def step_bytes(self, e: int, data: bytes) -> int:
        """The state after ``data`` through live derivatives (``NOTHING`` once it dies): rows where
        they are filled, else the derivative by the one byte (the states inside a token are rarely
        walked from, and a row derives every byte class)."""
        s = e
        for b in data:
            done = self.row_done
            if s < len(done) and done[s]:
                s = int(self.rows[s, b])
            else:
                with self.work():  # the same entry the row would hold: live derivatives only
                    s = self.derive(s, b)
                    if s != NOTHING and not self.is_live(s):
                        s = NOTHING
            if s == NOTHING:
                return NOTHING
        return s

    def forced_bytes(self, e: int, max_bytes: int) -> bytes:
        """The bytes every continuation of ``e`` starts with (jump-forward text), at most ``max_bytes``."""
        out = bytearray()
        s = e
        while len(out) < max_bytes and not self.nullable(s):
            row = self.row(s)
            live = np.nonzero(row)[0]
            if len(live) != 1:
                break
            out.append(int(live[0]))
            s = int(row[live[0]])
        return bytes(out)

    # ------------------------------------------------------------------ transition rows

    def ensure_rows(self, states: np.ndarray | Sequence[int]) -> None:
        """Fill ``rows[s]`` for every state in ``states`` (dead successors recorded as NOTHING)."""
        todo = [int(s) for s in states if s >= len(self.row_done) or not self.row_done[s]]
        if not todo:
            return
        with self.work():
            for s in todo:
                self._fill_row(s)

    def row(self, s: int) -> np.ndarray:
        if s >= len(self.row_done) or not self.row_done[s]:
            with self.work():
                self._fill_row(s)
        return self.rows[s]

    def _fill_row(self, s: int) -> None:
        if s < len(self.row_done) and self.row_done[s]:
            return
        self._check_budget()
        out = np.zeros(256, dtype=np.int32)
        for part in self.byte_classes(s):
            n = self.derive(s, (part & -part).bit_length() - 1)
            if n != NOTHING and self.is_live(n):
                flags = self._byte_flags.get(part)
                if flags is None:
                    flags = self._byte_flags[part] = byte_flags(part)
                out[flags] = n
        self._grow(max(s, len(self._kind)) + 1)
        self.rows[s] = out
        self.row_nullable[s] = self.nullable(s)
        self._rows_filled += not self.row_done[s]
        self.row_done[s] = True

    def _grow(self, need: int) -> None:
        cap = len(self.row_done)
        if need <= cap:
            return
        # Double, but not past the memory budget: at the end each row counts, not the capacity.
        room = (self.budget.max_bytes - len(self._kind) * EXPR_BYTES) // ROW_BYTES
        new_cap = max(need, min(cap * 2, room))
        rows = np.zeros((new_cap, 256), dtype=np.int32)
        rows[:cap] = self.rows
        done = np.zeros(new_cap, dtype=bool)
        done[:cap] = self.row_done
        nullable = np.zeros(new_cap, dtype=bool)
        nullable[:cap] = self.row_nullable
        self.rows, self.row_nullable, self.row_done = rows, nullable, done


class Structure(Protocol):
    """What ``structure_signature`` reads of an expression table (the Python one or the C++ one)."""

    signatures: Signatures

    def node(self, e: int) -> tuple[int, tuple]: ...
    def spine(self, e: int) -> list[int]: ...
    def rule_body(self, rule: int) -> int: ...


def structure_signature(table: Structure, e: int, cache: dict[int, int | None], refs: int = 0) -> int | None:
    """An id of ``e``'s structure, equal across the grammars sharing ``table.signatures``; None
    if it uses a recursive rule, an Unordered node or rules nested deeper than
    ``SIGNATURE_REFS``. ``cache`` holds the table's answers so far; ``refs`` counts the
    references open on the way to ``e``.

    Lets grammars share work on identical pieces (every JSON string body, number, key set of
    every schema compiled for one vocabulary), as DESIGN.md asks of common terminals. A reference
    to a rule that does not recur has its body's id: the front ends name pieces such as a string's
    character, and a name is no part of the language (a string of at most 20 characters walks the
    whole vocabulary, ~2 ms on 131k tokens, once per context instead of once per grammar).
    """
    if e in cache:
        return cache[e]
    k, a = table.node(e)
    if k == K_REF:
        if refs >= SIGNATURE_REFS:
            return None  # not cached: a shallower path may still give it an id
        cache[e] = None  # while the body is open: a reference back to it (a cycle) has no id
        out = structure_signature(table, table.rule_body(a[0]), cache, refs + 1)
    elif k == K_UNORDERED:
        out = None
    elif k == K_FRAME:
        out = structure_signature(table, a[0], cache, refs)  # frames are transparent
    elif k in (K_ALT, K_AND):  # (the first member without an id ends the search)
        members = []
        for m in a[0]:
            got = structure_signature(table, m, cache, refs)
            if got is None:
                break
            members.append(got)
        out = table.signatures.intern((k, tuple(sorted(members)))) if len(members) == len(a[0]) else None
    elif k == K_SEQ:  # folded from the right along the spine, as if by recursion
        parts = table.spine(e)
        out = structure_signature(table, parts.pop(), cache, refs)
        while parts and out is not None:
            head = structure_signature(table, parts.pop(), cache, refs)
            out = None if head is None else table.signatures.intern((k, head, out))
    elif k in (K_NOT, K_REPEAT):
        child = structure_signature(table, a[0], cache, refs)
        out = None if child is None else table.signatures.intern((k, child, *a[1:]))
    else:
        out = table.signatures.intern((k, *a))
    cache[e] = out
    return out


def _started(limit: int, m: float) -> int:
    """The most iterations of a repetition whose item's non-empty matches have at least ``m``
    bytes that ``limit`` bytes can start (each completed one takes m, the last at least 1)."""
    return 1 if m >= limit else (limit - 1) // int(m) + 1


def _completed(limit: int, m: float) -> int:
    """The most such iterations that ``limit`` bytes can complete."""
    return 0 if m > limit else limit // int(m)


def byte_flags(mask: int) -> np.ndarray:
    """The 256-bit byte set ``mask`` as booleans per byte."""
    return np.unpackbits(np.frombuffer(mask.to_bytes(32, "little"), dtype=np.uint8), bitorder="little").astype(bool)


def _refine(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    if len(p) == 1:
        return q
    if len(q) == 1:
        return p
    return tuple(x & y for x in p for y in q if x & y)


def matches(grammar: ir.Grammar | ir.Node, data: bytes) -> bool:
    """Whether ``data`` is in the language of ``grammar`` (an oracle-friendly helper for tests)."""
    g = grammar if isinstance(grammar, ir.Grammar) else ir.Grammar.of(grammar)
    table = ExprTable(g)
    s = table.start
    for b in data:
        s = table.derive(s, b)
        if s == NOTHING:
            return False
    return table.nullable(s)
