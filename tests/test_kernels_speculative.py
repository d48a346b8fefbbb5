"""Masked speculative verification: kernel == twin, output follows masked target sampling."""

from __future__ import annotations

import torch
from support.kernels import DEVICE, chi2_pvalue, needs_kernels, rand_words

from constrain.kernels import StateTable, unpack_bitmask, verify_draft, verify_draft_ref


def _setup(seed: int, b: int, k: int, v: int, n_states: int = 5):
    """A table whose allowed tokens all have transitions, and drafts legal along the chain."""
    g = torch.Generator().manual_seed(seed)
    w = (v + 31) // 32
    masks = rand_words((n_states, w), g)
    table = StateTable(w, device=DEVICE, state_capacity=8)
    table.add_states(torch.arange(n_states), masks)
    allowed = unpack_bitmask(masks, v)
    src, tok = allowed.nonzero(as_tuple=True)
    nxt = torch.randint(0, n_states, src.shape, generator=g)
    table.add_transitions(src, tok, nxt)
    trans = {(int(a), int(c)): int(d) for a, c, d in zip(src, tok, nxt)}
    states = torch.randint(0, n_states, (b,), generator=g).int()
    states[-1] = -1  # one unconstrained row
    drafts = torch.zeros(b, k, dtype=torch.int64)
    for r in range(b):
        s = int(states[r])
        for i in range(k):
            cand = allowed[s].nonzero().flatten() if s >= 0 else torch.arange(v)
            x = int(cand[torch.randint(0, len(cand), (1,), generator=g)])
            drafts[r, i] = x
            s = trans[(s, x)] if s >= 0 else -1
    return g, table, states, drafts, allowed, trans


@needs_kernels
def test_verify_matches_twin() -> None:
    b, k, v = 6, 3, 70
    g, table, states, drafts, _, _ = _setup(1, b, k, v)
    tl_ = torch.randn(b, k + 1, v, generator=g) * 2
    dl = tl_[:, :k] + torch.randn(b, k, v, generator=g)
    temp = torch.tensor([0.0, 1.0, 0.8, 1.0, 1.2, 1.0])
    seeds = torch.arange(b) + 11
    got = verify_draft(tl_.to(DEVICE), dl.to(DEVICE), drafts.to(DEVICE), table, states.to(DEVICE),
                       temperature=temp.to(DEVICE), seeds=seeds.to(DEVICE), block=32)
    ref = verify_draft_ref(tl_.to(DEVICE), dl.to(DEVICE), drafts.to(DEVICE), table, states.to(DEVICE),
                           temperature=temp.to(DEVICE), seeds=seeds.to(DEVICE))  # (the table's device)
    for a, r in zip(got, ref):
        assert torch.equal(a.cpu(), r.cpu())


def _walk_ok(tokens, n, states, allowed, trans) -> None:
    for r in range(tokens.shape[0]):
        s = int(states[r])
        for i in range(int(n[r])):
            x = int(tokens[r, i])
            assert s < 0 or allowed[s, x], (r, i, s, x)
            s = trans.get((s, x), -1) if s >= 0 else -1


def test_verify_output_is_masked_target_distribution() -> None:
    """First emitted token ~ masked target p, whatever the draft; the rest stay legal."""
    b, k, v = 1, 2, 8
    g, table, states, _, allowed, trans = _setup(2, b, k, v, n_states=3)
    s0 = 0
    n = 3000
    tl_ = torch.randn(1, k + 1, v, generator=g).repeat(n, 1, 1)
    dl = torch.randn(1, k, v, generator=g).repeat(n, 1, 1)
    # drafts sampled from the masked draft distribution along the chain
    drafts = torch.zeros(n, k, dtype=torch.int64)
    s = torch.full((n,), s0)
    for i in range(k):
        q = torch.softmax(dl[0, i].masked_fill(~allowed[s], float("-inf")), -1)
        drafts[:, i] = torch.multinomial(q, 1, generator=g).flatten()
        s = torch.tensor([trans[(int(a), int(c))] for a, c in zip(s, drafts[:, i])])
    st = torch.full((n,), s0, dtype=torch.int32)
    out, cnt, chain, flags = (t.cpu() for t in verify_draft_ref(
        tl_.to(DEVICE), dl.to(DEVICE), drafts.to(DEVICE), table, st.to(DEVICE), seeds=(torch.arange(n) * 31 + 5).to(DEVICE)))
    assert (flags == 0).all() and (cnt >= 1).all()
    _walk_ok(out, cnt, st, allowed, trans)
    p0 = torch.softmax(tl_[0, 0].masked_fill(~allowed[s0], float("-inf")).double(), -1)
    counts = torch.bincount(out[:, 0], minlength=v)
    assert counts[p0 == 0].sum() == 0
    assert chi2_pvalue(counts, p0) > 1e-3, (counts.tolist(), p0.tolist())
    assert (chain[:, 0] == s0).all()


def test_forced_draft_and_miss() -> None:
    """A one-hot draft (forced token) is accepted with probability p(x); an unknown state on the
    chain stops verification there with flag 1 and no token sampled at that position."""
    b, k, v = 2, 2, 40
    g, table, states, drafts, allowed, trans = _setup(3, b, k, v, n_states=2)
    states = torch.tensor([0, 0], dtype=torch.int32)
    x0 = int(allowed[0].nonzero()[0])
    drafts = torch.tensor([[x0, x0], [x0, x0]])
    dl = torch.full((b, k, v), float("-inf"))
    dl[:, :, x0] = 0.0
    tl_ = torch.randn(b, k + 1, v, generator=g)
    tl_[1, 0] = -50.0
    tl_[1, 0, x0] = 50.0  # p(x0) ~ 1 on row 1: accepted
    table.add_transitions(torch.tensor([0]), torch.tensor([x0]), torch.tensor([7]))  # state 7 has no mask row
    out, cnt, chain, flags = (t.cpu() for t in verify_draft_ref(
        tl_.to(DEVICE), dl.to(DEVICE), drafts.to(DEVICE), table, states.to(DEVICE), seeds=torch.tensor([1, 2]).to(DEVICE)))
    assert flags[1] == 1 and cnt[1] == 1 and out[1, 0] == x0 and out[1, 1] == -1
    _walk_ok(out, cnt, states, allowed, trans)
