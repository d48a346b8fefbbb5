"""Speculation that respects the constraint: drafters, draft length, and verification.

Why these drafters and no draft model: under a grammar many tokens are forced (keys, quotes,
separators), and extraction copies spans of its input, so two free sources propose most of what
a small model would: the forced continuation (``forced``) and the longest recent n-gram suffix
of the sequence found earlier in the prompt or output, whose continuation is copied
(``lookup``). Both are deterministic, so a draft token has q = one-hot and verification accepts
it with the target's masked probability p(x); at the first rejection the token comes from p
with x removed, renormalised; a bonus token follows a fully accepted draft. That is exactly
plain masked sampling (greedy: a draft is accepted iff it is the masked argmax). Measured against
a draft model: an EAGLE head trained for the demo model (``bench/draft_head.py``) has 1.80 of 5
drafted tokens accepted on extraction where lookup has 2.52, and the few positions where lookup
has nothing do not pay for the head step it needs every step (BENCHMARKS.md).

The scheduler walks each row's draft through the backend's state cache, picking one mask per
position (the budget-aware close included; the row's matcher is walked, and rolled back, only
where the cache has not seen a state), and cuts the draft at the first token the mask forbids
(so drafts always respect the constraint). The step backend forwards pending + draft in one
ragged pass and gathers the masks by their table rows; ``verify`` masks every position, verifies greedy rows by one masked
argmax over the whole batch (``kernels.masked_argmax``: accepted iff the draft is the argmax)
and sampled rows by ``kernels.verify_draft`` (torch twins on CPU). Rejected positions are simply
not counted in the row's length, so the next forward overwrites their KV entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch

from constrain.engine.sampler import SamplingParams, sample, step_seed
from constrain.kernels import apply_token_bitmask_inplace, masked_argmax, to_device, verify_draft

if TYPE_CHECKING:
    from constrain.engine.scheduler import Row, Scheduler

DRAFTERS = ("forced", "lookup")


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for one row. The scheduler cuts them at the first token the
    constraint forbids and verifies the rest, so a drafter needs no notion of the grammar.
    ``adaptive``: the row's acceptance rate of this drafter bounds how many tokens it proposes."""

    adaptive: bool

    def propose(self, row: Row, tail: list[int], k: int, scheduler: Scheduler) -> list[int]:
        """Up to ``k`` tokens to follow the row's prompt + generated tokens + ``tail`` (the draft
        so far; ``scheduler.forced_ids(row)`` answers at the state it is walked to). State of its
        own goes in ``row.drafter_state[self]``."""
        ...


class ForcedDrafter:
    """The constraint's forced continuation, all of its canonical tokens: the plain path
    appends all but the last and leaves the last to the model (BPE may merge it with what
    follows); as a draft it is verified, so proposing it is safe."""

    adaptive = False

    def propose(self, row: Row, tail: list[int], k: int, scheduler: Scheduler) -> list[int]:
        if row.matcher is None or row.request.grammar is None:
            return []
        return scheduler.forced_ids(row)[:k]


