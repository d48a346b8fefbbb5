"""Masked speculative verification: k draft tokens per row checked against the target model.

Both distributions are masked by the grammar state at each draft position and renormalised, so
the emitted tokens follow plain masked sampling from the target exactly (Leviathan et al. /
Chen et al. rejection scheme): accept draft x with probability min(1, p(x)/q(x)); at the first
rejection emit a token from norm(max(0, p - q)); if all k are accepted emit a bonus token from p.
The states along the draft chain are looked up in the StateTable hash on the GPU. If a state on
the chain is unknown (a miss), verification stops there: the accepted prefix is still exact and
the host resumes ordinary decoding from that position. Greedy rows (temperature <= 0) accept a
draft iff it is the masked argmax, and otherwise emit the argmax.

One program per row walks the k+1 positions: one pass over both rows per position for the
softmax normalisers, one more for the residual or bonus draw.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, row_key_ref, tl, triton, uniform_ref, use_triton

if HAS_TRITON:
    from ._common import _row_key, _uniform
    from .state_table import _slot_hash
from .apply_bitmask import unpack_bitmask
from .state_table import MAX_PROBE, StateTable, advance_ref

FLT_MAX = 3.4028234663852886e38
ACCEPT_COUNTER = 0x40000000  # uniforms for accept tests use counters past any Gumbel counter


# ---------------------------------------------------------------------------------------------
# twin
# ---------------------------------------------------------------------------------------------
def _masked_probs_ref(logits: torch.Tensor, allowed: torch.Tensor, inv_t: float) -> tuple[torch.Tensor, int]:
    """Masked, renormalised probabilities and the masked argmax (-1 if nothing is allowed)."""
    x = logits.float()
    ok = allowed & ~torch.isnan(x)
    x = torch.where(ok, x.clamp(max=FLT_MAX), torch.full_like(x, float("-inf"))) * inv_t
    m = x.max()
    if m == float("-inf"):
        return torch.zeros_like(x), -1
    e = torch.exp(x - m)
    return e / e.sum(), int(x.argmax())


def verify_draft_ref(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    table: StateTable | None,
    states: torch.Tensor | None,
    *,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pure-torch twin of `verify_draft` (same RNG draws)."""
    b, k1, v = target_logits.shape
    k = k1 - 1
    dev = target_logits.device
    temperature = torch.ones(b, device=dev) if temperature is None else temperature
    seeds = torch.zeros(b, dtype=torch.int64, device=dev) if seeds is None else seeds
    if states is None or table is None:
        states = torch.full((b,), -1, dtype=torch.int32, device=dev)
    out = torch.full((b, k1), -1, dtype=torch.int64, device=dev)
    n_out = torch.zeros(b, dtype=torch.int32, device=dev)
    chain = torch.full((b, k1), -1, dtype=torch.int32, device=dev)
    flags = torch.zeros(b, dtype=torch.int8, device=dev)  # 1 = miss, 2 = all masked
    cnt = torch.arange(v, device=dev)
    for r in range(b):
        key = row_key_ref(seeds[r : r + 1])
        t = float(temperature[r])
        inv_t = 1.0 / t if t > 0 else 1.0
        s = int(states[r])
        for i in range(k1):
            if i > 0 and s >= 0:
                assert table is not None  # s >= 0 only with a table
                nxt, miss = advance_ref(table.keys, table.values, table.present,
                                        torch.tensor([s], dtype=torch.int32, device=dev),
                                        draft_tokens[r, i - 1 : i].to(torch.int32))
                if bool(miss[0]):
                    flags[r] = 1
                    break
                s = int(nxt[0])
            chain[r, i] = s
            if s >= 0:
                assert table is not None
                allowed = unpack_bitmask(table.masks[s : s + 1], v)[0].to(dev)
            else:
                allowed = torch.ones(v, dtype=torch.bool, device=dev)
            p, amax = _masked_probs_ref(target_logits[r, i], allowed, inv_t)
            if amax < 0:
                flags[r] = 2
                break
            gum = -torch.log2(-torch.log2(uniform_ref(key, cnt + i * v)))
            if i == k:
                out[r, i] = amax if t <= 0 else _draw_ref(p, gum)
                n_out[r] = i + 1
                break
            q, qmax = _masked_probs_ref(draft_logits[r, i], allowed, inv_t)
            okq = qmax >= 0
            x = int(draft_tokens[r, i])
            if t <= 0:
                am = amax
                if x == am:
                    out[r, i] = x
                    continue
                out[r, i] = am
                n_out[r] = i + 1
                break
            px, qx = p[x], q[x] if okq else torch.tensor(0.0)
            u = uniform_ref(key, torch.tensor([ACCEPT_COUNTER + i], device=dev))[0]
            if bool(u * qx < px):
                out[r, i] = x
                continue
            res = torch.clamp(p - (q if okq else torch.zeros_like(p)), min=0)
            out[r, i] = _draw_ref(res if bool((res > 0).any()) else p, gum)
            n_out[r] = i + 1
            break
        else:  # pragma: no cover - loop always breaks at i == k
            pass
        if flags[r] != 0:
            n_out[r] = int((out[r] >= 0).sum())
    return out, n_out, chain, flags


