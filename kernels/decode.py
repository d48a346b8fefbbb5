"""The small per-layer operations of a one-token decode step, one fused kernel each.

Why: at batch 1 a Llama-3-8B decode step is bound by weight reads (~3.8 ms on an H200), but the
layer's glue in plain torch (RMSNorm ~7 kernels, rotary ~10, the K/V writes, masked softmax
attention ~7, SiLU-times-up 2, residual adds) is ~40 launches per layer, ~1,300 per step, and
even replayed from a CUDA graph each costs a couple of microseconds of idle GPU. Fused, a layer is
the four GEMMs plus four kernels.

Each kernel reproduces the eager transformers arithmetic of a Llama-family layer, including
where it rounds to the model dtype (the residual sum before the norm, ``x * cos`` and
``rotate_half(x) * sin`` separately, the SiLU before the product), so results match the eager
path up to the order of floating-point sums. The pure-torch twin beside each kernel *is* that
eager arithmetic: CPU callers run it, and tests hold the kernels to it.
"""

from __future__ import annotations

import functools

import torch

from ._common import HAS_TRITON, tl, triton, use_triton

# ------------------------------------------------------------------------------ twins (reference)

def add_rms_norm_ref(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``h + delta`` (the residual stream) and its RMSNorm, as transformers' ``LlamaRMSNorm``."""
    if delta is not None:
        h = h + delta
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype), h


