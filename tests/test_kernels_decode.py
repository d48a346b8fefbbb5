"""kernels/decode.py: twins == transformers' own arithmetic (or a float64 reference); kernels == twins.

The Triton interpreter rounds float32 -> bfloat16 by truncation (the GPU rounds to nearest even),
so bf16 comparisons here allow an ulp or two; float32 ones are tight. On the GPU the decode step
built from these kernels is checked against the eager forward (bench/engine_graph.py's replay check).
"""

from __future__ import annotations

import pytest
import torch
from support.kernels import DEVICE, needs_kernels  # first: it may set TRITON_INTERPRET
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from constrain.kernels.decode import (
    add_rms_norm,
    add_rms_norm_ref,
    decode_attention,
    decode_attention_ref,
    rope_store_kv,
    rope_store_kv_ref,
    silu_mul,
    silu_mul_ref,
)

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=4e-2, rtol=2e-2)}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _cache(slots: int, kv: int, cols: int, d: int, dtype: torch.dtype, g: torch.Generator):
    return (torch.randn(slots, kv, cols, d, generator=g).to(dtype), torch.randn(slots, kv, cols, d, generator=g).to(dtype))


def _rows(b: int, kv: int, cols: int, pos: torch.Tensor) -> torch.Tensor:
    return ((torch.arange(b).view(b, 1) * kv + torch.arange(kv)) * cols + pos.view(b, 1)).reshape(-1)


# ------------------------------------------------------------------- twins against their oracles

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_twin_is_llama_rmsnorm(dtype: torch.dtype) -> None:
    g = _gen(1)
    norm = LlamaRMSNorm(96, eps=1e-5)
    norm.weight.data = torch.randn(96, generator=g)
    norm = norm.to(dtype)
    h, d = torch.randn(4, 96, generator=g).to(dtype), torch.randn(4, 96, generator=g).to(dtype)
    out, total = add_rms_norm_ref(h, d, norm.weight, 1e-5)
    assert torch.equal(total, h + d)
    assert torch.equal(out, norm(h + d))
    assert torch.equal(add_rms_norm_ref(h, None, norm.weight, 1e-5)[0], norm(h))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_twin_is_transformers_rotary_and_writes_only_its_rows(dtype: torch.dtype) -> None:
    g = _gen(2)
    b, h, kv, d, cols = 3, 4, 2, 16, 9
    qkv = torch.randn(b, (h + 2 * kv) * d, generator=g).to(dtype)
    cos, sin = torch.randn(b, d, generator=g).to(dtype), torch.randn(b, d, generator=g).to(dtype)
    keys, values = _cache(4, kv, cols, d, dtype, g)
    before_k, before_v = keys.clone(), values.clone()
    pos = torch.tensor([0, 5, 8])
    q = rope_store_kv_ref(qkv, cos, sin, keys.view(-1, d), values.view(-1, d), _rows(b, kv, cols, pos), h, kv)
    q_want, k_want = apply_rotary_pos_emb(qkv[:, : h * d].view(b, h, 1, d), qkv[:, h * d: (h + kv) * d].view(b, kv, 1, d),
                                          cos.view(b, 1, d), sin.view(b, 1, d))
    assert torch.equal(q, q_want[:, :, 0])
    written = torch.zeros_like(keys, dtype=torch.bool)
    for i in range(b):
        written[i, :, int(pos[i])] = True
        assert torch.equal(keys[i, :, int(pos[i])], k_want[i, :, 0])
        assert torch.equal(values[i, :, int(pos[i])], qkv[i, (h + kv) * d:].view(kv, d))
    assert torch.equal(keys[~written], before_k[~written]) and torch.equal(values[~written], before_v[~written])


