"""Decode step of the Llama-3-8B shape on the GPU: fused layer kernels vs plain torch glue vs the floor.

    python3 bench/decode_step_gpu.py --out $OUT/decode_step.json

Both variants are the same ``StaticDecoder.step`` replayed from CUDA graphs (``GraphRunner``);
"torch" runs the pure-torch twins of ``kernels.decode`` on the GPU (the glue before the fused
kernels: ~40 launches per layer), "fused" the Triton kernels (the four GEMMs plus four kernels per
layer). Random bf16 weights (the step's cost does not depend on their values), KV cache filled
with random values, every row attending ``length`` columns. The floor is the weight bytes over the
measured device-to-device copy bandwidth (``bench.engine_graph.physical_floor``). Also reported:
each kernel against its twin on the GPU at the model's shapes (max |diff|, share of elements that
differ at all), and how far the fused logits end up from the torch ones after 32 layers.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.engine_graph import LLAMA3_8B, physical_floor
from constrain.engine.graph_runner import GraphRunner
from constrain.kernels import decode as decode_module


def time_replays(runner: GraphRunner, rows: int, length: int, iters: int) -> float:
    """Median ms of one replayed forward step."""
    for _ in range(5):
        runner.forward(rows, length)
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        runner.forward(rows, length)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def kernel_checks(batches: list[int], length: int) -> list[dict]:
    """Each fused kernel vs its twin on the GPU, bf16, Llama-3-8B shapes."""
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

    cfg = LLAMA3_8B
    hid, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, inter = hid // nh, cfg["intermediate_size"]
    g = torch.Generator(device="cuda").manual_seed(2)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)

    def diff(a: torch.Tensor, b: torch.Tensor) -> dict:
        return {"max_abs_diff": float((a.float() - b.float()).abs().max()),
                "share_differing": round(float((a != b).float().mean()), 5)}

    rows = []
    for b in batches:
        h, d, w = rnd(b, hid), rnd(b, hid), rnd(hid)
        rows.append({"kernel": "add_rms_norm", "batch": b, **diff(add_rms_norm(h, d, w, 1e-5)[0],
                                                                  add_rms_norm_ref(h, d, w, 1e-5)[0])})
        qkv, cos, sin = rnd(b, (nh + 2 * nkv) * hd), rnd(b, hd), rnd(b, hd)
        cols = length + 1
        keys, values = rnd(b, nkv, cols, hd), rnd(b, nkv, cols, hd)
        pos = torch.randint(0, length, (b,), generator=g, device="cuda")
        flat = ((torch.arange(b, device="cuda").view(b, 1) * nkv + torch.arange(nkv, device="cuda")) * cols
                + pos.view(b, 1)).reshape(-1)
        k2, v2 = keys.clone(), values.clone()
        q1 = rope_store_kv(qkv, cos, sin, keys.view(-1, hd), values.view(-1, hd), flat, nh, nkv)
        q2 = rope_store_kv_ref(qkv, cos, sin, k2.view(-1, hd), v2.view(-1, hd), flat, nh, nkv)
        rows.append({"kernel": "rope_store_kv (q)", "batch": b, **diff(q1, q2)})
        # which rounding each side does: two products rounded to bf16 then a rounded sum, or one rounding
        qf = qkv[:, : nh * hd].view(b, nh, hd).float()
        x1, x2 = qf[..., : hd // 2], qf[..., hd // 2:]
        c, s_ = cos.float().view(b, 1, hd), sin.float().view(b, 1, hd)
        c1, c2, s1, s2 = c[..., : hd // 2], c[..., hd // 2:], s_[..., : hd // 2], s_[..., hd // 2:]

        def r(t: torch.Tensor) -> torch.Tensor:
            return t.to(torch.bfloat16).float()

        twice = torch.cat((r(r(x1 * c1) + r(-x2 * s1)), r(r(x2 * c2) + r(x1 * s2))), -1).to(torch.bfloat16)
        once = torch.cat((r(x1 * c1 - x2 * s1), r(x2 * c2 + x1 * s2)), -1).to(torch.bfloat16)
        rows.append({"kernel": "rope rounding", "batch": b, "kernel_vs_twice": diff(q1, twice)["share_differing"],
                     "kernel_vs_once": diff(q1, once)["share_differing"], "twin_vs_twice": diff(q2, twice)["share_differing"],
                     "twin_vs_once": diff(q2, once)["share_differing"]})
        rows.append({"kernel": "rope_store_kv (cache)", "batch": b, **diff(keys, k2)})
        pos_full = torch.full((b,), length - 1, device="cuda")
        rows.append({"kernel": "decode_attention", "batch": b, "length": length,
                     **diff(decode_attention(q1, keys, values, pos_full, length, hd ** -0.5),
                            decode_attention_ref(q1, keys, values, pos_full, length, hd ** -0.5))})
        gu = rnd(b, 2 * inter)
        rows.append({"kernel": "silu_mul", "batch": b, **diff(silu_mul(gu), silu_mul_ref(gu))})
    return rows


def filled_runner(model, batches: list[int], lengths: list[int], use_graphs: bool | None = None) -> GraphRunner:
    """A GraphRunner whose KV cache and input ids are the same random values on every call."""
    runner = GraphRunner(model, max(batches), max(lengths), use_graphs=use_graphs)
    g = torch.Generator(device="cuda").manual_seed(1)
    for buf in (*runner.runner.cache.keys, *runner.runner.cache.values):  # bf16 values, in any cache dtype
        buf.copy_(torch.randn(buf.shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16))
    runner.ids.copy_(torch.randint(0, 128000, runner.ids.shape, generator=g, device="cuda"))
    return runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--lengths", default="64,512")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--layers", type=int, default=LLAMA3_8B["num_hidden_layers"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.lengths.split(",")]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**dict(LLAMA3_8B, num_hidden_layers=args.layers)))
        model = model.to(torch.bfloat16).eval()
    rows: list[dict] = [{"model": "llama3-8b shape", "layers": args.layers, **physical_floor(model),
                         "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}]
    print(json.dumps(rows[0]), flush=True)

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    for row in kernel_checks(batches, max(lengths)):
        emit(row)
    fused_use = decode_module.use_triton
    logits: dict[tuple, torch.Tensor] = {}
    for variant in ("torch", "fused"):
        decode_module.use_triton = fused_use if variant == "fused" else (lambda t: False)
        runner = filled_runner(model, batches, lengths)
        for b in batches:
            for length in lengths:
                runner.pos.fill_(length - 1)
                runner.capture(b, [length])
                ms = time_replays(runner, b, length, args.iters)
                logits[(variant, b, length)] = runner.logits[:b].clone()
                emit({"variant": variant, "batch": b, "length": length, "step_ms": round(ms, 3),
                      "vs_floor": round(ms / rows[0]["floor_ms"], 3)})
        del runner
        torch.cuda.empty_cache()
    # A float32 copy of the same model, same inputs, run eagerly: how far each bf16 variant is from it.
    decode_module.use_triton = lambda t: False  # the reference runs the plain torch arithmetic
    ref_model = copy.deepcopy(model).float()
    runner = filled_runner(ref_model, batches, lengths, use_graphs=False)
    for b in batches:
        for length in lengths:
            runner.pos.fill_(length - 1)
            runner.forward(b, length)
            ref = runner.logits[:b].clone()
            row = {"check": "bf16 variants vs the float32 model", "batch": b, "length": length}
            for variant in ("torch", "fused"):
                got = logits[(variant, b, length)]
                row[f"{variant}_max_abs_err"] = round(float((got - ref).abs().max()), 4)
                row[f"{variant}_argmax_equal"] = f"{int((got.argmax(-1) == ref.argmax(-1)).sum())}/{b}"
            emit(row)
    del runner, ref_model
    decode_module.use_triton = fused_use
    for b in batches:
        for length in lengths:
            a, f = logits[("torch", b, length)], logits[("fused", b, length)]
            emit({"check": "fused vs torch logits", "batch": b, "length": length,
                  "max_abs_diff": float((a - f).abs().max()), "logit_scale": float(a.abs().max()),
                  "argmax_equal": f"{int((a.argmax(-1) == f.argmax(-1)).sum())}/{b}"})
    print("\n| batch | length | torch glue ms | fused ms | fused / floor |")
    print("|---|---|---|---|---|")
    for b in batches:
        for length in lengths:
            t, f = (next(r for r in rows if r.get("variant") == v and r.get("batch") == b and r.get("length") == length)
                    for v in ("torch", "fused"))
            print(f"| {b} | {length} | {t['step_ms']} | {f['step_ms']} | {f['vs_floor']}x |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
