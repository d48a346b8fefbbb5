"""Continuous batching, the one scheduler every path goes through: requests join and leave
between decode steps, each with its own constraint, sampling parameters, stop ids and budget.

The scheduler owns everything that is about *requests*: the checks, admission, per-row host
matchers (the constraint's authority), forced text, the budget-aware close, stop logic, failure
isolation, results and slot compaction. How a step's tokens are produced is a ``StepBackend``'s
business: ``runner.EagerStep`` (transformers' own forward, host masks; CPU and unsupported
models) or ``graph_loop.GraphStep`` (CUDA-graph replay of the static decoder, masks from the GPU
state table; the default on CUDA). One step = the backend forwards each row's pending tokens
(one sampled token plus any forced ones; whole prompts for new rows) and samples under the
masks; the scheduler then accepts each token into its row's matcher, appends forced text,
retires finished rows and compacts the slots.

Where the backend's state table already knows where a token leads (the steady state of the GPU
path), the host does almost nothing per row: the backend asks ``outcomes`` what taking each
row's token will do (one pass: stop, budget end, forced text predicted per table state), queues
the next forward on that, and the step only records a routine row's token (and forced text
after it); the row's matcher lags behind (``_Lagging``) and catches up, one ``accept_tokens``
call for the run, before anything uses it (forced text where the table does not know the way,
the budget-aware close's first visit of a state, drafts, errors) and when the row ends. Why: the
per-row Python of a step (accepting each token, the stop and forced-text checks, each a few us)
outweighed a 256-row forward on the H200 (bench/host_step.py measures it on any CPU).

Forced text: when the constraint admits exactly one continuation (``find_jump_forward_bytes``),
we tokenize it the way the tokenizer would (canonically) and append the tokens without a forward
pass each. The last forced token is left for the model to pick under the mask, because BPE may
merge it with whatever follows (``": "`` + ``"J``...): forcing it could split text in a way the
model never saw in training. How much of it a step appends is a batch decision
(``_force_cap``): the next forward is as wide as its widest row, so where the backend measured
wide passes to cost more than the tokens they add (large batches, large models), rows take the
rest of their forced text a token a step instead (``Row.tail``), each under a mask allowing that
token alone: the same tokens, at one-token forwards that can be queued ahead.

Speculation (``speculative=``, see ``engine.speculative``): in a step with no new prompt, each
row may carry a draft. ``_draft`` walks it through the backend's ``StateCache`` (``_Walk``:
dictionary lookups; the row's matcher is walked, then rolled back, only to learn a state or
transition the cache has not seen), picking for every position the table row of the mask a
plain step would fill there (budget-aware close included), and cuts the draft at the first
token that mask forbids. Why not the matcher along every draft: accepting each token, filling
a mask per position and rolling back was 23-33% of a speculative run's wall time on the H200.
Forced text met inside a draft rides along as positions whose mask is the one canonical token
the plain path would append, so a verified draft emits exactly what plain steps would (greedy:
token-identical). The backend's ``verify`` forwards pending + draft in one pass, gathers the
masks by those rows and returns the tokens each row emits; ``_advance`` accepts them in order
(stop tokens and budgets checked at every token).

Failure isolation: a row whose mask allows nothing, or whose matcher refuses the token its mask
allowed, ends alone with ``finish_reason="error"`` (logged); the batch goes on. So does a
request that cannot run at all (empty prompt, prompt longer than the model's context).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Protocol, cast

import numpy as np
import torch

from constrain import BatchMatcher, CompiledGrammar, Matcher, Vocabulary, allocate_token_bitmask
from constrain.engine.speculative import SpeculativeConfig, choose_draft_length, choose_width, prefix_survival
from constrain.engine.state_cache import StateCache
from constrain.engine.types import GenerationRequest, GenerationResult
from constrain.matcher import TERMINATED

logger = logging.getLogger("constrain")

# The budget-aware close needs a row's own mask once its tokens left come within this many of
# the document's shortest completion (in bytes, one per token at worst); before that the plain
# mask is the same, and on the GPU path it comes from the state table with no host work.
BUDGET_MARGIN = 32
RATE_DECAY = 0.7  # weight of a row's past acceptance rate of a drafter against its latest draft
FORCED = -1  # a draft position of forced text riding along (others: the index of their drafter)
# What taking a row's sampled token does (``Scheduler.outcomes``), in rising order of the work
ROUTINE = 0  # the row goes on, one token pending; its matcher may take the token later (``_Lagging``)
GOES_ON = 1  # the same, but its matcher takes the token now (where it leads is not known yet)
DEFERS = 2  # forced text follows it, taken a token a step (``Row.tail``): the next forward stays one wide
FINISHES = 3  # the row may end: an empty mask, a stop token, its budget
FORCES = 4  # forced text follows it, appended now (the next forward is several tokens wide)


class _DraftEnd(Exception):
    """The matcher refused a forced token while drafting: the draft ends before it."""


class _Walk:
    """Where a row's constraint stands along its draft, read from a ``StateCache``: the global
    state after each walked token. The row's matcher follows (``at``) only where the cache must
    learn something, from the state it stands in; ``rollback`` puts it back."""

    __slots__ = ("cache", "matcher", "gid", "tokens", "synced")

    def __init__(self, cache: StateCache, matcher: Any, gid: int) -> None:
        self.cache, self.matcher, self.gid = cache, matcher, gid
        self.tokens: list[int] = []  # walked draft tokens
        self.synced = 0  # of them, accepted into the matcher

    @property
    def terminated(self) -> bool:
        return self.cache.local(self.gid) == TERMINATED

    def at(self) -> Any:
        """The row's matcher, walked to the walk's end."""
        m = self.matcher
        for t in self.tokens[self.synced:]:
            if not m.accept_token(t):
                raise RuntimeError(f"the matcher refused token {t} that its grammar's state table accepts")
            self.synced += 1
        return m

    def advance(self, token: int) -> bool:
        """Walk ``token`` on; False (nothing walked) where the constraint refuses it."""
        nxt = self.cache.successor(self.gid, token)
        if nxt is None:
            m = self.at()
            if not m.accept_token(token):
                return False
            self.synced += 1
            nxt = self.cache.learn_successor(self.gid, token, m.state)
        self.tokens.append(token)
        self.gid = nxt
        return True

    def rollback(self) -> None:
        if self.synced:
            self.matcher.rollback(self.synced)


class _Refused(Exception):
    """A lagging matcher refused a token while catching up (``_Lagging.caught_up``)."""

    def __init__(self, token: int) -> None:
        super().__init__(f"the constraint refused token {token} that its mask allowed")


class _Lagging:
    """A row's ``Matcher`` that may be behind by tokens the backend's state table already
    advanced past (``lag``). Why: taking a table-served row's token is the steady state of the
    GPU path, and accepting it into the matcher there (~1 us a row) is work nothing reads that
    step; ``Scheduler._take_step`` only records it. Every verb catches the matcher up first, in
    one ``accept_tokens`` call (a third of the cost per token), so the matcher is exact whenever
    it is used (forced text, the budget-aware close, drafts, errors) and when the row ends. A
    refused token raises ``_Refused`` (and so does every later use) and cuts the row's output
    before it, as if the token had been refused when sampled."""

    __slots__ = ("inner", "lag", "generated", "error")

    def __init__(self, inner: Matcher, generated: list[int]) -> None:
        self.inner = inner
        self.lag: list[int] = []  # the last tokens of ``generated``, not accepted yet
        self.generated = generated
        self.error: Exception | None = None

    def caught_up(self) -> Matcher:
        lag = self.lag
        if lag:
            self.lag = []
            try:
                n = _accept_run(self.inner, lag)
                if n < len(lag):
                    raise _Refused(lag[n])
            except Exception as exc:
                del self.generated[-len(lag):]  # a raising matcher: its accepted part is unknown
                if isinstance(exc, _Refused):
                    self.generated.extend(lag[:n])
                self.error = exc
        if self.error is not None:
            raise self.error
        return self.inner

    def __getattr__(self, name: str) -> Any:  # every verb and property, caught up first
        return getattr(self.caught_up(), name)


def _accept_run(m: Any, tokens: list[int]) -> int:
    """How many of ``tokens`` matcher ``m`` accepts in order, up to its first refusal: one
    ``accept_tokens`` call for a constrain ``Matcher`` (a third of the cost per token)."""
    if isinstance(m, Matcher):
        return m.accept_tokens(tokens)
    n = 0
    for t in tokens:
        if not m.accept_token(t):
            break
        n += 1
    return n


def _caught_up(m: Any) -> Any:
    """A row's matcher itself, caught up where it lags (raising as ``_Lagging.caught_up``)."""
    return m.caught_up() if type(m) is _Lagging else m