def masked_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy verification of every position of every row at once: ``logits`` (R, K+1, V) with
    the masks applied -> (R, K+1) int64, each position's argmax, -1 where nothing is allowed, by
    the samplers' greedy rule (NaN as masked, +inf as the largest float, the first maximum).

    A deterministic greedy draft is accepted up to the first position where it differs from
    this, which then emits it (the bonus after a full match): what `verify_draft` computes for
    greedy rows, but as one parallel reduction over the batch instead of one sequential program
    per row (a walk of the vocabulary per position) and one launch per draft length."""
    x = torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=FLT_MAX, neginf=float("-inf"))
    best = x.argmax(-1)
    return torch.where(x.amax(-1) == float("-inf"), torch.full_like(best, -1), best)


def _draw_ref(weights: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    score = torch.where(weights > 0, torch.log2(weights) + gumbel, torch.full_like(weights, float("-inf")))
    return score.argmax()


# ---------------------------------------------------------------------------------------------
# triton
# ---------------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _row_block(ptr, row_off, mask_ptr, s, offs, V, W):
        """Sanitised float32 logits (-inf where masked by state s or NaN); s < 0 = no mask."""
        inb = offs < V
        x = tl.load(ptr + row_off + offs, mask=inb, other=float("nan")).to(tl.float32)
        widx = offs >> 5
        words = tl.load(mask_ptr + tl.maximum(s, 0).to(tl.int64) * W + widx, mask=inb & (widx < W), other=0)
        ok = inb & (x == x) & ((((words >> (offs & 31)) & 1) != 0) | (s < 0))
        return tl.where(ok, tl.minimum(x, 3.4028234663852886e38), float("-inf"))

    @triton.jit
    def _verify_kernel(
        tl_ptr, t_stride_b, t_stride_k, dl_ptr, d_stride_b, d_stride_k, dtok_ptr, dtok_stride,
        mask_ptr, W, keys_ptr, values_ptr, present_ptr, cap, n_states,
        states_ptr, temp_ptr, seed_ptr,
        out_ptr, nout_ptr, chain_ptr, flag_ptr,
        V, K,
        HAS_TABLE: tl.constexpr, MAX_PROBE_: tl.constexpr, BLOCK: tl.constexpr,
    ):
        b = tl.program_id(0)
        b64 = b.to(tl.int64)
        t = tl.load(temp_ptr + b).to(tl.float32)
        inv_t = 1.0 / tl.where(t > 0, t, 1.0)
        key = _row_key(tl.load(seed_ptr + b))
        if HAS_TABLE:
            s = tl.load(states_ptr + b).to(tl.int32)
        else:
            s = tl.full([], -1, tl.int32)
        n_out = tl.full([], 0, tl.int32)
        flag = tl.full([], 0, tl.int32)
        done = tl.full([], 0, tl.int32)
        one = tl.full([], 1, tl.int32)
        i = tl.full([], 0, tl.int32)
        while (done == 0) & (i <= K):
            # --- state of position i: hash lookup of (s, draft[i-1]) ---
            if HAS_TABLE:
                if (i > 0) & (s >= 0):
                    x_prev = tl.load(dtok_ptr + b64 * dtok_stride + i - 1).to(tl.int32)
                    hkey = (s.to(tl.int64) << 32) | x_prev.to(tl.int64)
                    slot = (_slot_hash(s, x_prev) & (cap - 1)).to(tl.int64)
                    nxt = tl.full([], -1, tl.int32)
                    for _ in tl.static_range(MAX_PROBE_):
                        kk = tl.load(keys_ptr + slot)
                        vv = tl.load(values_ptr + slot)
                        nxt = tl.where(kk == hkey, vv, nxt)
                        slot = (slot + 1) & (cap - 1)
                    pres = tl.load(present_ptr + tl.maximum(nxt, 0), mask=nxt < n_states, other=0)
                    if (nxt < 0) | (pres == 0):
                        flag = one
                        done = one
                    s = nxt
            # defined on every path: compiled Triton only sees names bound before an `if`
            trow = b64 * t_stride_b + i * t_stride_k
            drow = b64 * d_stride_b + i * d_stride_k
            m_p = tl.full([], float("-inf"), tl.float32)
            s_p = tl.full([], 1.0, tl.float32)
            m_q = tl.full([], float("-inf"), tl.float32)
            s_q = tl.full([], 0.0, tl.float32)
            best_i = tl.full([], -1, tl.int32)
            if done == 0:
                tl.store(chain_ptr + b64 * (K + 1) + i, s)
                # --- pass 1: normalisers of p (and q), argmax of p ---
                mp = tl.full([BLOCK], float("-inf"), tl.float32)
                sp = tl.zeros([BLOCK], tl.float32)
                mq = tl.full([BLOCK], float("-inf"), tl.float32)
                sq = tl.zeros([BLOCK], tl.float32)
                best = tl.full([], float("-inf"), tl.float32)
                for off in tl.range(0, V, BLOCK):
                    offs = off + tl.arange(0, BLOCK)
                    xp = _row_block(tl_ptr, trow, mask_ptr, s, offs, V, W) * inv_t
                    nm = tl.maximum(mp, xp)
                    sp = sp * tl.exp(tl.where(nm > float("-inf"), mp - nm, 0.0)) + tl.where(
                        xp > float("-inf"), tl.exp(xp - nm), 0.0)
                    mp = nm
                    bm = tl.max(xp, 0)
                    bi = tl.argmax(xp, 0, tie_break_left=True)
                    upd = bm > best
                    best_i = tl.where(upd, off + bi, best_i)
                    best = tl.where(upd, bm, best)
                    if i < K:
                        xq = _row_block(dl_ptr, drow, mask_ptr, s, offs, V, W) * inv_t
                        nq = tl.maximum(mq, xq)
                        sq = sq * tl.exp(tl.where(nq > float("-inf"), mq - nq, 0.0)) + tl.where(
                            xq > float("-inf"), tl.exp(xq - nq), 0.0)
                        mq = nq
                m_p = tl.max(mp, 0)
                s_p = tl.sum(tl.where(mp > float("-inf"), sp * tl.exp(mp - m_p), 0.0), 0)
                m_q = tl.max(mq, 0)
                s_q = tl.sum(tl.where(mq > float("-inf"), sq * tl.exp(mq - m_q), 0.0), 0)
                if m_p == float("-inf"):
                    flag = one + one
                    done = one
            if done == 0:
                # --- accept test for the draft token at position i ---
                accept = tl.full([], 0, tl.int32)
                x = tl.full([], 0, tl.int32)
                if i < K:
                    x = tl.load(dtok_ptr + b64 * dtok_stride + i).to(tl.int32)
                    lx = _row_block(tl_ptr, trow, mask_ptr, s, x + tl.arange(0, 1), V, W) * inv_t
                    qx_l = _row_block(dl_ptr, drow, mask_ptr, s, x + tl.arange(0, 1), V, W) * inv_t
                    px = tl.sum(tl.where(lx > float("-inf"), tl.exp(lx - m_p), 0.0), 0) / s_p
                    qx = tl.sum(tl.where(qx_l > float("-inf"), tl.exp(qx_l - m_q), 0.0), 0) / tl.where(s_q > 0, s_q, 1.0)
                    if t > 0:
                        u = tl.sum(_uniform(key, 0x40000000 + i + tl.arange(0, 1)), 0)
                        if u * qx < px:
                            accept = one
                    else:
                        if x == best_i:
                            accept = one
                if accept == 1:
                    tl.store(out_ptr + b64 * (K + 1) + i, x.to(tl.int64))
                    n_out += 1
                else:
                    # --- emit: argmax (greedy), residual max(0, p - q), or bonus draw from p ---
                    tok = best_i
                    if t > 0:
                        use_res = tl.where(i < K, 1, 0)
                        if use_res == 1:
                            # residual mass check: fall back to p if p - q vanishes everywhere
                            rmass = tl.zeros([BLOCK], tl.float32)
                            for off in tl.range(0, V, BLOCK):
                                offs = off + tl.arange(0, BLOCK)
                                xp = _row_block(tl_ptr, trow, mask_ptr, s, offs, V, W) * inv_t
                                xq = _row_block(dl_ptr, drow, mask_ptr, s, offs, V, W) * inv_t
                                pj = tl.where(xp > float("-inf"), tl.exp(xp - m_p), 0.0) / s_p
                                qj = tl.where(xq > float("-inf"), tl.exp(xq - m_q), 0.0) / tl.where(s_q > 0, s_q, 1.0)
                                rmass += tl.maximum(pj - qj, 0.0)
                            if tl.sum(rmass, 0) <= 0.0:
                                use_res = tl.where(i < K, 0, 0)
                        gbest = tl.full([], float("-inf"), tl.float32)
                        gbest_i = tl.full([], -1, tl.int32)
                        for off in tl.range(0, V, BLOCK):
                            offs = off + tl.arange(0, BLOCK)
                            xp = _row_block(tl_ptr, trow, mask_ptr, s, offs, V, W) * inv_t
                            pj = tl.where(xp > float("-inf"), tl.exp(xp - m_p), 0.0) / s_p
                            if use_res == 1:
                                xq = _row_block(dl_ptr, drow, mask_ptr, s, offs, V, W) * inv_t
                                qj = tl.where(xq > float("-inf"), tl.exp(xq - m_q), 0.0) / tl.where(s_q > 0, s_q, 1.0)
                                wj = tl.maximum(pj - qj, 0.0)
                            else:
                                wj = pj
                            g = tl.log2(wj) - tl.log2(-tl.log2(_uniform(key, offs + i * V)))
                            g = tl.where(wj > 0, g, float("-inf"))
                            gm = tl.max(g, 0)
                            gi = tl.argmax(g, 0, tie_break_left=True)
                            gupd = gm > gbest
                            gbest_i = tl.where(gupd, off + gi, gbest_i)
                            gbest = tl.where(gupd, gm, gbest)
                        tok = gbest_i
                    tl.store(out_ptr + b64 * (K + 1) + i, tok.to(tl.int64))
                    n_out += 1
                    done = one
            i += 1
        tl.store(nout_ptr + b, n_out)
        tl.store(flag_ptr + b, flag.to(tl.int8))


def verify_draft(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    table: StateTable | None,
    states: torch.Tensor | None,
    *,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    block: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify k drafts per row under the grammar; returns (tokens, n_tokens, chain, flags).

    target_logits (B, k+1, V), draft_logits (B, k, V) (the logits the drafts were sampled from;
    a forced token is a one-hot row), draft_tokens (B, k). states (B,) int32: state before the
    first draft (negative = unconstrained); table None = unconstrained. temperature (B,) (<= 0
    greedy) applies to both models; seeds (B,) int64.
    tokens (B, k+1) int64: accepted drafts then the correction or bonus token, -1 padded;
    n_tokens (B,) int32 valid entries; chain (B, k+1) int32: state before each emitted position
    (-1 past the end); flags (B,) int8: 0 ok, 1 state miss on the chain (host computes it),
    2 every token masked at the stop position.
    """
    if not use_triton(target_logits):
        return verify_draft_ref(target_logits, draft_logits, draft_tokens, table, states,
                                temperature=temperature, seeds=seeds)
    b, k1, v = target_logits.shape
    dev = target_logits.device
    temperature = torch.ones(b, device=dev) if temperature is None else temperature.to(dev)
    seeds = torch.zeros(b, dtype=torch.int64, device=dev) if seeds is None else seeds.to(dev)
    target_logits = target_logits if target_logits.stride(-1) == 1 else target_logits.contiguous()
    if draft_logits.numel() == 0:
        draft_logits = target_logits
    draft_logits = draft_logits if draft_logits.stride(-1) == 1 else draft_logits.contiguous()
    draft_tokens = draft_tokens.to(dev).contiguous()
    if draft_tokens.numel() == 0:
        draft_tokens = torch.zeros(b, 1, dtype=torch.int64, device=dev)
    out = torch.full((b, k1), -1, dtype=torch.int64, device=dev)
    chain = torch.full((b, k1), -1, dtype=torch.int32, device=dev)
    n_out = torch.empty(b, dtype=torch.int32, device=dev)
    flags = torch.empty(b, dtype=torch.int8, device=dev)
    has_table = table is not None and states is not None
    if table is not None and states is not None:
        st = states.to(device=dev, dtype=torch.int32).contiguous()
        tabs = (table.masks, table.words, table.keys, table.values, table.present, table.transition_capacity,
                table.state_capacity)
    else:
        st = torch.full((b,), -1, dtype=torch.int32, device=dev)
        dummy = torch.zeros(1, dtype=torch.int32, device=dev)
        tabs = (dummy, 1, torch.full((1,), -1, dtype=torch.int64, device=dev), dummy,
                torch.zeros(1, dtype=torch.int8, device=dev), 1, 1)
    _verify_kernel[(b,)](
        target_logits, target_logits.stride(0), target_logits.stride(1),
        draft_logits, draft_logits.stride(0), draft_logits.stride(1),
        draft_tokens, draft_tokens.stride(0),
        *tabs, st, temperature, seeds, out, n_out, chain, flags, v, k1 - 1,
        HAS_TABLE=has_table, MAX_PROBE_=MAX_PROBE, BLOCK=block, num_warps=8,
    )
    return out, n_out, chain, flags
