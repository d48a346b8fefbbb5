"""Fused masked sampling: mask gather, temperature, top-k, top-p, min-p, greedy, seeded draws.

Why this shape: the mask of row b is row `mask_index[b]` of a mask table (a `StateTable.masks`
or a plain per-row bitmask), read inside the kernel, so no masked logits are ever materialised
and no host round trip is needed. Sampling is Gumbel-max (argmax of z + Gumbel noise), which
needs no softmax normalisation and splits across vocabulary chunks exactly: the row's winner is
the best of the chunks' winners. Filters are exact thresholds, not sorts:

  z = (l - max) / T over allowed tokens, key u = bits(-z) (monotone: smaller u = likelier)
  keep u <= U where U = min(U_topk, U_topp, U_minp):
    U_topk: smallest U with #{u <= U} >= k            (ties at the boundary are kept)
    U_topp: smallest U <= U_topk with mass{u <= U} >= top_p * mass{u <= U_topk}
            (top-p applies to the top-k-renormalised distribution, as HF and vLLM do)
    U_minp: bits(-log(min_p))                          (p >= min_p * p_max)

U is found digit by digit (radix 16, 8 fixed passes per search, each pass a (rows, chunks) grid
with partial counts or masses reduced in a fixed order, so results are deterministic); it runs
only when some filter is given. Chain: stats (max, argmax, unfiltered Gumbel winner per chunk) ->
[top-k search -> top-k mass -> top-p search -> filtered Gumbel winner] -> finalize.

Never selects a masked token: NaN logits count as masked, +inf is clamped to the float max, and
a row whose allowed logits are all -inf/NaN (or with no allowed token) is flagged and gets -1.
"""

from __future__ import annotations

import math

import torch

from ._common import HAS_TRITON, row_key_ref, tl, triton, uniform_ref, use_triton

if HAS_TRITON:
    from ._common import _row_key, _uniform
from .apply_bitmask import unpack_bitmask

FLT_MAX = 3.4028234663852886e38
LOG2E = 1.0 / math.log(2.0)
KEY_NONE = 0x7FFFFFFF  # key of a disallowed token; also "keep everything" as a threshold
# Largest top_k the candidate search handles (its per-chunk lists are this long at most).
MAX_TOPK_CANDIDATES = 1024


# ---------------------------------------------------------------------------------------------
# twin
# ---------------------------------------------------------------------------------------------
def _allowed_ref(logits: torch.Tensor, masks: torch.Tensor | None, mask_index: torch.Tensor | None) -> torch.Tensor:
    b, v = logits.shape
    if masks is None:
        return torch.ones(b, v, dtype=torch.bool, device=logits.device)
    idx = torch.arange(b, device=masks.device) if mask_index is None else mask_index.to(masks.device).long()
    allowed = unpack_bitmask(masks[idx.clamp(min=0)], v).to(logits.device)
    return allowed | (idx < 0).to(logits.device)[:, None]