@dataclass(eq=False, slots=True)
class Row:
    """One admitted request: its matcher, KV slot, tokens and where it stands. (Slots: the
    steady state reads and writes a few of its fields per row and step.)"""

    rid: int
    request: GenerationRequest
    matcher: Any
    seed: int
    budget: int  # tokens it may emit (max_tokens, cut to what the model's context leaves)
    pending: list[int]  # tokens to forward next step (the prompt, then sampled + forced)
    slot: int = -1
    length: int = 0  # tokens already in the KV cache
    generated: list[int] = field(default_factory=list)
    forced: int = 0
    forced_now: int = 0  # forced tokens appended by the last step
    tail: list[int] = field(default_factory=list)  # forced tokens left to take one a step (``_force``)
    draws: int = 0
    finish_reason: str | None = None
    error: str | None = None
    # speculation: this step's draft, which of its positions are forced text, whether a bonus
    # token may follow it; draft tokens proposed / accepted so far; the lookup drafter's state
    draft: list[int] = field(default_factory=list)
    draft_kind: list[int] = field(default_factory=list)  # FORCED or the drafter's index
    draft_bonus: bool = True
    proposed: int = 0
    accepted: int = 0
    rates: dict[int, float] = field(default_factory=dict)  # per drafter: acceptance rate per token
    drafter_state: dict[object, Any] = field(default_factory=dict)  # per drafter: its own
    walk: _Walk | None = None  # while drafting: where the constraint stands along the draft


class StepBackend(Protocol):
    """Produces one step's tokens for rows ``0..len(batch)-1`` (row i = KV slot i)."""

    @property
    def max_rows(self) -> int: ...

    @property
    def max_len(self) -> int: ...

    @property
    def cache(self) -> StateCache:
        """The constraint states the backend's masks come from; drafts walk through it, and
        verification gathers their masks by its table rows."""
        ...

    def host_masks(self, batch: list[Row]) -> list[Row]:
        """The rows whose next masks the host computes from their matchers: all of them where
        the backend fills masks on the host; on a state-table path only the rows the table cannot
        serve and those whose last token missed (their new state's mask goes into the table)."""
        ...

    def step(self, batch: list[Row], n_old: int, scheduler: Scheduler) -> list[int]:
        """Forward each row's ``pending`` tokens (rows from ``n_old`` on are new: their prompt),
        sample one token per row under its constraint (``scheduler.fill_mask`` for host masks);
        -1 where a mask allowed nothing. A backend that knows where the tokens lead in its
        ``cache`` passes that to ``scheduler.outcomes`` before returning (routine rows are then
        taken without their matchers)."""
        ...

    def verify(self, batch: list[Row], rows: torch.Tensor, scheduler: Scheduler) -> list[list[int]]:
        """Speculative step (no new rows): forward each row's ``pending + draft`` in one pass and
        verify the drafts under the masks of ``cache``'s table rows ``rows`` (B, positions) for
        constrained rows (``speculative.verify``): per row, the accepted draft tokens then the
        correction or bonus."""
        ...

    def step_time(self, rows: int, width: int, need: int) -> float | None:
        """Time of a forward of ``width`` tokens per row over ``rows`` rows whose longest has
        ``need`` tokens after it, a one-token plain step's being 1, where the backend measured
        it; None: the scheduler's default model."""
        ...

    def sync(self, batch: list[Row]) -> None:
        """After the scheduler advanced the rows' matchers (forced text included)."""
        ...

    def move_rows(self, moves: list[tuple[int, int, int]], live: int) -> None:
        """Compaction: ``(src, dst, length)`` slot moves; rows ``live..`` are free afterwards."""
        ...


