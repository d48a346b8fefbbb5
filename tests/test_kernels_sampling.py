"""Fused masked sampling: kernel == twin (greedy exactly, seeded draws token for token),
thresholds exact, distribution right (chi-square), never a masked token (hypothesis)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kernels import DEVICE, chi2_pvalue, needs_kernels, rand_words

from constrain.kernels import sample, sample_ref, unpack_bitmask
from constrain.kernels import sampling as S

BLOCK = 32  # small blocks keep the interpreter quick; chunking is still exercised (V > BLOCK)


def _case(seed: int, b: int = 8, v: int = 100):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, v, generator=g) * 3).round(decimals=1)  # rounding makes ties
    x[0, :10] = float("nan")
    x[1, 3] = float("inf")
    x[2, :] = float("-inf")
    masks = rand_words((4, (v + 31) // 32), g)
    masks[3] = 0
    midx = torch.tensor([0, 1, 2, -1, 3, 0, 1, 2][:b], dtype=torch.int32)
    params = dict(
        temperature=torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.5, 0.0, 2.0][:b]),
        top_k=torch.tensor([0, 5, 0, 3, 0, 50, 2, 1][:b], dtype=torch.int32),
        top_p=torch.tensor([1.0, 1.0, 0.9, 0.5, 1.0, 0.8, 0.3, 0.95][:b]),
        min_p=torch.tensor([0.0, 0.0, 0.0, 0.1, 0.0, 0.05, 0.2, 0.0][:b]),
        seeds=torch.arange(b, dtype=torch.int64) * 1000 + 7,
    )
    return x, masks, midx, params


def _to(d: dict) -> dict:
    return {k: v.to(DEVICE) for k, v in d.items()}


@needs_kernels
def test_sample_matches_twin_token_for_token() -> None:
    for seed, block in ((0, BLOCK), (1, BLOCK), (1, 64)):  # top_k <= 50: candidates once blocks hold 64
        x, masks, midx, params = _case(seed)
        for p in (dict(temperature=params["temperature"], seeds=params["seeds"]), params):
            tk, fk = sample(x.to(DEVICE), masks.to(DEVICE), midx.to(DEVICE), block=block, max_top_k=50, **_to(p))
            tr, fr = sample_ref(x, masks, midx, **p)
            assert torch.equal(fk.cpu(), fr)
            assert torch.equal(tk.cpu(), tr)
            assert fk[4] and tk[4] == -1  # row 4 uses the all-zero mask row: flagged, not sampled
            assert fk[2]  # all logits -inf: flagged


@needs_kernels
def test_threshold_search_exact() -> None:
    g = torch.Generator().manual_seed(3)
    b, v = 8, 200
    x = (torch.randn(b, v, generator=g) * 2).round(decimals=1)
    t = torch.rand(b, generator=g) + 0.3
    tk = torch.randint(0, 30, (b,), generator=g).int()
    tp = torch.rand(b, generator=g) * 0.9 + 0.05
    mp = torch.rand(b, generator=g) * 0.2
    tp[0], tk[1], mp[2], tk[3] = 1.0, 0, 0.0, 500
    masks = rand_words((b, (v + 31) // 32), g)
    dev = [a.to(DEVICE) for a in (x, masks, t, tk, tp, mp)]
    pmax = torch.empty(b, 1, device=DEVICE)
    scratch = [torch.empty(b, 1, device=DEVICE, dtype=dt) for dt in (torch.int32, torch.float32, torch.int32)]
    common = dict(HAS_MASK=True, HAS_MIDX=False, BLOCK=64)
    S._stage1_kernel[(b, 1)](dev[0], v, dev[1], dev[0], masks.shape[1], dev[2], torch.zeros(b, dtype=torch.int64, device=DEVICE),
                             dev[3], dev[4], dev[5], pmax, *scratch, v, 256, 1, HAS_FILTERS=True, **common)
    ok = S._allowed_ref(x, masks, None)
    xx = torch.where(ok, x, torch.tensor(float("-inf")))
    z = (xx - xx.max(-1).values[:, None]) * (1.0 / t)[:, None]  # the kernel multiplies by 1/T
    for max_top_k in (None, 500, 29):  # radix search; candidates (K=512 > BLOCK: radix); candidates
        if max_top_k == 29:
            dev[3][3] = tk[3] = 29
        thr = S._thresholds(dev[0], dev[1], dev[0], masks.shape[1], dev[2], dev[3], dev[4], dev[5], pmax, v, 256, 1, 1,
                            common, max_top_k)
        assert torch.equal(thr.cpu(), S.filter_threshold_ref(z, ok, tk, tp, mp))


def _expected(x: torch.Tensor, allowed: torch.Tensor, t: float, k: int, p: float, mp: float) -> torch.Tensor:
    """Independent float64 reference: temperature, then top-k, top-p (renormalised), min-p."""
    z = torch.where(allowed, x.double() / t, torch.tensor(-math.inf, dtype=torch.float64))
    probs = torch.softmax(z, -1)
    order = torch.argsort(probs, descending=True, stable=True)
    keep = torch.zeros_like(allowed)
    ps = probs[order]
    n = int(allowed.sum())
    kk = min(k, n) if k > 0 else n
    kth = ps[kk - 1]
    keep_k = allowed & (probs >= kth)
    mass_k = probs[keep_k].sum()
    cum = torch.cumsum(torch.where(keep_k[order], ps, torch.zeros_like(ps)), 0)
    cut = ps[int(torch.nonzero(cum >= p * mass_k - 1e-12)[0])] if p < 1 else 0.0
    keep = keep_k & (probs >= cut) & (probs >= mp * probs.max())
    out = torch.where(keep, probs, torch.zeros_like(probs))
    return out / out.sum()


def test_twin_distribution_chi_square() -> None:
    """The twin's draws (same RNG as the kernel) follow the masked, filtered distribution."""
    g = torch.Generator().manual_seed(11)
    v, n = 12, 20000
    x = torch.randn(v, generator=g) * 1.5
    words = torch.tensor([0b111011111110], dtype=torch.int32)  # tokens 1..7, 9..11
    allowed = unpack_bitmask(words[None], v)[0]
    for t, k, p, mp in ((1.0, 0, 1.0, 0.0), (0.7, 6, 0.9, 0.0), (1.3, 0, 0.8, 0.05), (0.9, 4, 1.0, 0.1)):
        tok, flag = sample_ref(
            x.repeat(n, 1), words[None], torch.zeros(n, dtype=torch.int32),
            temperature=torch.full((n,), t), top_k=torch.full((n,), k, dtype=torch.int32),
            top_p=torch.full((n,), p), min_p=torch.full((n,), mp), seeds=torch.arange(n, dtype=torch.int64) * 7919,
        )
        assert not flag.any()
        want = _expected(x, allowed, t, k, p, mp)
        counts = torch.bincount(tok, minlength=v)
        assert counts[want == 0].sum() == 0
        assert chi2_pvalue(counts, want) > 1e-3, (t, k, p, mp, counts.tolist(), want.tolist())


