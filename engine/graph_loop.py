"""The scheduler's fast step backend: CUDA-graph replay of the static decoder, masks from the
GPU state table (``GraphStep`` over ``GraphRunner``).

- Forward: rows that append one token (the steady state) replay the captured one-token step;
  a step where some row appends forced text, and a speculative step (pending + draft), replay
  the several-tokens-per-row pass of the static decoder (``GraphRunner.verify_forward``, eager
  past its widest bucket; its replays timed at capture are the step times by which the scheduler
  caps forced text, ``Scheduler._force_cap``); new prompts are prefilled by the eager ragged forward.
- Constraint: each constrained row's state lives on the GPU (``StateCache`` over a
  ``kernels.StateTable``). The captured sample gathers each row's mask by its state, samples and
  advances the state on the GPU. The host reads back (token, state, miss) once per step; the
  scheduler decides what each token does from them (``Scheduler.outcomes``) and its matchers
  take the tokens, lazily where the table knew the next state (they stay the authority: forced
  text, stops, errors, results), and the host works only on misses (a state or transition seen for the first time: computed by
  constrain, stored, never missed again; see ``StateCache``), resolved during the *next* step's
  forward (which reads tokens, not states) and patched in before that step's sample.
- Forced text taken a token a step (``Row.tail``): the row points at the first of its chain rows
  (``StateCache.chain``), one-token masks that lead from one to the next on the GPU.
- The budget-aware close near the end of a budget: the row points at its state's close row for
  the budget's level (``Scheduler.table_row`` over ``StateCache.close``: computed on the host
  once per state and level, then served from the table and advanced on the GPU like the state
  itself).
- Rows whose mask the table cannot give (a request that brings its own matcher, ``table=False``)
  have their matcher fill a mask on the host into a scratch row of the table, and point their
  state at it for that step.

Finished rows are compacted away by the scheduler (``move_rows``); rows past the live ones in a
batch bucket are parked (scratch KV column, unconstrained), so their replay touches nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from constrain.engine.graph_runner import BATCH_BUCKETS, GraphRunner, batch_bucket, seed_base
from constrain.engine.scheduler import FINISHES, FORCES, ROUTINE, Row, Scheduler
from constrain.engine.speculative import verify_drafts
from constrain.engine.state_cache import StateCache
from constrain.kernels import to_device

logger = logging.getLogger("constrain")


class GraphStep:
    """Step backend on a ``GraphRunner``; ``table=False`` fills every mask on the host."""

    def __init__(self, runner: GraphRunner, vocab_size: int, table: bool = True,
                 states: int = 4096, transitions: int = 1 << 18) -> None:
        self.runner = runner
        self.table = table
        words = (vocab_size + 31) // 32
        n = runner.max_rows
        self.cache = StateCache(words, runner.device, states, transitions, scratch_rows=n)
        self._host = torch.full((n, words), -1, dtype=torch.int32, pin_memory=runner.device.type == "cuda")
        self._gid = [-1] * n  # each row's true global state (host mirror of the GPU's)
        self._hosted = [False] * n  # the row's GPU state is its scratch row, not a table state
        self._filtered = [False] * n  # the row samples with top-k or top-p
        self._pending: list[tuple[int, Row, int, int]] = []  # (row, seq, state, token) misses (row -1: learn only)
        self._patches: dict[int, int] = {}  # row -> GPU state to write before the next sample (``_patch``)
        self._out: list[list[int]] = [[], [], []]  # the last step's tokens, states after, miss flags
        self._codes: list[int] = []  # the last step's ``Scheduler.outcomes``
        self._verified = False  # the last step was a speculative one
        # rows of a forward queued ahead, and the tokens predicted for a several-token pass (None: one each)
        self._ahead: tuple[list[Row], list[list[int]] | None] | None = None
        self.ahead_queued = self.ahead_served = 0  # forwards queued ahead; of them, used by their step
        self.ahead_forced = 0  # of the queued, several-token passes of forced text
        self.steps = 0

    @property
    def max_rows(self) -> int:
        return self.runner.max_rows

    def host_masks(self, batch: list[Row]) -> list[Row]:
        if not self.table:
            return batch
        return [s for s in batch if s.request.grammar is None] + [p[1] for p in self._pending if p[0] >= 0]

    @property
    def max_len(self) -> int:
        return self.runner.max_len

    def step_time(self, rows: int, width: int, need: int) -> float | None:
        """The runner's table of captured forwards, timed when captured (``GraphRunner.step_time``)."""
        return self.runner.step_time(rows, width, need)

    def capture(self, states: int = 0, transitions: int = 0) -> None:
        """Capture the sample graphs of every batch bucket ahead of time, after reserving the
        state table (``states`` rows, ``transitions`` hash entries) so that it does not
        reallocate later, which would force the table graphs to be captured again."""
        table = self.cache.table
        table.reserve(states, transitions)
        for b in BATCH_BUCKETS:
            if b <= self.runner.max_rows:
                for mode in ("table", "none"):
                    self.runner.capture_sample(b, mode, table)

    # -- one step ----------------------------------------------------------------------------
    def step(self, batch: list[Row], n_old: int, scheduler: Scheduler) -> list[int]:
        run = self.runner
        old, new = batch[:n_old], batch[n_old:]
        ahead, self._ahead = self._ahead, None
        if old:
            if self._ahead_serves(ahead, old):
                self.ahead_served += 1
            elif all(len(s.pending) == 1 for s in old) and (ahead is None or ahead[1] is None):
                run.forward(batch_bucket(n_old), run.length_bucket(1 + max(s.length for s in old)))
            else:
                self._forward_forced([s.pending for s in old], [s.length for s in old])
        self._resolve_pending()  # host work while the forward computes (it reads no states)
        if new:
            self._prefill(new, n_old)
        constrained = self._prepare_masks(batch, scheduler)
        filtered = any(self._filtered[:len(batch)])
        patches, self._patches = self._patches, {}
        run.sample(batch_bucket(len(batch)), "table" if constrained else "none", self.cache.table, filtered,
                   (list(patches), list(patches.values())))
        self.steps += 1
        tokens, states, miss = self._out = run.fetch(len(batch)).tolist()
        self._codes = scheduler.outcomes(batch, tokens, states)  # states: -1 where the table missed
        self._forward_ahead(batch, scheduler)
        return tokens

    # -- the next step's forward, queued before the host takes this step's tokens ---------------
    def _forward_ahead(self, batch: list[Row], scheduler: Scheduler) -> None:
        """Queue the next step's forward now, where this step's tokens show what it will be: the
        GPU computes it while the host accepts the tokens, checks stops and resolves misses,
        instead of idling through them. Where every row appends its one sampled token, the
        one-token forward reads only what the sample left on the GPU (each row's token and
        position); where rows append forced text the scheduler predicts (``pending_after``), the
        several-tokens pass of those tokens. It is not queued when a finishing row would make the
        scheduler move rows, or while drafting (a verification pass). Cheap predictions: a wrong
        one costs one forward, which the next step redoes."""
        if scheduler.speculative is not None or not batch:
            return
        codes = self._codes
        live = len(batch)
        while live and codes[live - 1] == FINISHES:  # rows at the end that finish leave without moves
            live -= 1
        kinds = set(codes[:live])
        if not live or FINISHES in kinds:
            return  # nothing to run, or compaction will move rows (their slots change)
        rows = batch[:live]
        if FORCES in kinds:
            pending = scheduler.pending_after(rows, self._out[0][:live])
            self._forward_forced(pending, [s.length + len(s.pending) for s in rows])
            self._ahead = (rows, pending)
            self.ahead_forced += 1
        else:
            self.runner.forward(batch_bucket(live), self.runner.length_bucket(1 + max(s.length + len(s.pending)
                                                                                      for s in rows)))
            self._ahead = (rows, None)
        self.ahead_queued += 1

    def _ahead_serves(self, ahead: tuple[list[Row], list[list[int]] | None] | None, old: list[Row]) -> bool:
        """Whether the forward queued ahead is this step's: the same rows in the same slots (a
        prefix of them: rows at the end may have finished), each appending the tokens predicted.
        It then attends as far as this step needs (its length was the longest of those rows'
        lengths after their tokens). One that is not left the step buffers' positions where a
        several-token pass put them: the step's own forward then rewrites them (``step``)."""
        if ahead is None or len(old) > len(ahead[0]):
            return False
        rows, pending = ahead
        if pending is None:  # each row's one sampled token
            return all(a is s and len(s.pending) == 1 and s.pending[0] == t for a, s, t in zip(rows, old, self._out[0]))
        return all(a is s and p == s.pending for a, p, s in zip(rows, pending, old))

    def verify(self, batch: list[Row], rows: torch.Tensor, scheduler: Scheduler) -> list[list[int]]:
        """Speculative step: pending + draft of every row in one pass of the static decoder (a
        captured graph per bucket), masks gathered from the table by the rows the drafts' walk
        chose (``Scheduler._draft``), verified by ``kernels.verify_draft``."""
        run = self.runner
        self._resolve_pending()
        width = rows.shape[1]
        # per row: the logits after its last pending token, then after each draft token
        pick = [[min(len(s.pending) - 1 + j, len(s.pending) + len(s.draft) - 1) for j in range(width)] for s in batch]
        masks_at, pick_t = self._upload([rows.tolist(), pick]).unbind(0)
        masks = self.cache.table.masks[masks_at]
        logits = run.verify_forward([s.pending + s.draft for s in batch], [s.length for s in batch])
        logits = torch.gather(logits, 1, pick_t.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        self.steps += 1
        self._verified = True
        return verify_drafts(logits, batch, masks)

    def _forward_forced(self, tokens: list[list[int]], starts: list[int]) -> None:
        """Rows appending several tokens (forced text; row r: ``tokens[r]`` from KV column
        ``starts[r]``): one pass of the verification graphs, each row's logits after its last
        token into the step buffers."""
        run = self.runner
        logits = run.verify_forward(tokens, starts)
        last, pos = self._upload([[len(t) - 1 for t in tokens], [s + len(t) - 1 for s, t in zip(starts, tokens)]])
        n = len(tokens)
        run.logits[:n] = logits[torch.arange(n, device=run.device), last]
        run.pos[:n] = pos

    def _prefill(self, new: list[Row], lo: int) -> None:
        run = self.runner
        hi = lo + len(new)
        prompts = [s.pending for s in new]
        run.logits[lo:hi] = run.runner.extend(lo, prompts, [0] * len(new))
        rows = slice(lo, hi)
        params = [s.request.sampling for s in new]
        run.pos[rows], run.top_k[rows], run.base[rows] = self._upload(
            [[len(p) - 1 for p in prompts], [p.top_k for p in params], [seed_base(s.seed) for s in new]])
        run.temperature[rows], run.top_p[rows] = self._upload(
            [[p.temperature for p in params], [p.top_p for p in params]], torch.float32)
        run.draws[rows] = 0
        for i in range(lo, hi):  # the prefill writes these rows' states itself
            self._patches.pop(i, None)
        states = []
        for i, s in enumerate(new, lo):
            grammar = s.request.grammar
            gid = self.cache.enter(grammar, s.matcher.state) if grammar is not None else -1
            self._gid[i], self._hosted[i] = gid, False
            p = s.request.sampling
            self._filtered[i] = p.temperature > 0 and (p.top_k > 0 or p.top_p < 1)
            states.append(gid)
        run.states[rows] = self._upload([states], torch.int32)[0]

    def _prepare_masks(self, batch: list[Row], scheduler: Scheduler) -> bool:
        """Point rows under the budget-aware close at their close rows (``Scheduler.table_row``)
        and write host masks into scratch rows for rows the table cannot serve; True if any row
        is constrained. A closed row's sampled token advances to a table state on the GPU, so the
        step after needs no patch unless the close still binds. A matcher that raises fails its
        own request (its token is discarded), not the batch."""
        hosted: list[int] = []
        rows: list[int] = []
        states: list[int] = []
        constrained = False
        for i, s in enumerate(batch):
            if s.matcher is None:
                continue
            constrained = True
            if not self.table or s.request.grammar is None:
                scheduler.fill_mask(s, self._host, i)
                hosted.append(i)
                continue
            if not s.request.budget_close and not s.tail:
                continue  # its state's own row (``table_row``), where the GPU left it
            row = scheduler.table_row(s, self.cache, self._gid[i])
            if row is not None and row != self._gid[i]:
                rows.append(i)
                states.append(row)
        self._patch(rows, states)
        if hosted:
            self.cache.write_scratch(hosted, self._host[hosted])
            for i in hosted:
                self._hosted[i] = True
            self._patch(hosted, hosted)
        return constrained

    def sync(self, batch: list[Row]) -> None:
        """Mirror the GPU's states; forced text moved a row where the GPU cannot know: patch it."""
        if self._verified:
            self._sync_verified(batch)
            return
        tokens, states, miss = self._out
        gids = self._gid
        others = [i for i, c in enumerate(self._codes) if c != ROUTINE]
        before = [gids[i] for i in others]
        gids[:len(states)] = states  # routine rows: where the table advanced them (others: below)
        jumped: list[int] = []
        for i, gid in zip(others, before):
            s = batch[i]
            gids[i] = gid
            grammar = s.request.grammar
            if grammar is None or s.finish_reason is not None or self._hosted[i]:
                continue
            if s.forced_now:  # where the forced text led: known to the cache, or from the matcher
                after = self.cache.walk(states[i], s.pending[1:]) if states[i] >= 0 else None
                gids[i] = after if after is not None else self.cache.enter(grammar, s.matcher.state)
                jumped.append(i)
                if miss[i]:  # the table learns the pair all the same (no row to patch): a row
                    self._pending.append((-1, s, gid, tokens[i]))  # taking it next knows where it leads
            elif miss[i]:
                self._pending.append((i, s, gid, tokens[i]))
            else:
                gids[i] = states[i]
        self._patch(jumped, [gids[i] for i in jumped])

    def _sync_verified(self, batch: list[Row]) -> None:
        """After a speculative step every row moved where only the host knows: its next input
        token and position, draw count and constraint state go to the GPU buffers."""
        self._verified = False
        run = self.runner
        live = [i for i, s in enumerate(batch) if s.finish_reason is None]
        if not live:
            return
        rows, ids, pos, draws = self._upload([live, [batch[i].pending[0] for i in live], [batch[i].length for i in live],
                                              [batch[i].draws for i in live]]).unbind(0)
        run.ids[rows], run.pos[rows], run.draws[rows] = ids, pos, draws
        entered = []
        for i in live:
            grammar = batch[i].request.grammar
            if grammar is not None:
                self._gid[i] = self.cache.enter(grammar, batch[i].matcher.state)
                self._hosted[i] = False
                entered.append(i)
        self._patch(entered, [self._gid[i] for i in entered])

    def _resolve_pending(self) -> None:
        """Next states of last step's misses, stored in the table and patched into the rows
        (the GPU left those rows at -1)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        nxt = self.cache.resolve([p[2] for p in pending], [p[3] for p in pending])
        rows = []
        for (row, s, _, _), gid in zip(pending, nxt):
            if row < 0:
                continue
            grammar = s.request.grammar
            assert grammar is not None and s.matcher is not None  # only constrained rows miss
            # The matcher accepted the token: a -1 here means the table and grammar disagree.
            self._gid[row] = gid if gid >= 0 else self.cache.enter(grammar, s.matcher.state)
            rows.append(row)
        self._patch(rows, [self._gid[r] for r in rows])

    def _patch(self, rows: list[int], states: list[int]) -> None:
        """GPU states of ``rows`` <- ``states`` before the next sample reads them: written with the
        table's staged inserts (``GraphRunner.sample``), one upload for both. Until then a move of
        rows carries a row's patch along (``move_rows``) and a prefill's own states replace it."""
        self._patches.update(zip(rows, states))

    def _upload(self, lists: Sequence[object], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        """Equal-length host lists as one device tensor, queued (``kernels.to_device``): the
        step's host work (the budget checks, the next patch) goes on beside the forward."""
        return to_device(lists, dtype, self.runner.device)

    def move_rows(self, moves: list[tuple[int, int, int]], live: int) -> None:
        self._resolve_pending()  # pending misses name rows by their index before the move
        if moves:
            self._ahead = None  # its rows moved slots
        for src, dst, _ in moves:
            self._gid[dst], self._hosted[dst], self._filtered[dst] = self._gid[src], self._hosted[src], self._filtered[src]
        # patches follow their rows: a moved row's goes with it, a vacated or parked row's is dropped
        moved = {src: dst for src, dst, _ in moves}
        patches = {moved[r]: g for r, g in self._patches.items() if r in moved}
        gone = set(moved.values())
        patches.update((r, g) for r, g in self._patches.items() if r not in moved and r not in gone and r < live)
        self._patches = patches
        self.runner.move_rows(moves, live)