class Scheduler:
    """Owns the waiting queue and the running batch of one ``StepBackend``.

    ``add`` may be called at any time, also between ``step`` calls while others are running.
    ``context_len`` (the model's context) bounds prompt + output; ``encode`` tokenizes forced text.
    ``speculative`` turns drafting on (``SpeculativeConfig.parse``: a config, "forced",
    "lookup", "forced+lookup", True); None: plain steps only.
    """

    def __init__(self, backend: StepBackend, vocab: Vocabulary, encode: Callable[[str], list[int]],
                 max_prefill_tokens: int = 8192, context_len: int | None = None,
                 speculative: SpeculativeConfig | str | bool | None = None) -> None:
        self.backend = backend
        # Computes a step's uncached masks before the backend fills rows one by one, in this thread:
        # replays of the engine bench's outputs on the H200's host (16 cores) ran 1.1-1.7x longer
        # with the masks spread over threads (each ~100 us of mostly Python: the GIL serialises it
        # and every hand-off costs a wake-up) at batch 16, 64 and 256.
        self.masks = BatchMatcher(max_threads=1)
        self.vocab = vocab
        self.encode = encode
        self.max_prefill_tokens = max_prefill_tokens
        self.context_len = context_len
        self.waiting: deque[Row] = deque()
        self.running: list[Row] = []
        self._rejected: list[tuple[int, GenerationResult]] = []
        self._next_id = 0
        self._scratch = allocate_token_bitmask(1, vocab.vocab_size)
        self._stop_set = set(vocab.eos_token_ids)
        self._codes: list[int] | None = None  # this step's ``outcomes``, where the backend asked
        self._cap: int | None = None  # forced tokens a row appends this step (``_force_cap``; None: all)
        self._runs: list[tuple[int, list[int]]] = []  # this step's rows that force text, and their tokens (``outcomes``)
        self._nexts: list[int] = []  # ... and the states its tokens led to
        self.speculative = SpeculativeConfig.parse(speculative)
        self._drafters = self.speculative.build() if self.speculative is not None else []
        self._hosted = np.zeros((0, (vocab.vocab_size + 31) // 32), dtype=np.int32)  # ready matchers' masks

    # -- queue -------------------------------------------------------------------------------
    def add(self, request: GenerationRequest) -> int:
        """Queue a request; returns its id (results are reported with it). A request that cannot
        run gets an error result at the next ``step``, without affecting the others."""
        rid = self._next_id
        self._next_id += 1
        n = len(request.prompt_ids)
        budget = request.max_tokens
        if self.context_len is not None:
            budget = min(budget, self.context_len - n)
        problem = None
        if n == 0:
            problem = "prompt must contain at least one token"
        elif self.context_len is not None and n >= self.context_len:
            problem = (f"prompt of {n} tokens does not fit the model's context of {self.context_len} tokens "
                       "(it leaves no room for output): shorten the prompt")
        elif n + budget > self.backend.max_len:
            problem = (f"prompt ({n}) + max_tokens ({budget}) exceeds the KV cache length "
                       f"{self.backend.max_len}")
        if problem is not None:
            logger.warning("request %d: %s", rid, problem)
            self._rejected.append((rid, GenerationResult("", [], "error", n, error=problem,
                                                         constrained=request.grammar is not None)))
            return rid
        matcher = request.matcher
        if matcher is None and request.grammar is not None:
            matcher = request.grammar.matcher()
        row = Row(rid, request, matcher, request.sampling.resolved_seed(), budget, list(request.prompt_ids))
        if isinstance(matcher, Matcher) and request.grammar is not None:  # table-served: may lag
            row.matcher = _Lagging(matcher, row.generated)
        self._force(row)
        self.waiting.append(row)
        return rid

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._rejected)

    # -- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[tuple[int, GenerationResult]]:
        """Run one decode step for every running sequence (admitting waiting ones first)."""
        done, self._rejected = self._rejected, []
        old = self.running
        new: list[Row] = []
        budget = self.max_prefill_tokens
        while self.waiting and len(old) + len(new) < self.backend.max_rows:
            cand = self.waiting[0]
            if new and len(cand.pending) > budget:
                break
            budget -= len(cand.pending)
            new.append(self.waiting.popleft())
        if not old and not new:
            return done
        for i, s in enumerate(new):
            s.slot = len(old) + i
        batch = old + new
        self._prepare_masks(batch)
        rows = self._draft_all(batch) if self.speculative is not None and not new else None
        if rows is not None:
            for s, toks in zip(batch, self.backend.verify(batch, rows, self)):
                if s.finish_reason is not None:  # failed while drafting
                    continue
                toks = self._count_draft(s, toks)
                # every emitted token but the last was forwarded (as pending or draft): in the cache
                s.length += len(s.pending) + len(toks) - 1
                s.pending = []
                self._advance(s, toks)
        else:
            self._codes, self._cap = None, None
            self._take_step(batch, self.backend.step(batch, len(old), self))
            self._cap = None
        self.backend.sync(batch)
        self.running = batch
        return done + self._retire()

    # -- constraint, shared by every backend --------------------------------------------------
    def _prepare_masks(self, batch: list[Row]) -> None:
        """The plain masks of the rows' current states that no cache holds yet, computed before
        the backend fills its rows one by one from the caches (on the graph path: while the
        forward queued ahead runs). A matcher that raises here raises again in its own fill,
        which fails its request alone."""
        matchers = []
        for s in self.backend.host_masks(batch):
            m = s.matcher
            if type(m) is _Lagging and not m.lag and m.error is None:  # (they took their tokens)
                m = m.inner
            if isinstance(m, Matcher) and s.finish_reason is None:
                matchers.append(m)
        if len(matchers) > 1:
            try:
                self.masks.prepare(matchers)
            except Exception:  # each row's own fill reports its matcher's error
                logger.debug("preparing the batch's masks raised; the rows' own fills report it", exc_info=True)

    def budget_left(self, s: Row, ahead: int = 0) -> int | None:
        """Tokens left when the budget-aware close must shape ``s``'s mask, else None, asked of
        its matcher (``ahead``: tokens the matcher stands past the row's own). Paths serving
        masks from a ``StateCache`` apply the same rule per state (``_budget_row``)."""
        if not s.request.budget_close or s.request.grammar is None:
            return None
        m = s.matcher
        left = s.budget - len(s.generated) - ahead
        # Beyond the margin the close is not consulted (a cheap test: one token would have to add
        # over BUDGET_MARGIN bytes to the shortest completion); within it the matcher answers
        # exactly, so rows whose every next state still fits keep the plain (GPU table) mask.
        if left - 2 >= m.min_completion_bytes() + BUDGET_MARGIN:
            return None
        return left if m.budget_binds(left) else None

    def fill_mask(self, s: Row, bitmask: torch.Tensor | np.ndarray, row: int) -> None:
        """``s``'s matcher's mask into ``bitmask`` row ``row``, budget-aware near the end
        (``_fill_close``). A matcher that raises fails its own request (the row's mask left empty;
        the step discards the row's token), not the batch."""
        if s.tail:  # forced text taken a token a step: its next token alone
            bitmask[row] = 0
            t = s.tail[0]
            bitmask[row, t >> 5] = (1 << (t & 31)) - (1 << 32 if t & 31 == 31 else 0)
            return
        try:
            self._fill_close(s.matcher, bitmask, row, self.budget_left(s))
        except Exception as exc:  # a broken matcher ends its own request, not the batch
            self._fail_raised(s, exc, "filling its mask")
            bitmask[row] = 0

    @staticmethod
    def _fill_close(m: Any, bitmask: torch.Tensor | np.ndarray, row: int, left: int | None) -> None:
        """``m``'s mask into ``bitmask`` row ``row``: the budget-aware close at ``left`` tokens
        left (None: the plain mask). When even the close is impossible (a budget smaller than the
        shortest document) the budget mask is empty: the plain mask is used and the request ends
        with "length"."""
        if left is None:
            m.fill_next_token_bitmask(bitmask, row)
            return
        m.fill_next_token_bitmask(bitmask, row, tokens_left=left)
        if not bool(bitmask[row].any()):
            m.fill_next_token_bitmask(bitmask, row)

    def table_row(self, s: Row, cache: StateCache, gid: int) -> int | None:
        """Table row of ``s``'s mask at its state ``gid`` (``_budget_row``), for a backend serving
        masks from ``cache``; None when the matcher raised, which fails the request alone. A row
        taking forced text a token a step stands in the chain of its tail (``StateCache.chain``:
        its one-token masks lead from row to row on the GPU, then to the state after the text)."""
        if s.tail:
            row = cache.chain(gid, s.tail)
            if row is not None:
                return row
            s.tail = []  # the grammar refuses the tokenized text: the model picks from here
        if not s.request.budget_close:
            return gid  # the state's own row: the table holds it since the row reached the state
        m = s.matcher
        at = m.caught_up if type(m) is _Lagging else lambda: m  # asked only what the cache lacks
        try:
            return self._budget_row(cache, gid, s.budget - len(s.generated) - 2, at)
        except Exception as exc:  # a broken matcher ends its own request, not the batch
            self._fail_raised(s, exc, "filling its mask")
            return None

    def _mask_row(self, s: Row, walk: _Walk) -> int:
        """Table row of the mask a plain step fills at ``walk``'s end (``_budget_row``), its
        host copy stored (the draft's next token is tested against it)."""
        cache, gid = walk.cache, walk.gid
        if s.request.budget_close:
            row = self._budget_row(cache, gid, s.budget - len(s.generated) - len(walk.tokens) - 2, walk.at)
            if row != gid:
                return row
        cache.row(gid, walk.at)
        return gid

    def _budget_row(self, cache: StateCache, gid: int, after: int, at: Callable[[], Any]) -> int:
        """``budget_left``'s rule per state, with ``after`` bytes left after the next token (tokens
        left - 2): the state's own row while ``after`` reaches its shortest completion +
        BUDGET_MARGIN or the longest of its next states' shortest completions (the second asked
        only within the margin; then the threshold is exact: below it the close binds), else its
        close row. The threshold is kept per state in the cache (``StateCache.plain_from``)."""
        plain, exact = cache.plain_from.get(gid, (float("inf"), False))
        if after >= plain:
            return gid
        if not exact:
            plain = cache.min_completion(gid, at) + BUDGET_MARGIN
            exact = after < plain
            if exact:
                plain = min(plain, cache.max_next_completion(gid, at))
            cache.plain_from[gid] = plain, exact
        return gid if after >= plain else self._close_row(cache, gid, after + 2, at)

    def _close_row(self, cache: StateCache, gid: int, left: int, at: Callable[[], Any]) -> int:
        """Table row of state ``gid``'s close mask with ``left`` tokens left (the close binds):
        computed the first time its level is met, by the matcher ``at()`` standing there."""
        def fill() -> np.ndarray:
            self._fill_close(at(), self._scratch, 0, left)
            return self._scratch[0].numpy()

        return cache.close(gid, at, left, fill)

    def _take_step(self, batch: list[Row], tokens: list[int]) -> None:
        """A plain step's sampled tokens into the rows. A row ``outcomes`` found routine (the
        backend calls it when it knows where the tokens lead) only records its token: its matcher
        takes it when next used (``_Lagging``); so does one whose token leads to forced text, and
        the text (``_force``). The others go through ``_advance``."""
        codes, nexts = self._codes, self._nexts
        if codes is None or len(codes) != len(batch):
            codes, nexts = [GOES_ON] * len(batch), [-1] * len(batch)
        for s, t, code, gid in zip(batch, tokens, codes, nexts):
            if s.finish_reason is not None:  # failed while its mask was prepared
                continue
            s.length += len(s.pending)
            tailing = bool(s.tail)
            if tailing:  # its mask allowed the tail's next token alone
                if s.tail[0] == t:
                    del s.tail[0]
                    s.forced += 1
                else:  # not the token its mask allowed: the matcher judges it
                    s.tail = []
                    code = GOES_ON
            if code == ROUTINE or code in (FORCES, DEFERS) and gid >= 0 and type(s.matcher) is _Lagging:
                s.pending = [t]
                s.generated.append(t)
                s.draws += 1
                s.forced_now = 0
                if s.matcher is not None:
                    s.matcher.lag.append(t)
                if code != ROUTINE:
                    self._force(s, gid)
            else:
                s.pending = []
                self._advance(s, [t], force=not tailing)  # (no forced text follows a tail's token)

    def _advance(self, s: Row, tokens: list[int], force: bool = True) -> None:
        """Accept a step's tokens in order (one sampled token, or a verified draft's), then
        append forced text after the last (``force``); a stop, an error or the budget ends the
        row there."""
        s.draws += 1
        s.forced_now = 0
        try:
            m = _caught_up(s.matcher)
        except Exception as exc:  # a broken matcher ends its own request, not the batch
            self._fail_raised(s, exc, "catching up")
            return
        for token in tokens:
            if not self._take(s, m, token):
                return
            if len(s.generated) >= s.budget:
                # Out of budget. If the document is complete and only a stop token may follow,
                # the output is whole: report "stop". Otherwise "length": never presented as valid.
                s.finish_reason = "stop" if self._only_stop_allowed(s) else "length"
                return
        s.pending = [tokens[-1]]
        if force:
            self._force(s)

    def _take(self, s: Row, m: Any, token: int) -> bool:
        """One emitted token into the row (``m``: its matcher, caught up); False when it ended
        the row (stop or error)."""
        if m is not None:
            if token < 0:
                self._fail(s, "the constraint allows no token here (empty mask)")
                return False
            try:
                ok = m.accept_token(token)
            except Exception as exc:  # a broken matcher ends its own request, not the batch
                self._fail_raised(s, exc, f"on token {token}")
                return False
            if not ok:
                self._fail(s, f"the constraint refused token {token} that its mask allowed")
                return False
            if m.is_terminated():
                s.finish_reason = "stop"
                return False
        elif token in s.request.stop_token_ids:
            s.finish_reason = "stop"
            return False
        s.generated.append(token)
        return True

    # -- speculation ---------------------------------------------------------------------------
    def _draft_all(self, batch: list[Row]) -> torch.Tensor | None:
        """Every row's draft and the table rows of its masks (None when no row has a draft: a
        plain step). A ready matcher's mask (no grammar: no table state) goes to its row's
        scratch row of the table."""
        cfg = self.speculative
        assert cfg is not None
        cache = self.backend.cache
        positions = 3 * cfg.max_draft + 1  # drafted tokens, forced text riding along, the bonus
        rows = np.zeros((len(batch), positions), dtype=np.int64)
        if len(self._hosted) < len(batch):
            self._hosted = np.zeros((self.backend.max_rows, self._hosted.shape[1]), dtype=np.int32)
        hosted = []
        for i, s in enumerate(batch):
            s.draft, s.draft_kind, s.draft_bonus = [], [], True
            if s.matcher is not None and s.request.grammar is None:  # no rollback promised: a plain draw
                self.fill_mask(s, self._hosted, i)
                rows[i, 0] = i
                hosted.append(i)
                continue
            try:
                self._draft(s, cache, rows[i], positions - 1)
            except Exception as exc:  # a broken matcher ends its own request, not the batch
                self._fail(s, f"drafting raised {type(exc).__name__}: {exc}")
                s.draft, s.draft_kind = [], []
        if hosted:
            cache.write_scratch(hosted, torch.from_numpy(self._hosted[hosted]))
        if cfg.batch_width:
            self._cut_to_width(batch)
        if not any(s.draft for s in batch):
            return None
        width = 1 + max(len(s.draft) for s in batch)
        return torch.from_numpy(rows[:, :width])

    def _draft(self, s: Row, cache: StateCache, rows: np.ndarray, room: int) -> None:
        """Propose ``s``'s draft and the table rows of its masks (``rows[j]``: position j's),
        walking it through ``cache`` (``_Walk``): the draft is cut at the first token its mask
        forbids, at a stop, and where the budget ends; forced text the plain path would append
        rides along with a one-token mask. Rows that cannot speculate get no draft (a plain draw
        from mask 0)."""
        cfg = self.speculative
        assert cfg is not None
        req, m = s.request, s.matcher
        sp = req.sampling
        walk = None
        if m is not None:
            assert req.grammar is not None
            walk = s.walk = _Walk(cache, m, cache.enter(req.grammar, m.state))
        try:
            if walk is not None:
                rows[0] = self._mask_row(s, walk)
            if sp.temperature > 0 and (sp.top_k > 0 or sp.top_p < 1):
                return  # top-k/top-p: a plain draw
            self._walk_draft(s, walk, rows, min(room, s.budget - len(s.generated) - 1))
        finally:
            s.walk = None
            if walk is not None:
                walk.rollback()

    def _walk_draft(self, s: Row, walk: _Walk | None, rows: np.ndarray, room: int) -> None:
        """``_draft``'s loop (``room``: the tokens the draft may take; the last emitted token
        needs one more)."""
        cfg = self.speculative
        assert cfg is not None
        draft, kinds = s.draft, s.draft_kind
        drafted = 0
        queue: list[tuple[int, int]] = []  # proposed (token, kind) not walked yet
        try:
            while len(draft) < room and not (walk is not None and walk.terminated):
                j = len(draft)
                run = self._forced_run(s, j) if j and kinds[-1] != FORCED else []
                if run:
                    assert walk is not None
                    if j + len(run) > room:  # cut before it: the plain path forces from here
                        break
                    for t in run:  # the mask is the forced token: accepted for sure, as if forced
                        rows[j] = walk.cache.token_row(t)
                        if not walk.advance(t):  # as the plain path: the model picks from here
                            rows[j] = self._mask_row(s, walk)
                            raise _DraftEnd
                        draft.append(t)
                        kinds.append(FORCED)
                        j += 1
                    rows[j] = self._mask_row(s, walk)
                    queue = []
                    continue
                if not queue:
                    if drafted >= cfg.max_draft:
                        break
                    queue = self._propose(s, min(room - j, cfg.max_draft - drafted))
                    if not queue:
                        break
                x, kind = queue.pop(0)
                if not 0 <= x < self.vocab.vocab_size:
                    break  # never forwarded, masked or not: the model has no such token
                if walk is not None:
                    if not (int(walk.cache.host_row(int(rows[j]))[x >> 5]) >> (x & 31)) & 1:
                        if not cfg.mask_drafts:  # unmasked drafts: verification rejects it
                            draft.append(x)
                            kinds.append(kind)
                        break
                    if not walk.advance(x):
                        break
                draft.append(x)
                kinds.append(kind)
                drafted += 1
                if walk is None:
                    if x in s.request.stop_token_ids:
                        break
                else:
                    rows[j + 1] = self._mask_row(s, walk)
        except _DraftEnd:
            pass
        if draft and kinds[-1] != FORCED and self._forced_run(s, len(draft)):
            s.draft_bonus = False  # the plain path would force, not sample, after this draft

    def _cut_to_width(self, batch: list[Row]) -> None:
        """Cut every row's draft to the verify width ``speculative.choose_width`` picks for the
        batch: per row the chance each prefix survives (its acceptance rate of the drafter that
        proposed each token, forced text 1.0), per width the step's time (``_step_times``).
        Arrays of rows x widths: this runs every step, for every row and width."""
        longest = max(len(s.draft) for s in batch)
        if not longest:
            return
        rows = [self._safe_cuts(s, longest) for s in batch]
        gains = []
        for s, cut in zip(batch, rows):  # 1 + the expected accepted tokens of each prefix length
            rates = s.rates
            pre = list(accumulate(prefix_survival([1.0 if k == FORCED else rates.get(k, 1.0) for k in s.draft_kind]),
                                  initial=1.0))
            gains.append([pre[c] for c in cut])
        cuts = np.array(rows)
        w = choose_width(gains, self._step_times(batch, cuts))
        for s, c in zip(batch, cuts[:, w].tolist()):
            if c < len(s.draft):
                # cut just before a forced run: the plain path forces it after the draft, no bonus
                s.draft_bonus = c == 0 or s.draft_kind[c] != FORCED
                s.draft, s.draft_kind = s.draft[:c], s.draft_kind[:c]

    @staticmethod
    def _safe_cuts(s: Row, longest: int) -> list[int]:
        """``s``'s draft length when cut to at most w tokens, for w = 0..``longest``, never inside
        forced text riding along: the plain path appends a forced run whole (tokenized as one),
        so a verified part of one followed by a re-forced rest could tokenize differently."""
        kinds = s.draft_kind
        n = len(kinds)
        out = [0]
        for w in range(1, n):
            out.append(out[-1] if kinds[w - 1] == FORCED and kinds[w] == FORCED else w)
        return out + [n] * (longest + 1 - len(out))

    def _step_times(self, batch: list[Row], cuts: np.ndarray) -> list[float]:
        """Per width w, the time of a step forwarding each row's pending tokens and its draft cut
        to ``cuts[:, w]``, a one-token plain step's being 1: the backend's ``step_time`` where it
        measured this bucket (``GraphRunner.step_time``: each captured forward timed at its
        length; pending forced text makes even a plain step a several-token pass there), else the
        default model 1 + cost * (longest draft)."""
        assert self.speculative is not None
        pending = np.array([len(s.pending) for s in batch])[:, None]
        ends = pending + np.array([s.length for s in batch])[:, None]
        out = []
        for width, need, cut in zip((pending + cuts).max(0).tolist(), (ends + cuts).max(0).tolist(),
                                    cuts.max(0).tolist()):
            t = 1.0 if width == 1 else self.backend.step_time(len(batch), width, need)
            out.append(t if t is not None else 1.0 + self.speculative.cost * cut)
        return out

    def _forced_run(self, s: Row, ahead: int) -> list[int]:
        """The forced tokens a plain step appends at ``s``'s (walked) state, ``ahead`` tokens on."""
        if s.matcher is None or not self._may_force(s, ahead):
            return []
        return self.forced_ids(s)[:-1][: s.budget - len(s.generated) - ahead - 1]

    def _propose(self, s: Row, k: int) -> list[tuple[int, int]]:
        """Up to ``k`` (token, drafter index) draft tokens at ``s``'s walked state, each drafter
        continuing the one before (an adaptive drafter is held to what its rate makes worth it)."""
        cfg = self.speculative
        assert cfg is not None
        out: list[tuple[int, int]] = []
        for i, drafter in enumerate(self._drafters):
            n = k - len(out)
            if n <= 0:
                break
            if cfg.adaptive and drafter.adaptive:
                n = min(n, max(1, choose_draft_length(s.rates.get(i, 1.0), cfg.max_draft, cfg.cost)))
            out += [(t, i) for t in drafter.propose(s, s.draft + [t for t, _ in out], n, self)[:n]]
        return out

    def _count_draft(self, s: Row, toks: list[int]) -> list[int]:
        """Draft statistics of a verified step; the bonus token is dropped where the plain path
        would force text instead of sampling."""
        if not s.draft:
            return toks
        n_acc = len(toks) - 1
        if n_acc == len(s.draft) and not s.draft_bonus:
            toks = toks[:-1]
        kinds = s.draft_kind
        s.proposed += sum(k != FORCED for k in kinds)
        s.accepted += sum(k != FORCED for k in kinds[:n_acc])
        s.forced += sum(k == FORCED for k in kinds[:n_acc])
        for i in range(len(self._drafters)):
            looked = sum(k == i for k in kinds)
            if looked:  # every drafter's rate: the batch width weighs each token by it
                hit = sum(k == i for k in kinds[:n_acc])
                rate = 1.0 if hit == looked else hit / (hit + 1)  # per-token rate, from a censored run
                s.rates[i] = RATE_DECAY * s.rates.get(i, 1.0) + (1 - RATE_DECAY) * rate
        return toks

    def _fail(self, s: Row, message: str) -> None:
        s.finish_reason = "error"
        s.error = f"request {s.rid}: {message} after {len(s.generated)} tokens (a bug, please report)"
        logger.error("%s; the rest of the batch goes on", s.error)

    def _fail_raised(self, s: Row, exc: Exception, where: str) -> None:
        """``s`` ends with what its matcher raised ``where`` (a lagging one's refusal says it all)."""
        self._fail(s, str(exc) if isinstance(exc, _Refused) else f"the constraint raised {type(exc).__name__}: {exc} {where}")

    def _force(self, s: Row, gid: int = -1) -> None:
        """Append the forced continuation's canonical tokens (all but the last), accepted into
        the matcher, within the budget; past this step's cap (``_force_cap``) they become the
        row's ``tail``, taken a token a step under one-token masks (the same tokens: the model's
        logits are computed at every one of them either way). ``gid``: the state of the backend's
        cache the row stands in while its matcher lags (``_take_step``): the tokens are recorded
        for the matcher to take later, the cache learning where they lead (``StateCache.walk``,
        by the grammar)."""
        grammar = s.request.grammar
        if grammar is None or not self._may_force(s):
            return
        room = s.budget - len(s.generated) - 1
        n = 0
        ids: list[int] = []
        now = room if self._cap is None else min(room, self._cap)
        try:
            if gid >= 0:
                ids = self._forced_of(grammar, gid)[:-1][:room]
                if self.backend.cache.walk(gid, ids[:now]) is None:  # the grammar refuses one: the matcher says
                    gid = -1
                else:
                    s.matcher.lag.extend(ids[:now])
                    n = len(ids[:now])
            if gid < 0:
                m = _caught_up(s.matcher)
                ids = self._forced_of(grammar, self.backend.cache.state_id(grammar, m.state))[:-1][:room]
                n = _accept_run(m, ids[:now])
        except Exception as exc:  # a broken matcher ends its own request, not the batch
            self._fail_raised(s, exc, "on forced text")
        s.generated.extend(ids[:n])
        s.pending.extend(ids[:n])
        s.forced += n
        s.forced_now = n
        if n == min(now, len(ids)) and s.finish_reason is None:
            s.tail = ids[n:]

    # predictions for a backend that works ahead of ``_advance`` (cheap, per batch)
    def outcomes(self, batch: list[Row], tokens: list[int], nexts: list[int]) -> list[int]:
        """Per row, what taking its sampled token will do (``ROUTINE``, ``GOES_ON``, ``FINISHES``
        or ``FORCES``), asked by a backend that knows where the tokens lead before ``step`` takes
        them (``nexts[i]``: the state of its ``cache`` row i's token led to, -1 where unknown):
        it queues the next forward ahead on them, and the step takes the routine rows' tokens
        without their matchers (``_take_step``)."""
        stops, forced = self._stop_set, self.backend.cache.forced
        codes: list[int] = []
        append = codes.append
        runs: list[tuple[int, list[int]]] = []  # (row, the forced tokens ``_force`` appends uncapped)
        for i, (s, t, g) in enumerate(zip(batch, tokens, nexts)):
            m = s.matcher
            left = s.budget - len(s.generated)
            if t < 0 or left <= 1 or s.finish_reason is not None or t in (
                    stops if m is not None else s.request.stop_token_ids):
                append(FINISHES)
                continue
            if m is None:
                append(ROUTINE)
                continue
            req = s.request
            if left > 2 and req.force_tokens and req.grammar is not None and not s.tail:  # (``_may_force(s, 1)``)
                run = forced.get(g) if g >= 0 else None  # (``_forced_after``, inline: once per row and step)
                if run is None:
                    run = self._forced_after(s, t, g)
                if len(run) > 1:
                    runs.append((i, run[:-1][:left - 2]))  # (all but the last, within ``_force``'s room)
                    append(FORCES)
                    continue
                if s.finish_reason is not None:  # its matcher raised predicting it
                    append(FINISHES)
                    continue
            append(ROUTINE if g >= 0 and type(m) is _Lagging else GOES_ON)
        if runs and self.speculative is None:
            self._cap = self._force_cap(batch, [len(run) for _, run in runs])
            if self._cap == 0:
                for i, _ in runs:
                    codes[i] = DEFERS
        self._codes, self._nexts, self._runs = codes, nexts, runs
        return codes

    def pending_after(self, batch: list[Row], tokens: list[int]) -> list[list[int]]:
        """The tokens each row of ``batch`` (a prefix of this step's) forwards next step, as
        ``_take_step`` will leave them: its sampled token, then the forced tokens ``_force``
        appends at this step's cap; predicted from ``outcomes`` for a backend queueing that
        forward ahead. A wrong prediction (the grammar refusing text the cache tokenized, a
        matcher failing) costs one forward, which the next step redoes."""
        out = [[t] for t in tokens]
        cap = self._cap
        if cap != 0:
            for i, run in self._runs:
                if i < len(out):
                    out[i] += run if cap is None else run[:cap]
        return out

    def _force_cap(self, batch: list[Row], runs: list[int]) -> int | None:
        """How many forced tokens each row appends this step (the rest of its text: its tail,
        a token a step), given the forced runs ``runs`` of the rows that force: the width w
        maximising the batch's tokens per time, (rows + sum min(run, w)) / step_time(1 + w), a
        plain step's time being 1 (``speculative.choose_width`` over the backend's measured
        step times). Why: the step forwards every row as wide as its widest; at batch 1 a
        wide pass costs about a plain one and forcing whole text is nearly free, while at 256
        rows of an 8B model a width-8 pass costs several plain steps and one row's forced key
        made all 256 rows pay it (0.38x unconstrained). None (all of it) until the backend has
        timed a wide pass (the first wide pass is how it gets timed)."""
        n = len(batch)
        longest = max(runs)
        reach = max(s.length + len(s.pending) for s in batch) + 1  # the next forward's attended end, one wide
        widths, gains, times = [0], [float(n)], [1.0]
        for w in range(1, longest + 1):
            t = self.backend.step_time(n, 1 + w, reach + w)
            if t is not None:
                widths.append(w)
                gains.append(n + sum(min(r, w) for r in runs))
                times.append(t)
        if len(widths) == 1:
            return None
        w = widths[choose_width([gains], times)]
        return None if w >= longest else w

    @staticmethod
    def _may_force(s: Row, ahead: int = 0) -> bool:
        """Whether ``s`` may append forced text ``ahead`` tokens on: it forces text, and its
        budget leaves room for a forced token before the last."""
        req = s.request
        return req.grammar is not None and req.force_tokens and s.budget - len(s.generated) - ahead > 1

    def _forced_after(self, s: Row, token: int, gid: int) -> list[int]:
        """The forced run (``forced_ids``) after ``s`` takes ``token``, which leads to the backend
        cache's state ``gid`` (-1: unknown, asked of the row's matcher); ``_force`` appends all
        but its last token."""
        grammar = s.request.grammar
        assert grammar is not None
        if gid >= 0:
            return self._forced_of(grammar, gid)
        try:
            local = grammar.next_state(s.matcher.state, token)
        except Exception as exc:  # a broken matcher ends its own request, not the batch
            self._fail_raised(s, exc, "predicting forced text")
            return []
        # < 0: refused or a stop, the row ends
        return self._forced_of(grammar, self.backend.cache.state_id(grammar, local)) if local >= 0 else []

    def forced_ids(self, s: Row) -> list[int]:
        """The canonical tokens of the forced text at ``s``'s state (while drafting: the state the
        draft is walked to), all of them (plain steps append all but the last); none if they do
        not spell it, or after a stop token."""
        grammar = s.request.grammar
        assert grammar is not None
        w = s.walk
        return self._forced_of(grammar, self.backend.cache.state_id(grammar, s.matcher.state) if w is None else w.gid)

    def _forced_of(self, grammar: CompiledGrammar, gid: int) -> list[int]:
        """``forced_ids`` at the backend cache's state ``gid`` (of ``grammar``), tokenized once per
        state for every run over the backend (``StateCache.forced``)."""
        cache = self.backend.cache
        ids = cache.forced.get(gid)
        if ids is None:
            ids = cache.forced[gid] = self._canonical(grammar.forced_bytes(cache.local(gid)))
        return ids

    def _canonical(self, data: bytes) -> list[int]:
        text = data.decode("utf-8", "ignore")
        ids = self.encode(text) if text else []
        tb = self.vocab.token_bytes
        if not ids or any(i >= len(tb) or tb[i] is None for i in ids):
            return []
        if b"".join(tb[i] or b"" for i in ids) != text.encode("utf-8"):  # e.g. a SentencePiece dummy prefix
            return []
        return ids

    def _only_stop_allowed(self, s: Row) -> bool:
        """Whether the document is complete and nothing but a stop token may follow."""
        m = s.matcher
        if s.request.grammar is None or not m.is_accepting():
            return False
        m.fill_next_token_bitmask(self._scratch, 0)
        words = self._scratch[0].numpy().view(np.uint32).copy()
        for e in self._stop_set:
            if e < self.vocab.vocab_size:
                words[e >> 5] &= np.uint32(~(1 << (e & 31)) & 0xFFFFFFFF)
        return not bool(words.any())

    # -- results -----------------------------------------------------------------------------
    def _retire(self) -> list[tuple[int, GenerationResult]]:
        running = self.running  # in slot order: row i is in slot i
        done = [s for s in running if s.finish_reason is not None]
        if not done:
            return []
        for s in done:  # every matcher ends where the row's tokens put it
            try:
                _caught_up(s.matcher)
            except Exception as exc:
                if s.error is None:
                    self._fail_raised(s, exc, "catching up")
        n = len(running) - len(done)
        # swap-with-last keeps live slots in 0..n-1: the live rows past n fill the holes below it
        holes = [s.slot for s in done if s.slot < n]
        movers = [s for s in running[n:] if s.finish_reason is None]
        alive = running[:n]
        moves = []
        for s, hole in zip(movers, holes):
            moves.append((s.slot, hole, s.length))
            s.slot = hole
            alive[hole] = s
        self.backend.move_rows(moves, n)
        self.running = alive
        return [(s.rid, self._result(s)) for s in done]

    def _result(self, s: Row) -> GenerationResult:
        tb = self.vocab.token_bytes
        try:  # every token has bytes (a constrained output always): one C-level join
            raw = b"".join(map(cast("list[bytes]", tb).__getitem__, s.generated))
        except (TypeError, IndexError):  # specials or padding ids (unconstrained rows) add nothing
            raw = b"".join(tb[t] or b"" if t < len(tb) else b"" for t in s.generated)
        return GenerationResult(
            text=raw.decode("utf-8", "replace"),
            token_ids=list(s.generated),
            finish_reason=s.finish_reason,  # type: ignore[arg-type]
            prompt_tokens=len(s.request.prompt_ids),
            forced_tokens=s.forced,
            constrained=s.matcher is not None,
            error=s.error,
            draft_tokens=s.proposed,
            accepted_draft_tokens=s.accepted,
            steps=s.draws,
        )