def rope_store_kv_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                      values: torch.Tensor, rows: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Rotate q and k of ``qkv`` (B, (H+2K)*D), store k and v at ``rows`` of the caches; return q.

    ``keys``/``values`` are (N, D) views of the caches; ``rows`` (B*K,) the row each new (slot,
    KV head) vector goes to. cos/sin (B, D) in the model dtype. Returns q as (B, H, D).
    """
    b = qkv.shape[0]
    d = keys.shape[-1]
    q = qkv[:, : heads * d].view(b, heads, d)
    k = qkv[:, heads * d: (heads + kv_heads) * d].reshape(b, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].reshape(b, kv_heads, d)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
    keys.index_copy_(0, rows, k.reshape(b * kv_heads, d).to(keys.dtype))
    values.index_copy_(0, rows, v.reshape(b * kv_heads, d).to(values.dtype))
    return q


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def decode_attention_ref(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor,
                         length: int, scale: float) -> torch.Tensor:
    """One query per row against cache columns ``[0, length)`` masked to ``<= pos``.

    q (B, H, D); keys/values (slots, K, cols, D), row i = slot i; grouped heads (H = G*K) share a
    KV head without copying it. Returns (B, H*D) in q's dtype.
    """
    b, h, d = q.shape
    kv = keys.shape[1]
    mask = torch.zeros((b, 1, 1, length), dtype=torch.float32, device=q.device)
    cols = torch.arange(length, device=q.device)
    mask.masked_fill_((cols.view(1, -1) > pos.view(-1, 1)).view(b, 1, 1, length), float("-inf"))
    qg = q.reshape(b, kv, h // kv, d)
    scores = torch.matmul(qg, keys[:b, :, :length].transpose(-1, -2)).float() * scale + mask
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    return torch.matmul(probs, values[:b, :, :length]).reshape(b, h * d)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` = [gate | up] along the last dim (fused projection)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


# -------------------------------------------------------------------------------------- kernels

if HAS_TRITON:

    @triton.jit
    def _add_rms_norm_kernel(h_ptr, delta_ptr, w_ptr, out_ptr, sum_ptr, n, eps,
                             HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < n
        h = tl.load(h_ptr + row * n + offs, mask=m, other=0.0)
        if HAS_DELTA:
            d = tl.load(delta_ptr + row * n + offs, mask=m, other=0.0)
            h = (h.to(tl.float32) + d.to(tl.float32)).to(sum_ptr.dtype.element_ty)
            tl.store(sum_ptr + row * n + offs, h, mask=m)
        x = h.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 0) / n + eps)
        y = (x * rstd).to(sum_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n + offs, (w * y).to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_half(x1, x2, c1, c2, s1, s2):
        """Both halves of ``x * cos + rotate_half(x) * sin``, each product rounded like torch's."""
        dt = x1.dtype
        a1 = (x1.to(tl.float32) * c1).to(dt).to(tl.float32)
        b1 = (-x2.to(tl.float32) * s1).to(dt).to(tl.float32)
        a2 = (x2.to(tl.float32) * c2).to(dt).to(tl.float32)
        b2 = (x1.to(tl.float32) * s2).to(dt).to(tl.float32)
        return (a1 + b1).to(dt), (a2 + b2).to(dt)

    @triton.jit
    def _rope_store_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, rows_ptr,
                              HEADS: tl.constexpr, KV_HEADS: tl.constexpr, D: tl.constexpr,
                              HALF_BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)  # 0..H-1: a query head; H..H+K-1: a KV head
        half = D // 2
        offs = tl.arange(0, HALF_BLOCK)
        m = offs < half
        width = (HEADS + 2 * KV_HEADS) * D
        c1 = tl.load(cos_ptr + b * D + offs, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + b * D + half + offs, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + b * D + offs, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + b * D + half + offs, mask=m, other=0.0).to(tl.float32)
        src = qkv_ptr + b * width + j * D
        x1 = tl.load(src + offs, mask=m, other=0.0)
        x2 = tl.load(src + half + offs, mask=m, other=0.0)
        y1, y2 = _rope_half(x1, x2, c1, c2, s1, s2)
        if j < HEADS:
            dst = q_ptr + (b * HEADS + j) * D
            tl.store(dst + offs, y1, mask=m)
            tl.store(dst + half + offs, y2, mask=m)
        else:
            kh = j - HEADS
            row = tl.load(rows_ptr + b * KV_HEADS + kh)
            tl.store(k_ptr + row * D + offs, y1.to(k_ptr.dtype.element_ty), mask=m)
            tl.store(k_ptr + row * D + half + offs, y2.to(k_ptr.dtype.element_ty), mask=m)
            vsrc = qkv_ptr + b * width + (HEADS + KV_HEADS + kh) * D
            v1 = tl.load(vsrc + offs, mask=m, other=0.0)
            v2 = tl.load(vsrc + half + offs, mask=m, other=0.0)
            tl.store(v_ptr + row * D + offs, v1.to(v_ptr.dtype.element_ty), mask=m)
            tl.store(v_ptr + row * D + half + offs, v2.to(v_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, length, span, scale,
                                 stride_slot, stride_head, stride_col,
                                 HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                                 D: tl.constexpr, SPLITS: tl.constexpr, IEEE: tl.constexpr,
                                 BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
        """(row, KV head, split) per program: the GROUP query heads of a KV head are the rows of
        one tensor-core dot, so K and V are read once per KV head; online softmax over the split's
        ``span`` columns. With SPLITS > 1 the partial (max, sum, acc) go to scratch for the merge.
        Operands are widened to float32: a bf16/fp16 value is exact in TF32, so the default TF32
        dot equals a bf16 one (IEEE is asked for float32 models)."""
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1).to(tl.int64)
        sp = tl.program_id(2)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        mg, md = offs_g < GROUP, offs_d < D
        heads = b * HEADS + kvh * GROUP + offs_g
        q = tl.load(q_ptr + heads[:, None] * D + offs_d[None, :], mask=mg[:, None] & md[None, :], other=0.0).to(tl.float32)
        dt = q_ptr.dtype.element_ty
        end = tl.minimum(tl.load(pos_ptr + b) + 1, length)  # columns past pos are masked anyway
        lo = sp * span
        hi = tl.minimum(lo + span, end)
        base = b * stride_slot + kvh * stride_head
        m_i = tl.full([BLOCK_G], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mc = cols < hi
            offs = base + cols[:, None].to(tl.int64) * stride_col + offs_d[None, :]
            k = tl.load(k_ptr + offs, mask=mc[:, None] & md[None, :], other=0.0).to(tl.float32)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            # scores rounded to the model dtype first, as the eager matmul returns them
            s = s.to(dt).to(tl.float32) * scale
            s = tl.where(mc[None, :], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            v = tl.load(v_ptr + offs, mask=mc[:, None] & md[None, :], other=0.0).to(tl.float32)
            pr = p.to(dt).to(tl.float32)
            if IEEE:
                pv = tl.dot(pr, v, input_precision="ieee")
            else:
                pv = tl.dot(pr, v)
            acc = acc * alpha[:, None] + pv
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        if SPLITS == 1:
            tl.store(out_ptr + heads[:, None] * D + offs_d[None, :], (acc / l_i[:, None]).to(dt),
                     mask=mg[:, None] & md[None, :])
        else:
            part = ((b * KV_HEADS + kvh) * SPLITS + sp) * BLOCK_G + offs_g
            tl.store(m_ptr + part, m_i)
            tl.store(l_ptr + part, l_i)
            tl.store(acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :], acc)

    @triton.jit
    def _merge_splits_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                             GROUP: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                             BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
        """One (row, query head) per program: softmax-weighted sum of its splits' partials."""
        b = tl.program_id(0).to(tl.int64)
        hq = tl.program_id(1)
        kvh, g = hq // GROUP, hq % GROUP
        offs_s = tl.arange(0, SPLITS)
        offs_d = tl.arange(0, BLOCK_D)
        part = ((b * KV_HEADS + kvh) * SPLITS + offs_s) * BLOCK_G + g
        m = tl.load(m_ptr + part)
        w = tl.exp(m - tl.max(m, 0))  # splits with no columns have m = -inf: weight 0
        l = tl.sum(tl.load(l_ptr + part) * w, 0)
        acc = tl.load(acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :])
        out = tl.sum(acc * w[:, None], 0) / l
        tl.store(out_ptr + (b * HEADS + hq) * D + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < D)

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, n, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        g = tl.load(gu_ptr + b * 2 * n + offs, mask=m, other=0.0)
        u = tl.load(gu_ptr + b * 2 * n + n + offs, mask=m, other=0.0).to(tl.float32)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
        tl.store(out_ptr + b * n + offs, (s * u).to(out_ptr.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------- public API

def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(h + delta) * weight, h + delta) for 2-D ``h``; ``delta=None`` norms ``h`` alone."""
    if not use_triton(h):
        return add_rms_norm_ref(h, delta, weight, eps)
    h = h.contiguous()
    n = h.shape[-1]
    out = torch.empty_like(h)
    total = torch.empty_like(h) if delta is not None else h
    d = delta.contiguous() if delta is not None else h
    _add_rms_norm_kernel[(h.shape[0],)](h, d, weight, out, total, n, eps, HAS_DELTA=delta is not None,
                                         BLOCK=triton.next_power_of_2(n), num_warps=4)
    return out, total


def rope_store_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor, rows: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Rotary embedding of q and k plus the K/V cache writes, in one kernel (see the twin)."""
    if not use_triton(qkv):
        return rope_store_kv_ref(qkv, cos, sin, keys, values, rows, heads, kv_heads)
    b = qkv.shape[0]
    d = keys.shape[-1]
    q = torch.empty((b, heads, d), dtype=qkv.dtype, device=qkv.device)
    _rope_store_kv_kernel[(b, heads + kv_heads)](
        qkv.contiguous(), cos.contiguous(), sin.contiguous(), q, keys, values, rows,
        HEADS=heads, KV_HEADS=kv_heads, D=d, HALF_BLOCK=triton.next_power_of_2(d // 2), num_warps=1,
        enable_fp_fusion=False)  # fused multiply-adds would skip the product roundings (measured: 24% off by an ulp)
    return q


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor,
                     length: int, scale: float) -> torch.Tensor:
    """Attention of one new token per row over its cached columns (see the twin).

    Splits the columns across programs when rows x KV heads alone would leave most of the GPU
    idle (batch 1: 8 programs for 132 SMs); a second small kernel merges the splits.
    """
    if not use_triton(q):
        return decode_attention_ref(q, keys, values, pos, length, scale)
    b, h, d = q.shape
    kv = keys.shape[1]
    block_n, block_d = 64, triton.next_power_of_2(d)
    block_g = max(16, triton.next_power_of_2(h // kv))  # tensor-core dots need 16 rows
    splits = 1
    while b * kv * splits < 2 * _sm_count(q.device) and splits * 2 * block_n <= length:
        splits *= 2
    span = triton.cdiv(triton.cdiv(length, splits), block_n) * block_n
    out = torch.empty((b, h * d), dtype=q.dtype, device=q.device)
    shape = (b, kv, splits, block_g)
    m = torch.empty(shape if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    acc = torch.empty((*shape, block_d) if splits > 1 else (1,), dtype=torch.float32, device=q.device)
    _decode_attention_kernel[(b, kv, splits)](
        q.contiguous(), keys, values, pos, out, m, l_, acc, length, span, scale,
        keys.stride(0), keys.stride(1), keys.stride(2), HEADS=h, KV_HEADS=kv, GROUP=h // kv, D=d, SPLITS=splits,
        IEEE=q.dtype == torch.float32, BLOCK_G=block_g, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=4)
    if splits > 1:
        _merge_splits_kernel[(b, h)](m, l_, acc, out, HEADS=h, KV_HEADS=kv, GROUP=h // kv, D=d, SPLITS=splits,
                                      BLOCK_G=block_g, BLOCK_D=block_d, num_warps=1)
    return out


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (the interpreter on a CPU: pretend 4)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a fused [gate | up] projection (see the twin)."""
    if not use_triton(gate_up):
        return silu_mul_ref(gate_up)
    gate_up = gate_up.contiguous()
    b, n = gate_up.shape[0], gate_up.shape[-1] // 2
    out = torch.empty((b, n), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(b, triton.cdiv(n, block))](gate_up, out, n, BLOCK=block, num_warps=4)
    return out