def _keys_ref(z: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    u = (-z).contiguous().view(torch.int32).to(torch.int64) & 0x7FFFFFFF
    return torch.where(ok, u, torch.full_like(u, KEY_NONE))


def filter_threshold_ref(
    z: torch.Tensor, ok: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Key threshold U per row (int64); tokens with ok & key <= U are kept. Twin of the search."""
    b = z.shape[0]
    u = _keys_ref(z, ok)
    e = torch.where(ok, torch.exp(z), torch.zeros_like(z))
    us, order = torch.sort(u, dim=-1, stable=True)
    es = torch.gather(e, 1, order)
    thr = torch.full((b,), KEY_NONE, dtype=torch.int64, device=z.device)
    for r in range(b):
        hi = KEY_NONE
        k = int(top_k[r])
        if k > 0 and k <= z.shape[1]:
            hi = int(us[r, k - 1]) if int(us[r, k - 1]) != KEY_NONE else KEY_NONE
        p = float(top_p[r])
        if p < 1.0:
            keep = us[r] <= hi
            mass = torch.cumsum(torch.where(keep, es[r], torch.zeros_like(es[r])), 0)
            total = mass[keep].max() if keep.any() else torch.tensor(0.0)
            target = torch.tensor(p, dtype=torch.float32) * total
            pos = int(torch.nonzero(mass >= target)[0]) if bool((mass >= target).any()) else None
            if pos is not None:
                hi = min(hi, int(us[r, pos]))
        mp = float(min_p[r])
        if mp > 0.0:
            lm = -torch.log(torch.tensor(min(mp, 1.0), dtype=torch.float32))
            hi = min(hi, int(lm.view(torch.int32)) & 0x7FFFFFFF)
        thr[r] = hi
    return thr


def sample_ref(
    logits: torch.Tensor,
    masks: torch.Tensor | None = None,
    mask_index: torch.Tensor | None = None,
    *,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch twin of `sample` (same RNG, same thresholds)."""
    b, v = logits.shape
    dev = logits.device
    temperature, top_k, top_p, min_p, seeds = _defaults(b, dev, temperature, top_k, top_p, min_p, seeds)
    x = logits.float()
    ok = _allowed_ref(logits, masks, mask_index) & ~torch.isnan(x)
    x = torch.where(ok, x.clamp(max=FLT_MAX), torch.full_like(x, float("-inf")))
    m = x.max(dim=-1).values
    all_masked = m == float("-inf")
    greedy_tok = x.argmax(dim=-1)
    t = temperature.float()
    inv_t = torch.where(t > 0, 1.0 / torch.where(t > 0, t, torch.ones_like(t)), torch.ones_like(t))
    z = (x - torch.where(all_masked, torch.zeros_like(m), m)[:, None]) * inv_t[:, None]
    thr = filter_threshold_ref(z, ok, top_k, top_p, min_p)
    keep = ok & (_keys_ref(z, ok) <= thr[:, None])
    cnt = torch.arange(v, device=dev)
    uni = uniform_ref(row_key_ref(seeds)[:, None], cnt[None, :])
    score = z * LOG2E - torch.log2(-torch.log2(uni))
    score = torch.where(keep & (z > float("-inf")), score, torch.full_like(score, float("-inf")))
    sample_tok = score.argmax(dim=-1)
    tok = torch.where(t > 0, sample_tok, greedy_tok)
    tok = torch.where(all_masked, torch.full_like(tok, -1), tok)
    return tok, all_masked


def _defaults(b, dev, temperature, top_k, top_p, min_p, seeds):
    if temperature is None:
        temperature = torch.ones(b, device=dev)
    if top_k is None:
        top_k = torch.zeros(b, dtype=torch.int32, device=dev)
    if top_p is None:
        top_p = torch.ones(b, device=dev)
    if min_p is None:
        min_p = torch.zeros(b, device=dev)
    if seeds is None:
        seeds = torch.zeros(b, dtype=torch.int64, device=dev)
    return temperature, top_k, top_p, min_p, seeds


# ---------------------------------------------------------------------------------------------
# triton
# ---------------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _masked_logits(logits_ptr, lrow, mask_ptr, mrow, offs, V, W, HAS_MASK: tl.constexpr):
        """Sanitised float32 logits of a block (-inf where masked/NaN) and the allowed flags."""
        inb = offs < V
        # logits and mask words are loaded independently (not "mask first, then only allowed
        # logits"): on the H200 the dependent load chain cost more than the skipped sectors saved,
        # even for sparse masks (BENCHMARKS.md, issue 4)
        x = tl.load(logits_ptr + lrow + offs, mask=inb, other=float("nan")).to(tl.float32)
        ok = inb & (x == x)
        if HAS_MASK:
            widx = offs >> 5
            words = tl.load(mask_ptr + tl.maximum(mrow, 0) * W + widx, mask=inb & (widx < W), other=0)
            ok = tl.where(mrow < 0, ok, ok & (((words >> (offs & 31)) & 1) != 0))
        x = tl.minimum(x, 3.4028234663852886e38)
        x = tl.where(ok, x, float("-inf"))
        return x, ok

    @triton.jit
    def _keys(x, ok, m, inv_t):
        z = (x - m) * inv_t
        u = (-z).to(tl.int32, bitcast=True) & 0x7FFFFFFF
        u = tl.where(ok, u, 0x7FFFFFFF)
        return z, u

    @triton.jit
    def _row_setup(b, l_stride, midx_ptr, HAS_MIDX: tl.constexpr):
        b64 = b.to(tl.int64)
        if HAS_MIDX:
            mrow = tl.load(midx_ptr + b).to(tl.int64)
        else:
            mrow = b64
        return b64 * l_stride, mrow

    @triton.jit
    def _stage1_kernel(
        logits_ptr, l_stride, mask_ptr, midx_ptr, W,
        temp_ptr, seed_ptr, topk_ptr, topp_ptr, minp_ptr,
        pmax_ptr, pidx_ptr, gsc_ptr, gidx_ptr,
        V, CHUNK, S,
        HAS_MASK: tl.constexpr, HAS_MIDX: tl.constexpr, HAS_FILTERS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        c = tl.program_id(1)
        lrow, mrow = _row_setup(b, l_stride, midx_ptr, HAS_MIDX)
        t = tl.load(temp_ptr + b).to(tl.float32)
        sample = t > 0
        if HAS_FILTERS:
            filt = (tl.load(topk_ptr + b) > 0) | (tl.load(topp_ptr + b) < 1.0) | (tl.load(minp_ptr + b) > 0.0)
            sample = sample & (~filt)
        scale = 1.4426950408889634 / tl.where(t > 0, t, 1.0)
        key = _row_key(tl.load(seed_ptr + b))
        # per-lane running winners, reduced once at the end: no block reduction per iteration
        acc = tl.full([BLOCK], float("-inf"), tl.float32)
        acc_i = tl.full([BLOCK], 0x7FFFFFFF, tl.int32)
        gacc = tl.full([BLOCK], float("-inf"), tl.float32)
        gacc_i = tl.full([BLOCK], 0x7FFFFFFF, tl.int32)
        start = c * CHUNK
        end = tl.minimum(start + CHUNK, V)
        for off in tl.range(start, end, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            x, ok = _masked_logits(logits_ptr, lrow, mask_ptr, mrow, offs, V, W, HAS_MASK)
            upd = x > acc
            acc = tl.where(upd, x, acc)
            acc_i = tl.where(upd, offs, acc_i)
            if sample:
                g = x * scale - tl.log2(-tl.log2(_uniform(key, offs)))
                gupd = (x > float("-inf")) & (g > gacc)
                gacc = tl.where(gupd, g, gacc)
                gacc_i = tl.where(gupd, offs, gacc_i)
        best, best_i = _lane_argmax(acc, acc_i)
        gbest, gbest_i = _lane_argmax(gacc, gacc_i)
        o = b.to(tl.int64) * S + c
        tl.store(pmax_ptr + o, best)
        tl.store(pidx_ptr + o, best_i)
        tl.store(gsc_ptr + o, gbest)
        tl.store(gidx_ptr + o, gbest_i)

    @triton.jit
    def _lane_argmax(acc, acc_i):
        """Max over lanes and the smallest index holding it (-1 when every lane is -inf)."""
        best = tl.max(acc, 0)
        best_i = tl.min(tl.where(acc == best, acc_i, 0x7FFFFFFF), 0)
        return best, tl.where(best > float("-inf"), best_i, -1)

    @triton.jit
    def _row_max(pmax_ptr, b, S, S_POW2: tl.constexpr):
        j = tl.arange(0, S_POW2)
        pm = tl.load(pmax_ptr + b.to(tl.int64) * S + j, mask=j < S, other=float("-inf"))
        return tl.max(pm, 0)

    @triton.jit
    def _radix_pass_kernel(
        logits_ptr, l_stride, mask_ptr, midx_ptr, W,
        temp_ptr, param_ptr, pmax_ptr, pref_ptr, part_ptr, V, CHUNK, S, shift,
        S_POW2: tl.constexpr, MODE: tl.constexpr,
        HAS_MASK: tl.constexpr, HAS_MIDX: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """One radix-16 digit of a threshold search, one vocabulary chunk: partial f(cand_j).

        MODE 0: f = #{u <= cand} (top-k); 1: f = mass{u <= cand} (top-p); 2: mass{u <= pref}
        (the top-k set's total mass, which top-p renormalises by).
        """
        b = tl.program_id(0)
        c = tl.program_id(1)
        t = tl.load(temp_ptr + b).to(tl.float32)
        if MODE == 0:
            active = (t > 0) & (tl.load(param_ptr + b) > 0)
        else:
            active = (t > 0) & (tl.load(param_ptr + b) < 1.0)
        m = _row_max(pmax_ptr, b, S, S_POW2)
        if active & (m > float("-inf")):
            lrow, mrow = _row_setup(b, l_stride, midx_ptr, HAS_MIDX)
            inv_t = 1.0 / t
            pref = tl.load(pref_ptr + b)
            j = tl.arange(0, 16).to(tl.int64)
            if MODE == 2:
                cand = pref + 0 * j
            else:
                cand = pref + ((j + 1) << shift) - 1
            if MODE == 0:
                acc = tl.zeros([16], tl.int32)
            else:
                acc = tl.zeros([16], tl.float32)
            start = c * CHUNK
            end = tl.minimum(start + CHUNK, V)
            for off in tl.range(start, end, BLOCK):
                offs = off + tl.arange(0, BLOCK)
                x, ok = _masked_logits(logits_ptr, lrow, mask_ptr, mrow, offs, V, W, HAS_MASK)
                z, u = _keys(x, ok, m, inv_t)
                inside = ok[:, None] & (u.to(tl.int64)[:, None] <= cand[None, :])
                if MODE == 0:
                    acc += tl.sum(inside.to(tl.int32), axis=0)
                else:
                    e = tl.where(ok, tl.exp(z), 0.0)
                    acc += tl.sum(tl.where(inside, e[:, None], 0.0), axis=0)
            tl.store(part_ptr + (b.to(tl.int64) * S + c) * 16 + j, acc.to(part_ptr.dtype.element_ty))

    @triton.jit
    def _topk_candidates_kernel(
        logits_ptr, l_stride, mask_ptr, midx_ptr, W,
        temp_ptr, pmax_ptr, cand_ptr, V, CHUNK, S,
        S_POW2: tl.constexpr, K: tl.constexpr,
        HAS_MASK: tl.constexpr, HAS_MIDX: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """The K smallest keys of one vocabulary chunk (as -key, largest first): the row's k-th
        smallest key is among the chunks' candidates for every k <= K."""
        b = tl.program_id(0)
        c = tl.program_id(1)
        t = tl.load(temp_ptr + b).to(tl.float32)
        m = _row_max(pmax_ptr, b, S, S_POW2)
        lrow, mrow = _row_setup(b, l_stride, midx_ptr, HAS_MIDX)
        inv_t = 1.0 / tl.where(t > 0, t, 1.0)
        best = tl.full([K], -0x7FFFFFFF, tl.int32)
        start = c * CHUNK
        end = tl.minimum(start + CHUNK, V)
        for off in tl.range(start, end, BLOCK):
            offs = off + tl.arange(0, BLOCK)
            x, ok = _masked_logits(logits_ptr, lrow, mask_ptr, mrow, offs, V, W, HAS_MASK)
            _, u = _keys(x, ok, m, inv_t)
            both = tl.reshape(tl.join(best, tl.topk(-u, K)), [2 * K])
            best = tl.topk(both, K)
        tl.store(cand_ptr + (b.to(tl.int64) * S + c) * K + tl.arange(0, K), best)

    @triton.jit
    def _topk_select_kernel(topk_ptr, cand_ptr, out_ptr, S, S_POW2: tl.constexpr, K: tl.constexpr):
        """Key threshold of top-k: the k-th smallest key of the row (KEY_NONE: keep everything)."""
        b = tl.program_id(0)
        k = tl.load(topk_ptr + b)
        r = tl.arange(0, S_POW2)
        j = tl.arange(0, K)
        tile = tl.load(cand_ptr + (b.to(tl.int64) * S + r[:, None]) * K + j[None, :],
                       mask=(r < S)[:, None], other=-0x7FFFFFFF)
        top = tl.topk(tl.reshape(tile, [S_POW2 * K]), K)
        kth = -tl.sum(tl.where(j == k - 1, top, 0), 0)
        out = tl.where((k > 0) & (k <= K), kth.to(tl.int64), 0x7FFFFFFF)
        tl.store(out_ptr + b, out)

    @triton.jit
    def _radix_update_kernel(
        temp_ptr, param_ptr, pmax_ptr, pref_ptr, part_ptr, target_ptr, S, shift,
        S_POW2: tl.constexpr, MODE: tl.constexpr,
    ):
        """Sum a pass's partials in a fixed order (deterministic) and fix one digit of the key."""
        b = tl.program_id(0)
        t = tl.load(temp_ptr + b).to(tl.float32)
        param = tl.load(param_ptr + b)
        if MODE == 0:
            active = (t > 0) & (param > 0)
        else:
            active = (t > 0) & (param < 1.0)
        m = _row_max(pmax_ptr, b, S, S_POW2)
        if active & (m > float("-inf")):
            r = tl.arange(0, S_POW2)
            j = tl.arange(0, 16)
            tile = tl.load(part_ptr + (b.to(tl.int64) * S + r[:, None]) * 16 + j[None, :],
                           mask=(r < S)[:, None], other=0)
            tot = tl.sum(tile, axis=0)
            if MODE == 2:
                tl.store(target_ptr + b, param.to(tl.float32) * tl.max(tot, 0))
            else:
                if MODE == 0:
                    ge = tot >= param
                else:
                    ge = tot >= tl.load(target_ptr + b)
                jsel = tl.min(tl.where(ge, j, 15), 0)
                tl.store(pref_ptr + b, tl.load(pref_ptr + b) + (jsel.to(tl.int64) << shift))

    @triton.jit
    def _filtered_kernel(
        logits_ptr, l_stride, mask_ptr, midx_ptr, W,
        temp_ptr, seed_ptr, topk_ptr, topp_ptr, minp_ptr,
        pmax_ptr, thr_ptr, gsc_ptr, gidx_ptr, V, CHUNK, S,
        S_POW2: tl.constexpr, HAS_MASK: tl.constexpr, HAS_MIDX: tl.constexpr, BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        c = tl.program_id(1)
        t = tl.load(temp_ptr + b).to(tl.float32)
        filt = (tl.load(topk_ptr + b) > 0) | (tl.load(topp_ptr + b) < 1.0) | (tl.load(minp_ptr + b) > 0.0)
        if (t > 0) & filt:
            lrow, mrow = _row_setup(b, l_stride, midx_ptr, HAS_MIDX)
            m = _row_max(pmax_ptr, b, S, S_POW2)
            inv_t = 1.0 / t
            thr = tl.load(thr_ptr + b)
            key = _row_key(tl.load(seed_ptr + b))
            gacc = tl.full([BLOCK], float("-inf"), tl.float32)
            gacc_i = tl.full([BLOCK], 0x7FFFFFFF, tl.int32)
            start = c * CHUNK
            end = tl.minimum(start + CHUNK, V)
            for off in tl.range(start, end, BLOCK):
                offs = off + tl.arange(0, BLOCK)
                x, ok = _masked_logits(logits_ptr, lrow, mask_ptr, mrow, offs, V, W, HAS_MASK)
                z, u = _keys(x, ok, m, inv_t)
                keep = ok & (u.to(tl.int64) <= thr) & (z > float("-inf"))
                g = z * 1.4426950408889634 - tl.log2(-tl.log2(_uniform(key, offs)))
                gupd = keep & (g > gacc)
                gacc = tl.where(gupd, g, gacc)
                gacc_i = tl.where(gupd, offs, gacc_i)
            gbest, gbest_i = _lane_argmax(gacc, gacc_i)
            o = b.to(tl.int64) * S + c
            tl.store(gsc_ptr + o, gbest)
            tl.store(gidx_ptr + o, gbest_i)

    @triton.jit
    def _finalize_kernel(
        temp_ptr, pmax_ptr, pidx_ptr, gsc_ptr, gidx_ptr, tok_ptr, flag_ptr, S, S_POW2: tl.constexpr
    ):
        b = tl.program_id(0)
        j = tl.arange(0, S_POW2)
        o = b.to(tl.int64) * S + j
        pm = tl.load(pmax_ptr + o, mask=j < S, other=float("-inf"))
        gs = tl.load(gsc_ptr + o, mask=j < S, other=float("-inf"))
        mi = tl.argmax(pm, 0, tie_break_left=True)
        gi = tl.argmax(gs, 0, tie_break_left=True)
        greedy_tok = tl.load(pidx_ptr + b.to(tl.int64) * S + mi)
        sample_tok = tl.load(gidx_ptr + b.to(tl.int64) * S + gi)
        t = tl.load(temp_ptr + b).to(tl.float32)
        bad = tl.max(pm, 0) == float("-inf")
        tok = tl.where(t > 0, sample_tok, greedy_tok)
        bad = bad | ((t > 0) & (tl.max(gs, 0) == float("-inf")))
        tok = tl.where(bad, -1, tok)
        tl.store(tok_ptr + b, tok.to(tl.int64))
        tl.store(flag_ptr + b, bad.to(tl.int8))


def _split(b: int, v: int, block: int) -> tuple[int, int]:
    """(chunk, n_chunks): enough programs to fill the card, whole blocks per chunk."""
    n_blocks = triton.cdiv(v, block)
    want = max(1, min(n_blocks, triton.cdiv(1024, b)))
    per = triton.cdiv(n_blocks, want)
    return per * block, triton.cdiv(n_blocks, per)


def _thresholds(logits, mask_arg, midx_arg, w, temperature, top_k, top_p, min_p, pmax, v, chunk, s, s_pow2, common,
                max_top_k=None):
    """Per-row key threshold U: top-k by candidates (``max_top_k`` known) or 8 radix-16 passes,
    top-p by 1 + 8 radix passes, min-p in closed form.

    Every pass is a (rows, chunks) kernel plus a per-row update, so a single row still spreads
    over the whole card, and the fixed pass count keeps the chain graph-capturable. With a bound
    on top_k known on the host, one pass keeps each chunk's smallest keys (``tl.topk``) and a
    per-row kernel picks the k-th among them: one read of the logits instead of eight.
    """
    b = logits.shape[0]
    dev = logits.device
    big = torch.full((b,), KEY_NONE, dtype=torch.int64, device=dev)
    args = (logits, logits.stride(0), mask_arg, midx_arg, w, temperature)
    grid = (b, s)
    radix = dict(common, BLOCK=min(256, common["BLOCK"]))  # (BLOCK, 16) tiles: keep them small

    def search(param, mode, pref, part, target):
        for d in range(8):
            shift = 28 - 4 * d
            _radix_pass_kernel[grid](*args, param, pmax, pref, part, v, chunk, s, shift,
                                     S_POW2=s_pow2, MODE=mode, num_warps=4, **radix)
            _radix_update_kernel[(b,)](temperature, param, pmax, pref, part, target, s, shift,
                                       S_POW2=s_pow2, MODE=mode, num_warps=4)

    uk = torch.zeros(b, dtype=torch.int64, device=dev)
    kc = max(16, triton.next_power_of_2(max(int(max_top_k or 1), 1)))
    if max_top_k is not None and kc <= min(MAX_TOPK_CANDIDATES, common["BLOCK"]):
        cand = torch.empty(b, s, kc, dtype=torch.int32, device=dev)
        _topk_candidates_kernel[grid](*args, pmax, cand, v, chunk, s, S_POW2=s_pow2, K=kc, num_warps=4, **common)
        _topk_select_kernel[(b,)](top_k, cand, uk, s, S_POW2=s_pow2, K=kc, num_warps=4)
    else:
        search(top_k, 0, uk, torch.empty(b, s, 16, dtype=torch.int32, device=dev), pmax)
    uk = torch.where(top_k > 0, uk, big)
    up = torch.zeros(b, dtype=torch.int64, device=dev)
    part = torch.empty(b, s, 16, dtype=torch.float32, device=dev)
    target = torch.empty(b, dtype=torch.float32, device=dev)
    _radix_pass_kernel[grid](*args, top_p, pmax, uk, part, v, chunk, s, 0,
                             S_POW2=s_pow2, MODE=2, num_warps=4, **radix)
    _radix_update_kernel[(b,)](temperature, top_p, pmax, uk, part, target, s, 0, S_POW2=s_pow2, MODE=2, num_warps=4)
    search(top_p, 1, up, part, target)
    up = torch.where(top_p < 1.0, up, big)
    lm = -torch.log(min_p.float().clamp(min=1e-38, max=1.0))
    um = torch.where(min_p > 0, (lm.view(torch.int32).to(torch.int64) & KEY_NONE), big)
    return torch.minimum(torch.minimum(uk, up), um)


def sample(
    logits: torch.Tensor,
    masks: torch.Tensor | None = None,
    mask_index: torch.Tensor | None = None,
    *,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    max_top_k: int | None = None,
    block: int = 1024,
    num_warps: int = 8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row under its mask; returns (tokens int64 (B,), all_masked bool (B,)).

    logits (B, V) any float dtype. masks (R, words) int32 mask table; row b uses
    masks[mask_index[b]] (negative index = unconstrained), or masks[b] when mask_index is None;
    masks=None samples unconstrained. Per-row (B,) parameters: temperature (<= 0 means greedy,
    default 1), top_k (<= 0 off), top_p (>= 1 off), min_p (<= 0 off), seeds int64 (same seed
    and logits -> same token; change it per step). Leaving top_k/top_p/min_p all None skips the
    filter kernels entirely. All-masked rows return token -1 and flag True. ``max_top_k``, a
    bound on top_k known on the host (an engine knows its requests' parameters), selects the
    one-pass top-k search; without it a CPU ``top_k`` gives the bound, else eight radix passes
    run (reading a GPU tensor's maximum would stall the stream and break graph capture).
    """
    if not use_triton(logits):
        return sample_ref(logits, masks, mask_index, temperature=temperature, top_k=top_k,
                          top_p=top_p, min_p=min_p, seeds=seeds)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    b, v = logits.shape
    dev = logits.device
    has_filters = top_k is not None or top_p is not None or min_p is not None
    if max_top_k is None and top_k is not None and top_k.device.type == "cpu":
        max_top_k = int(top_k.max()) if top_k.numel() else 0
    temperature, top_k, top_p, min_p, seeds = _defaults(b, dev, temperature, top_k, top_p, min_p, seeds)
    chunk, s = _split(b, v, block)
    s_pow2 = triton.next_power_of_2(s)
    pmax = torch.empty(b, s, dtype=torch.float32, device=dev)
    pidx = torch.empty(b, s, dtype=torch.int32, device=dev)
    gsc = torch.empty(b, s, dtype=torch.float32, device=dev)
    gidx = torch.empty(b, s, dtype=torch.int32, device=dev)
    has_mask = masks is not None
    mask_arg = masks if has_mask else logits
    midx = mask_index.to(device=dev, dtype=torch.int32) if mask_index is not None else None
    midx_arg = midx if midx is not None else logits
    w = masks.shape[-1] if masks is not None else 0
    common = dict(HAS_MASK=has_mask, HAS_MIDX=midx is not None, BLOCK=block)
    _stage1_kernel[(b, s)](
        logits, logits.stride(0), mask_arg, midx_arg, w,
        temperature, seeds, top_k, top_p, min_p,
        pmax, pidx, gsc, gidx, v, chunk, s,
        HAS_FILTERS=has_filters, num_warps=num_warps, **common,
    )
    if has_filters:
        thr = _thresholds(logits, mask_arg, midx_arg, w, temperature, top_k, top_p, min_p,
                          pmax, v, chunk, s, s_pow2, common, max_top_k)
        _filtered_kernel[(b, s)](
            logits, logits.stride(0), mask_arg, midx_arg, w,
            temperature, seeds, top_k, top_p, min_p,
            pmax, thr, gsc, gidx, v, chunk, s,
            S_POW2=s_pow2, num_warps=num_warps, **common,
        )
    tok = torch.empty(b, dtype=torch.int64, device=dev)
    flag = torch.empty(b, dtype=torch.int8, device=dev)
    _finalize_kernel[(b,)](temperature, pmax, pidx, gsc, gidx, tok, flag, s, S_POW2=s_pow2, num_warps=1)
    return tok, flag.bool()