class LookupDrafter:
    """Prompt lookup: what followed the latest earlier occurrence of the longest suffix (up to
    ``max_ngram`` tokens) of the sequence, in the prompt or the output (extraction copies spans
    of its input). Where no token n-gram recurs, the same on the text: a span copied from prose
    into JSON starts with other tokens (``"John`` against `` John``) but continues with the
    same text, so what followed the output's last ``TEXT_SUFFIXES`` bytes earlier is the draft:
    the sequence's own tokens from there where one of them begins at that byte (no tokenizer
    call: one cost more host time than the rest of a row's draft), else the bytes tokenized
    canonically."""

    adaptive = True
    TEXT_SUFFIXES = (32, 16, 8, 4)  # suffix lengths in bytes, tried longest first

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def propose(self, row: Row, tail: list[int], k: int, scheduler: Scheduler) -> list[int]:
        index = row.drafter_state.get(self)
        prompt = row.request.prompt_ids
        if index is None:
            index = row.drafter_state[self] = NgramIndex(self.max_ngram)
            index.extend(prompt)
        index.extend(row.generated[len(index.seq) - len(prompt):])
        found = index.lookup(tail, k)
        if found:
            return found
        tb = scheduler.vocab.token_bytes
        index.text_upto(tb)
        seq = bytes(index.text) + b"".join((tb[t] or b"") if t < len(tb) else b"" for t in tail)
        for n in self.TEXT_SUFFIXES:
            if len(seq) > n:
                at = seq.rfind(seq[-n:], 0, len(seq) - 1)
                if at >= 0:
                    start = index.starts.get(at + n)
                    if start is not None:
                        return index.seq[start:start + k]
                    cont = seq[at + n: at + n + 8 * k].decode("utf-8", "ignore")
                    return scheduler.encode(cont)[:k] if cont else []
        return []


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine drafts. ``drafters``, each continuing the draft of the one before:
    "forced" (``ForcedDrafter``), "lookup" (``LookupDrafter``), or ``Drafter`` objects.
    ``max_draft`` bounds the tokens drafters propose per row and step (forced text the plain
    path would append rides along on top); ``adaptive`` lets each row's acceptance rate of an
    adaptive drafter choose how many of its tokens to verify (``cost``: verifying one more token,
    relative to a step). ``batch_width`` cuts every row's draft to one verify width chosen for the
    batch (``choose_width``): from the step-time table the backend measured (the graph runner times
    each captured bucket), else the default model ``1 + cost * W``. Exact either way: verification
    of a shorter draft emits what plain steps would. ``mask_drafts=False`` leaves drafts uncut by
    the constraint (a forbidden draft token is then rejected by verification): only for measuring
    what masking drafts buys."""

    drafters: tuple[str | Drafter, ...] = DRAFTERS
    max_draft: int = 5
    max_ngram: int = 3
    adaptive: bool = True
    cost: float = 0.1
    batch_width: bool = True
    mask_drafts: bool = True

    def __post_init__(self) -> None:
        bad = [d for d in self.drafters if not isinstance(d, Drafter) and d not in DRAFTERS]
        if bad or not self.drafters:
            raise ValueError(f"drafters must be names in {DRAFTERS} or Drafter objects, got {self.drafters!r}")
        if self.max_draft < 1 or self.max_ngram < 1:
            raise ValueError("max_draft and max_ngram must be >= 1")

    def build(self) -> list[Drafter]:
        """The drafter objects, in order (names instantiated)."""
        made: dict[str, Drafter] = {"forced": ForcedDrafter(), "lookup": LookupDrafter(self.max_ngram)}
        return [made[d] if isinstance(d, str) else d for d in self.drafters]

    @classmethod
    def parse(cls, spec: str | bool | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """``None``/``False``/"off": no speculation; ``True``/"on": the default (forced+lookup);
        "forced", "lookup", "forced+lookup"; or a ready config."""
        if isinstance(spec, SpeculativeConfig) or spec is None:
            return spec
        if spec is True:
            return cls()
        if spec is False or spec in ("off", "none", ""):
            return None
        if spec == "on":
            return cls()
        if isinstance(spec, str):
            return cls(drafters=tuple(d.strip() for d in spec.split("+")))
        raise ValueError(f"speculative must be a bool, a drafter name or a SpeculativeConfig, got {spec!r}")


class NgramIndex:
    """Latest end position of every n-gram (n <= max_n) of a growing token sequence.

    ``extend`` indexes the n-grams ending before the sequence's last token, so a lookup of the
    sequence's own suffix finds an *earlier* occurrence, which has a continuation to copy.
    """

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.ends: dict[tuple[int, ...], int] = {}
        self.seq: list[int] = []
        self._indexed = 0  # n-grams ending at positions < this are indexed
        self.text = bytearray()  # the bytes of seq[:_spelled] (``text_upto``)
        self.starts: dict[int, int] = {}  # byte offset in text -> the first token spelled from there
        self._spelled = 0

    def extend(self, tokens: Sequence[int]) -> None:
        """Per n, the n-grams ending at ``lo..hi-1`` are zipped from n shifted slices, later ends
        overwriting earlier ones (``dict.update`` in order): a prompt of a thousand tokens is
        indexed in C loops, not one tuple slice per n-gram (that was most of a step's drafting)."""
        self.seq.extend(tokens)
        seq, lo, hi = self.seq, max(self._indexed, 1), len(self.seq)
        for n in range(1, self.max_n + 1):
            first = max(lo, n)  # the first end with a whole n-gram before it
            if first < hi:
                grams = zip(*(seq[first - n + i: hi - n + i] for i in range(n)))
                self.ends.update(zip(grams, range(first, hi)))
        self._indexed = max(self._indexed, hi)

    def text_upto(self, token_bytes: Sequence[bytes | None]) -> None:
        """Bring ``text`` and ``starts`` up to the whole sequence (special tokens spell nothing)."""
        for i in range(self._spelled, len(self.seq)):
            t = self.seq[i]
            spelled = (token_bytes[t] or b"") if t < len(token_bytes) else b""
            if spelled:
                self.starts[len(self.text)] = i
                self.text += spelled
        self._spelled = len(self.seq)

    def lookup(self, tail: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest suffix of ``seq + tail`` seen earlier."""
        seq = self.seq
        last = seq[max(len(seq) - self.max_n, 0):] + list(tail)  # the suffixes' tokens (no copy of seq)
        for n in range(min(self.max_n, len(last)), 0, -1):
            e = self.ends.get(tuple(last[len(last) - n:]))
            if e is not None:  # e < len(seq): the continuation starts in seq, may run into tail
                return seq[e:e + k] + list(tail[: max(e + k - len(seq), 0)])
        return []


def choose_draft_length(rate: float, max_k: int, cost: float) -> int:
    """Draft tokens to verify for a row whose drafts are accepted at ``rate`` per token:
    the k maximising (1 + expected accepted) / (1 + cost * k), the expected accepted tokens of a
    k-draft being rate + rate^2 + ... + rate^k (each one survives only if all before it did)."""
    best_k, best = 0, 1.0
    expected, survive = 0.0, 1.0
    for k in range(1, max_k + 1):
        survive *= rate
        expected += survive
        value = (1 + expected) / (1 + cost * k)
        if value > best:
            best_k, best = k, value
    return best_k


def prefix_survival(estimates: Sequence[float]) -> list[float]:
    """The chance each draft prefix is accepted whole, from per-position acceptance estimates:
    running products, since verification stops at the first rejection (position j emits a
    token only if every position before it was accepted)."""
    out, p = [], 1.0
    for e in estimates:
        p *= e
        out.append(p)
    return out


def choose_width(gains: Sequence[Sequence[float]], step_time: Sequence[float]) -> int:
    """How many draft tokens per row the batch verifies: the W maximising
    sum_r gains[r][W] / step_time[W], the smallest W on ties (deterministic; W = 0 is a plain step).

    ``gains[r][w]``: the tokens row r is expected to emit with its draft cut to w tokens (1, the
    sampled token, plus its prefix survival chances up to w); ``step_time[w]``: the time of a step
    verifying w tokens per row (``step_time[0]``: a plain step). Why one width for the batch: the
    verification forward is as wide as its longest row, so each row's own best length (what
    ``choose_draft_length`` picks) does not add up: at a large batch one row's long draft makes
    every row pay for a wide step, while most rows accept little of theirs."""
    totals = np.asarray(gains, dtype=np.float64).sum(0)
    best_w, best = 0, -1.0
    for w, t in enumerate(step_time):
        value = totals[w] / t
        if value > best:
            best_w, best = w, value
    return best_w


def verify(
    logits: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    masks: torch.Tensor | None,
    constrained: Sequence[int],
    params: Sequence[SamplingParams],
    seeds: Sequence[int],
    draws: Sequence[int],
) -> list[list[int]]:
    """Tokens each row emits: its accepted draft tokens, then the correction or bonus token.

    ``logits`` (B, K+1, V) float32: row i's logits at its last pending token and at each of its
    draft tokens (positions past its draft are unused). ``masks`` (B, K+1, W) int32: the mask
    at each position, for the rows in ``constrained``. Rows without a draft are sampled by the
    plain fused sampler (same seeds, filters and tokens as a non-speculative step). A row whose
    mask allowed nothing at some position ends its list with -1 there.
    """
    b, k1, v = logits.shape
    dev = logits.device
    if masks is not None and constrained:
        flat = logits.view(b * k1, v)
        # only the positions each draft reaches (the rest of the padded width is never read)
        rows = to_device([r * k1 + j for r in constrained for j in range(len(drafts[r]) + 1)], torch.int32, dev)
        masks = masks.reshape(b * k1, -1).to(dev, non_blocking=True)
        apply_token_bitmask_inplace(flat, masks, rows)
        masks = masks.view(b, k1, -1)
    out: list[list[int]] = [[] for _ in range(b)]
    greedy = [r for r, d in enumerate(drafts) if d and params[r].temperature <= 0]
    groups: dict[int, list[int]] = {}
    for r, draft in enumerate(drafts):
        if not (draft and params[r].temperature <= 0):
            groups.setdefault(len(draft), []).append(r)
    read: list[torch.Tensor] = [masked_argmax(logits[to_device(greedy, torch.int64, dev)])] if greedy else []
    verified: list[tuple[list[int], torch.Tensor]] = []
    for d, rows_d in groups.items():
        idx = to_device(rows_d, torch.int64, dev)
        if d == 0:  # exactly a plain step's draw (its mask, filters and seed)
            cons = set(constrained)
            mask_rows = [j for j, r in enumerate(rows_d) if r in cons]
            row_masks = masks[idx, 0] if masks is not None and mask_rows else None
            toks = sample(logits[idx, 0], [params[r] for r in rows_d], [seeds[r] for r in rows_d],
                          [draws[r] for r in rows_d], row_masks, mask_rows)
            for r, t in zip(rows_d, toks.tolist()):
                out[r] = [int(t)]
            continue
        tgt = logits[idx, : d + 1]
        dtok = to_device([list(drafts[r]) for r in rows_d], torch.int64, dev)
        one_hot = torch.full((len(rows_d), d, v), float("-inf"), device=dev)
        one_hot.scatter_(2, dtok.unsqueeze(-1), 0.0)
        temp = to_device([params[r].temperature for r in rows_d], torch.float32, dev)
        seed = to_device([step_seed(seeds[r], draws[r]) for r in rows_d], torch.int64, dev)
        toks_t, n_out, _, flags = verify_draft(tgt, one_hot, dtok, None, None, temperature=temp, seeds=seed)
        verified.append((rows_d, torch.stack([n_out.long(), flags.long()], 1)))
        read.append(torch.nn.functional.pad(toks_t, (0, k1 - d - 1), value=-1))
    if not read:
        return out
    toks_l = torch.cat(read).tolist()  # one host read for the greedy rows and every group
    meta = torch.cat([m for _, m in verified]).tolist() if verified else []
    for r, toks_r in zip(greedy, toks_l):
        n = 0  # draft tokens equal to the masked argmax at their position: accepted
        while n < len(drafts[r]) and toks_r[n] == drafts[r][n]:
            n += 1
        out[r] = toks_r[: n + 1]  # then the argmax where they differ, or the bonus (-1: all masked)
    sampled = (r for rows_d, _ in verified for r in rows_d)
    for r, toks_r, (n, flag) in zip(sampled, toks_l[len(greedy):], meta):
        out[r] = toks_r[:n] + [-1] if flag == 2 else toks_r[:n]
    return out


def verify_drafts(logits: torch.Tensor, batch: Sequence[Row], masks: torch.Tensor) -> list[list[int]]:
    """``verify`` for a batch of scheduler rows (their drafts, masks, sampling settings)."""
    return verify(logits, [s.draft for s in batch], masks, [i for i, s in enumerate(batch) if s.matcher is not None],
                  [s.request.sampling for s in batch], [s.seed for s in batch], [s.draws for s in batch])
