"""H200 benchmark of kernels/: apply bitmask vs xgrammar, fused masked sampling vs torch, the full
constrained decode step (captured in a CUDA graph), speculative verification. Prints tables.

    python3 bench/kernels_gpu.py [--quick] [--json OUT.json]

Kernel time = median over replays of a CUDA graph holding several calls (rotating input buffers
so repeated calls do not just hit L2 where the inputs are large); "py" = wall time per call from
Python, launches included, synchronised once per 50 calls.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), ".."))

from constrain.kernels import StateTable, apply_token_bitmask_inplace, constrained_step, sample, verify_draft
from constrain.kernels.apply_bitmask import apply_token_bitmask_inplace_ref, unpack_bitmask
from constrain.kernels.sampling import sample_ref
from constrain.kernels.state_table import advance_ref

DEV = os.environ.get("BENCH_DEVICE", "cuda")
L2_BYTES = 60 << 20


def graph_time_us(fn, nbuf: int, reps: int = 30) -> float:
    """Median µs per call, from replays of a graph holding `max(nbuf, 10)` calls."""
    calls = max(nbuf, 10)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(min(calls, 3)):
            fn(i % nbuf)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i % nbuf)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0 / calls)
    ts.sort()
    del g
    return ts[len(ts) // 2]


def python_time_us(fn, nbuf: int, n: int = 50) -> float:
    for i in range(3):
        fn(i % nbuf)
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i % nbuf)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    return best


def nbuf_for(nbytes: int) -> int:
    return max(1, min(16, math.ceil(4 * L2_BYTES / max(nbytes, 1))))


def rand_bitmask(b: int, v: int, g: torch.Generator) -> torch.Tensor:
    w = (v + 31) // 32
    return torch.randint(-(2**31), 2**31 - 1, (b, w), dtype=torch.int32, device=DEV, generator=g)


# ----------------------------------------------------------------------------------------------
def check_correctness(g: torch.Generator) -> list[str]:
    """Compiled kernels against their twins on the GPU (twins run as torch CUDA ops)."""
    out = []
    for dt in (torch.float32, torch.bfloat16):
        for b, v, wv in ((3, 1000, 1000), (5, 32000, 32000), (4, 1030, 1000), (4, 997, 1100)):
            x = torch.randn(b, v, device=DEV, generator=g).to(dt)
            bm = rand_bitmask(b, wv, g)
            idx = torch.tensor([b - 1, 0], device=DEV)
            for ind in (None, idx):
                a, r = x.clone(), x.clone()
                apply_token_bitmask_inplace(a, bm, ind)
                apply_token_bitmask_inplace_ref(r, bm, ind)
                out.append(f"apply {dt} {b}x{v} w{wv} idx={ind is not None}: {'ok' if torch.equal(a, r) else 'MISMATCH'}")
    b, v = 64, 50000
    x = torch.randn(b, v, device=DEV, generator=g) * 3
    x[0, :100] = float("nan")
    x[1, 5] = float("inf")
    bm = rand_bitmask(8, v, g)
    mi = torch.randint(-1, 8, (b,), device=DEV, generator=g)
    seeds = torch.randint(0, 2**40, (b,), device=DEV, generator=g)
    t = torch.rand(b, device=DEV, generator=g) * 1.5
    t[::4] = 0
    kw = dict(temperature=t, top_k=torch.randint(0, 60, (b,), device=DEV, generator=g).int(),
              top_p=torch.rand(b, device=DEV, generator=g) * 0.5 + 0.6,
              min_p=torch.rand(b, device=DEV, generator=g) * 0.1, seeds=seeds)
    for name, extra in (("plain", dict(temperature=t, seeds=seeds)), ("filters", kw),
                        ("filters, top-k by candidates", dict(kw, max_top_k=60))):
        tk, fk = sample(x, bm, mi, **extra)
        tr, fr = sample_ref(x, bm, mi, **{k: a for k, a in extra.items() if k != "max_top_k"})
        allowed = unpack_bitmask(bm[mi.clamp(min=0)], v) | (mi < 0)[:, None]
        legal = bool(allowed.gather(1, tk.clamp(min=0)[:, None]).all())
        greedy_eq = bool(torch.equal(tk[t <= 0], tr[t <= 0]))
        agree = float((tk == tr).float().mean())
        out.append(f"sample {name}: greedy {'ok' if greedy_eq else 'MISMATCH'}, legal {legal}, "
                   f"same token as twin {agree:.3f}, flags {'ok' if torch.equal(fk, fr) else 'MISMATCH'}")
    table, states, _ = make_table(16, v, 64, g)
    st = states[torch.randint(0, 16, (b,), device=DEV, generator=g)]
    st[:3] = -1
    tok = torch.randint(0, v, (b,), device=DEV, generator=g)
    o1, m1 = table.advance(st, tok)
    o2, m2 = advance_ref(table.keys, table.values, table.present, st, tok.int())
    out.append(f"advance: {'ok' if torch.equal(o1, o2) and torch.equal(m1, m2) else 'MISMATCH'}")
    return out


def make_table(n_states: int, v: int, allowed_per_state: int, g: torch.Generator):
    """A table of n_states sparse masks; every allowed token has a transition to a random state."""
    w = (v + 31) // 32
    table = StateTable(w, device=DEV, state_capacity=n_states, transition_capacity=4 * n_states * allowed_per_state)
    toks = torch.stack([torch.randperm(v, device=DEV, generator=g)[:allowed_per_state] for _ in range(n_states)])
    rows = torch.zeros(n_states, w * 32, dtype=torch.bool, device=DEV)
    rows.scatter_(1, toks, True)
    words = (rows.view(n_states, w, 32).int() << torch.arange(32, device=DEV, dtype=torch.int32)).sum(-1)
    words = words.to(torch.int64).remainder(2**32)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    table.add_states(torch.arange(n_states), words)
    nxt = torch.randint(0, n_states, toks.shape, device=DEV, generator=g)
    src = torch.arange(n_states, device=DEV)[:, None].expand_as(toks)
    table.add_transitions(src.reshape(-1), toks.reshape(-1), nxt.reshape(-1))
    return table, torch.arange(n_states, device=DEV, dtype=torch.int32), toks


# ----------------------------------------------------------------------------------------------
def bench_apply(g, batches, vocabs, xgr_apply, rows):
    for v in vocabs:
        for b in batches:
            nbytes = b * v * 4
            nb = nbuf_for(nbytes)
            if nb * nbytes > 24 << 30:
                nb = 1
            logits = [torch.randn(b, v, device=DEV, generator=g) for _ in range(nb)]
            bm = rand_bitmask(b, v, g)
            ours = lambda i: apply_token_bitmask_inplace(logits[i], bm)
            r = dict(section="apply", batch=b, vocab=v, ours_graph=graph_time_us(ours, nb),
                     ours_py=python_time_us(ours, nb))
            if xgr_apply is not None:
                xg = lambda i: xgr_apply(logits[i], bm)
                r.update(xgr_graph=graph_time_us(xg, nb), xgr_py=python_time_us(xg, nb))
            r["floor_us"] = (b * v * 4 + bm.numel() * 4) / 4.2e12 * 1e6
            rows.append(r)
            print(json.dumps(r), flush=True)
            del logits


def bench_apply_sweep(g, rows):
    v = 131072
    for b in (1, 64, 4096):
        nbytes = b * v * 4
        nb = nbuf_for(nbytes)
        logits = [torch.randn(b, v, device=DEV, generator=g) for _ in range(nb)]
        bm = rand_bitmask(b, v, g)
        res = {}
        sparse = torch.where(torch.rand(bm.shape, device=DEV, generator=g) < 0.02, bm, torch.zeros_like(bm))
        for blk, nw, rm in ((1024, 4, True), (2048, 4, True), (4096, 8, True), (1024, 4, False), (2048, 4, False)):
            fn = lambda i: apply_token_bitmask_inplace(logits[i], bm, block=blk, num_warps=nw, read_mixed=rm)
            res[f"{blk}/{nw}/{'rw' if rm else 'w'}"] = graph_time_us(fn, nb)
            fn = lambda i: apply_token_bitmask_inplace(logits[i], sparse, block=blk, num_warps=nw, read_mixed=rm)
            res[f"sparse {blk}/{nw}/{'rw' if rm else 'w'}"] = graph_time_us(fn, nb)
        r = dict(section="apply_sweep", batch=b, vocab=v, **res)
        rows.append(r)
        print(json.dumps(r), flush=True)
        del logits


def torch_sample(logits, t, k=None, p=None):
    """vLLM-style torch sampling of the same parameters, no mask."""
    if k is not None or p is not None:
        ls, idx = logits.sort(dim=-1, descending=False)
        if k is not None:
            kth = ls.gather(1, (ls.shape[1] - k.long()).clamp(min=0)[:, None])
            ls = ls.masked_fill(ls < kth, float("-inf"))
        if p is not None:
            ps = ls.softmax(-1)
            cs = ps.cumsum(-1)
            m = cs <= 1 - p[:, None]
            m[:, -1] = False
            ls = ls.masked_fill(m, float("-inf"))
        logits = ls.scatter(-1, idx, ls)
    probs = torch.softmax(logits / t[:, None], dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def bench_sampling(g, batches, v, rows):
    for b in batches:
        nbytes = b * v * 4
        nb = nbuf_for(nbytes)
        if nb * nbytes > 16 << 30:
            nb = 1
        logits = [torch.randn(b, v, device=DEV, generator=g) * 2 for _ in range(nb)]
        masks = rand_bitmask(64, v, g)
        mi = torch.randint(0, 64, (b,), device=DEV, generator=g).int()
        t = torch.full((b,), 0.7, device=DEV)
        t0 = torch.zeros(b, device=DEV)
        k = torch.full((b,), 50, device=DEV, dtype=torch.int32)
        p = torch.full((b,), 0.9, device=DEV)
        seeds = torch.arange(b, device=DEV, dtype=torch.int64)
        modes = {
            "greedy": (lambda i: sample(logits[i], masks, mi, temperature=t0, seeds=seeds),
                       lambda i: logits[i].argmax(dim=-1),
                       lambda i: sample(logits[i], None, None, temperature=t0, seeds=seeds)),
            "temp": (lambda i: sample(logits[i], masks, mi, temperature=t, seeds=seeds),
                     lambda i: torch_sample(logits[i], t),
                     lambda i: sample(logits[i], None, None, temperature=t, seeds=seeds)),
            "topk50+topp0.9": (lambda i: sample(logits[i], masks, mi, temperature=t, top_k=k, top_p=p, seeds=seeds,
                                                max_top_k=50),
                               lambda i: torch_sample(logits[i], t, k, p),
                               lambda i: sample(logits[i], None, None, temperature=t, top_k=k, top_p=p, seeds=seeds,
                                                max_top_k=50)),
            "topk50+topp0.9 radix": (lambda i: sample(logits[i], masks, mi, temperature=t, top_k=k, top_p=p,
                                                      seeds=seeds),
                                     lambda i: torch_sample(logits[i], t, k, p),
                                     lambda i: sample(logits[i], None, None, temperature=t, top_k=k, top_p=p,
                                                      seeds=seeds)),
        }
        for name, (ours, ref, ours_nomask) in modes.items():
            r = dict(section="sample", mode=name, batch=b, vocab=v,
                     ours_masked_graph=graph_time_us(ours, nb), torch_unmasked_graph=graph_time_us(ref, nb),
                     ours_unmasked_graph=graph_time_us(ours_nomask, nb),
                     ours_masked_py=python_time_us(ours, nb), torch_unmasked_py=python_time_us(ref, nb))
            rows.append(r)
            print(json.dumps(r), flush=True)
        del logits


def bench_step(g, rows, b=256, v=131072):
    """Full constrained step (masked sample + advance) in a CUDA graph, checked against eager."""
    table, states0, toks = make_table(256, v, 512, g)
    nb = nbuf_for(b * v * 4)
    logits = [torch.randn(b, v, device=DEV, generator=g) * 2 for _ in range(nb)]
    st_in = states0[torch.randint(0, 256, (b,), device=DEV, generator=g)].clone()
    t = torch.full((b,), 1.0, device=DEV)
    seeds = torch.arange(b, device=DEV, dtype=torch.int64)
    outs = {}

    def step(i):
        outs[i] = constrained_step(logits[i], table, st_in, temperature=t, seeds=seeds)

    gt = graph_time_us(step, nb)
    pt = python_time_us(step, nb)
    # graph capture of a decode step: replay, compare with eager, check legality and advance
    gph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gph):
        cap = constrained_step(logits[0], table, st_in, temperature=t, seeds=seeds)
    gph.replay()
    torch.cuda.synchronize()
    eager = constrained_step(logits[0], table, st_in, temperature=t, seeds=seeds)
    same = all(torch.equal(a, c) for a, c in zip(cap, eager))
    tok, nxt, miss, flag = cap
    allowed = unpack_bitmask(table.masks[st_in.long()], v)
    legal = bool(allowed.gather(1, tok.clamp(min=0)[:, None]).all())
    r = dict(section="step", batch=b, vocab=v, graph_us=gt, py_us=pt, graph_equals_eager=same,
             legal=legal, misses=int(miss.sum()), floor_us=b * v * 4 / 4.2e12 * 1e6)
    # launch-shape sweep of the sampling stage (sparse table masks, and dense random masks)
    dense = rand_bitmask(256, v, g)
    for blk, nw in ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
        for name, mk in (("sparse", table.masks), ("dense", dense)):
            for mode, tt in (("temp", t), ("greedy", torch.zeros_like(t))):
                fn = lambda i: sample(logits[i], mk, st_in, temperature=tt, seeds=seeds, block=blk, num_warps=nw)
                r[f"{mode} {name} {blk}/{nw}"] = graph_time_us(fn, nb)
    rows.append(r)
    print(json.dumps(r), flush=True)


def bench_spec(g, rows, b=64, k=4, v=131072):
    table, states0, toks = make_table(64, v, 512, g)
    st = states0[torch.randint(0, 64, (b,), device=DEV, generator=g)]
    # drafts: allowed tokens along the chain (walk with the twin lookup)
    dt = torch.empty(b, k, dtype=torch.int64, device=DEV)
    s = st.clone()
    for i in range(k):
        pick = toks[s.long(), torch.randint(0, toks.shape[1], (b,), device=DEV, generator=g)]
        dt[:, i] = pick
        s, _ = advance_ref(table.keys, table.values, table.present, s, pick.int())
    tlog = torch.randn(b, k + 1, v, device=DEV, generator=g)
    dlog = tlog[:, :k] + 0.3 * torch.randn(b, k, v, device=DEV, generator=g)
    t = torch.ones(b, device=DEV)
    seeds = torch.arange(b, device=DEV, dtype=torch.int64)
    fn = lambda i: verify_draft(tlog, dlog, dt, table, st, temperature=t, seeds=seeds)
    out, n, chain, flags = fn(0)
    r = dict(section="spec", batch=b, k=k, vocab=v, graph_us=graph_time_us(fn, 1), py_us=python_time_us(fn, 1),
             mean_tokens=float(n.float().mean()), misses=int((flags == 1).sum()))
    rows.append(r)
    print(json.dumps(r), flush=True)


# ----------------------------------------------------------------------------------------------
def print_tables(rows):
    print("\n## apply_token_bitmask_inplace, fp32 logits, random 50% masks (µs)")
    print("| vocab | batch | ours graph | xgrammar graph | ratio | ours py | xgrammar py | HBM floor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["section"] == "apply":
            xg, xp = r.get("xgr_graph", float("nan")), r.get("xgr_py", float("nan"))
            print(f"| {r['vocab']} | {r['batch']} | {r['ours_graph']:.1f} | {xg:.1f} | {r['ours_graph'] / xg:.2f} | "
                  f"{r['ours_py']:.1f} | {xp:.1f} | {r['floor_us']:.1f} |")
    sw = [r for r in rows if r["section"] == "apply_sweep"]
    if sw:
        print("\n## apply sweep (BLOCK/num_warps, graph µs, vocab 131072)")
        keys = [k for k in sw[0] if "/" in k]
        print("| batch | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for r in sw:
            print(f"| {r['batch']} | " + " | ".join(f"{r[k]:.1f}" for k in keys) + " |")
    print("\n## sampling (µs): ours masked (mask table gather fused) vs torch unmasked, same parameters")
    print("| mode | batch | vocab | ours masked graph | torch unmasked graph | ratio | ours unmasked graph | ours masked py | torch py |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["section"] == "sample":
            print(f"| {r['mode']} | {r['batch']} | {r['vocab']} | {r['ours_masked_graph']:.1f} | "
                  f"{r['torch_unmasked_graph']:.1f} | {r['ours_masked_graph'] / r['torch_unmasked_graph']:.2f} | "
                  f"{r['ours_unmasked_graph']:.1f} | {r['ours_masked_py']:.1f} | {r['torch_unmasked_py']:.1f} |")
    for r in rows:
        if r["section"] == "step":
            print(f"\n## full constrained step (masked sample T=1 + advance), batch {r['batch']}, vocab {r['vocab']}: "
                  f"graph {r['graph_us']:.1f} µs, python {r['py_us']:.1f} µs, logits-read floor {r['floor_us']:.1f} µs; "
                  f"graph replay == eager: {r['graph_equals_eager']}, legal: {r['legal']}, misses: {r['misses']}")
            for k_, val in r.items():
                if "/" in k_:
                    print(f"  sample {k_}: {val:.1f} µs")
        if r["section"] == "spec":
            print(f"\n## speculative verify, batch {r['batch']}, k={r['k']}, vocab {r['vocab']}: graph {r['graph_us']:.1f} µs, "
                  f"python {r['py_us']:.1f} µs, mean tokens/row {r['mean_tokens']:.2f}, misses {r['misses']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default="check,sweep,apply,sample,step,spec")
    args = ap.parse_args()
    only = set(args.only.split(","))
    g = torch.Generator(device=DEV).manual_seed(0)
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__} "
          f"commit {os.environ.get('COMMIT', '?')}", flush=True)
    try:
        import xgrammar as xgr

        def xgr_apply(lg, bm):
            xgr.apply_token_bitmask_inplace(lg, bm)

        from importlib.metadata import version

        print("# xgrammar", version("xgrammar"), flush=True)
    except Exception as e:
        print("# xgrammar unavailable:", repr(e), flush=True)
        xgr_apply = None
    rows: list[dict] = []
    if "check" in only:
        for line in check_correctness(g):
            print("#", line, flush=True)
    batches = [1, 8, 64, 256, 512, 4096]
    vocabs = [32000, 131072, 151936, 262144]
    if args.quick:
        batches, vocabs = [1, 64, 4096], [131072]
    if "sweep" in only:
        bench_apply_sweep(g, rows)
    if "apply" in only:
        bench_apply(g, batches, vocabs, xgr_apply, rows)
    if "sample" in only:
        bench_sampling(g, [1, 64, 256, 4096], 131072, rows)
    if "step" in only:
        bench_step(g, rows)
    if "spec" in only:
        bench_spec(g, rows)
    print_tables(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