@needs_kernels
def test_kernel_distribution_chi_square() -> None:
    """The kernel itself, many seeds at once (rows), temperature sampling under a mask."""
    g = torch.Generator().manual_seed(5)
    v, n = 6, 400
    x = torch.randn(v, generator=g)
    words = torch.tensor([[0b101110]], dtype=torch.int32)
    tok, flag = sample(x.repeat(n, 1).to(DEVICE), words.to(DEVICE), torch.zeros(n, dtype=torch.int32, device=DEVICE),
                       temperature=torch.full((n,), 0.8, device=DEVICE),
                       seeds=torch.arange(n, dtype=torch.int64, device=DEVICE) + 12345, block=8)
    want = _expected(x, unpack_bitmask(words, v)[0], 0.8, 0, 1.0, 0.0)
    counts = torch.bincount(tok.cpu(), minlength=v)
    assert not flag.any() and counts[want == 0].sum() == 0
    assert chi2_pvalue(counts, want) > 1e-3, counts.tolist()


@needs_kernels
@settings(max_examples=10, deadline=None)
@given(
    b=st.integers(1, 3),
    v=st.integers(1, 70),
    seed=st.integers(0, 2**31),
    density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
    filters=st.booleans(),
)
def test_never_a_masked_token(b: int, v: int, seed: int, density: float, filters: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, v, generator=g) * 4
    special = torch.rand(b, v, generator=g)
    x[special < 0.1] = float("nan")
    x[(special >= 0.1) & (special < 0.15)] = float("inf")
    x[(special >= 0.15) & (special < 0.25)] = float("-inf")
    bits = torch.rand(b, ((v + 31) // 32) * 32, generator=g) < density
    words = (bits.view(b, -1, 32).long() << torch.arange(32)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    kw = dict(temperature=torch.rand(b, generator=g) * 2 - 0.3, seeds=torch.randint(0, 2**40, (b,), generator=g))
    if filters:
        kw.update(top_k=torch.randint(0, 5, (b,), generator=g).int(), top_p=torch.rand(b, generator=g) * 1.2,
                  min_p=torch.rand(b, generator=g) * 0.5)
    tok, flag = sample(x.to(DEVICE), words.to(DEVICE), None, block=BLOCK, **_to(kw))
    tok, flag = tok.cpu(), flag.cpu()
    allowed = unpack_bitmask(words, v) & ~torch.isnan(x) & (x > float("-inf"))
    for r in range(b):
        if not allowed[r].any():
            assert flag[r] and tok[r] == -1
        else:
            assert not flag[r] and allowed[r, tok[r]]