def test_attention_twin_matches_float64_softmax() -> None:
    g = _gen(3)
    b, h, kv, d, cols, length = 3, 6, 2, 8, 12, 10
    q = torch.randn(b, h, d, generator=g)
    keys, values = _cache(4, kv, cols, d, torch.float32, g)
    pos = torch.tensor([0, 4, 20])  # the last row is padding past the cache: every column counts
    got = decode_attention_ref(q, keys, values, pos, length, 0.3).view(b, h, d)
    for i in range(b):
        n = min(int(pos[i]) + 1, length)
        for j in range(h):
            k, v = keys[i, j // (h // kv), :n].double(), values[i, j // (h // kv), :n].double()
            want = torch.softmax(k @ q[i, j].double() * 0.3, 0) @ v
            assert torch.allclose(got[i, j].double(), want, atol=1e-5)


def test_silu_mul_twin() -> None:
    gu = torch.randn(2, 20, generator=_gen(4))
    assert torch.allclose(silu_mul_ref(gu), gu[:, :10] * torch.sigmoid(gu[:, :10]) * gu[:, 10:], atol=1e-6)


# ------------------------------------------------------------------------- kernels against twins

@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [64, 576])  # 576: SmolLM2's hidden size, not a power of two
def test_add_rms_norm_kernel(dtype: torch.dtype, n: int) -> None:
    g = _gen(n)
    h, d = torch.randn(3, n, generator=g).to(dtype), torch.randn(3, n, generator=g).to(dtype)
    w = torch.randn(n, generator=g).to(dtype)
    for delta in (d, None):
        out, total = add_rms_norm(h.to(DEVICE), None if delta is None else delta.to(DEVICE), w.to(DEVICE), 1e-6)
        want, want_total = add_rms_norm_ref(h, delta, w, 1e-6)
        assert torch.allclose(total.cpu().float(), want_total.float(), **TOL[dtype])
        assert torch.allclose(out.cpu().float(), want.float(), **TOL[dtype])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,kv,d", [(4, 2, 16), (3, 3, 64), (8, 1, 32)])
def test_rope_store_kv_kernel(dtype: torch.dtype, h: int, kv: int, d: int) -> None:
    g = _gen(h * 100 + d)
    b, cols = 3, 7
    qkv = torch.randn(b, (h + 2 * kv) * d, generator=g).to(dtype)
    cos, sin = torch.randn(b, d, generator=g).to(dtype), torch.randn(b, d, generator=g).to(dtype)
    keys, values = _cache(3, kv, cols, d, dtype, g)
    rows = _rows(b, kv, cols, torch.tensor([6, 0, 3]))
    k_dev, v_dev = keys.clone().to(DEVICE), values.clone().to(DEVICE)
    q = rope_store_kv(qkv.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE), k_dev.view(-1, d), v_dev.view(-1, d),
                      rows.to(DEVICE), h, kv)
    want = rope_store_kv_ref(qkv, cos, sin, keys.view(-1, d), values.view(-1, d), rows, h, kv)
    assert torch.allclose(q.cpu().float(), want.float(), **TOL[dtype])
    assert torch.allclose(k_dev.cpu().float(), keys.float(), **TOL[dtype])
    assert torch.equal(v_dev.cpu(), values)  # values are copied, not computed


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,h,kv,d,length", [(4, 4, 2, 16, 70), (4, 3, 3, 64, 32), (4, 8, 1, 32, 5),
                                              (1, 4, 2, 16, 300), (1, 8, 1, 32, 1000)])  # batch 1: split columns
def test_decode_attention_kernel(dtype: torch.dtype, b: int, h: int, kv: int, d: int, length: int) -> None:
    g = _gen(h * 1000 + length)
    cols = max(80, length + 1)
    q = torch.randn(b, h, d, generator=g).to(dtype)
    keys, values = _cache(5, kv, cols, d, dtype, g)
    # first column only .. padding row past the cache; batch 1: a row whose columns end mid-split
    pos = torch.tensor([0, length // 2, length - 1, cols]) if b == 4 else torch.tensor([length - 70])
    got = decode_attention(q.to(DEVICE), keys.to(DEVICE), values.to(DEVICE), pos.to(DEVICE), length, d ** -0.5)
    want = decode_attention_ref(q, keys, values, pos, length, d ** -0.5)
    assert torch.allclose(got.cpu().float(), want.float(), **TOL[dtype])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_kernel(dtype: torch.dtype) -> None:
    gu = (3 * torch.randn(3, 2 * 1500, generator=_gen(5))).to(dtype)
    got = silu_mul(gu.to(DEVICE))
    assert torch.allclose(got.cpu().float(), silu_mul_ref(gu).float(), **TOL[dtype])
