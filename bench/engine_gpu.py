"""End-to-end engine throughput: tokens/s at several batch sizes, unconstrained vs constrained.

Why: the design promise is constrained decoding at (nearly) the speed of unconstrained decoding.
This measures the whole engine loop (ragged forward over the slot KV cache, host-side matcher
masks, fused masked sampling, accept, forced tokens) against the same loop with no constraint,
and against the bare model forward, on the same model and prompts.

Usage (GPU machine; ``--random-weights`` when only the config and tokenizer can be carried):
    python3 bench/engine_gpu.py --model .bench_model --random-weights --device cuda \
        --batches 1,16,64,256 --max-tokens 128 --out $OUT/engine_gpu.json

``--suite graph`` runs the CUDA-graph decode loop instead, for unconstrained, constrain and the
anchors in the same loop, then the public ``Engine.run`` against that bare loop on the same
requests, on SmolLM2-135M-Instruct (real weights: its GGUF, or ``--random-weights`` with a folder)
and a Llama-3-8B-shaped model with random weights (bench/engine_graph.py):
    python3 bench/engine_gpu.py --prepare ../shared/data --data .bench_data   # here, once
    python3 bench/engine_gpu.py --suite graph --model SmolLM2-135M-Instruct.Q4_1.gguf --data .bench_data \
        --batches 1,16,64,256 --max-tokens 64 --out $OUT/engine_graph.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent.parent))

from constrain.engine.api import Engine, Request
from constrain.engine.model import LoadedModel
from constrain.engine.runner import ModelRunner

SCHEMA = {
    "type": "object",
    "properties": {
        "invoice_number": {"type": "string", "maxLength": 16},
        "vendor": {"type": "string", "maxLength": 24},
        "currency": {"type": "string", "pattern": "^(EUR|USD|GBP)$"},
        "paid": {"type": "boolean"},
        "lines": {"type": "array", "maxItems": 3, "items": {
            "type": "object",
            "properties": {"item": {"type": "string", "maxLength": 16}, "qty": {"type": "integer", "minimum": 1}},
            "required": ["item", "qty"], "additionalProperties": False}},
        "total": {"type": "number", "minimum": 0},
    },
    "required": ["invoice_number", "vendor", "currency", "paid", "lines", "total"],
    "additionalProperties": False,
}
TEXT = "Invoice INV-{i:04d} from ACME Tools Ltd: 3 hammers and {i} nails, total {i}.50 EUR, paid."


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def model_only(loaded: LoadedModel, batch: int, steps: int, prompt_len: int, device: str) -> float:
    """Bare decode steps (ragged extend of one token per row, argmax): the engine's floor."""
    runner = ModelRunner(loaded.model, batch, prompt_len + steps + 8)
    runner.extend(0, [[1] * prompt_len] * batch, [0] * batch)
    sync(device)
    t0 = time.perf_counter()
    tok = [[1]] * batch
    for s in range(steps):
        logits = runner.extend(0, tok, [prompt_len + s] * batch)
        tok = [[int(t)] for t in logits.argmax(-1).tolist()]
    sync(device)
    return batch * steps / (time.perf_counter() - t0)


def requests(mode: str, batch: int, max_tokens: int) -> list[Request]:
    out = []
    for i in range(batch):
        prompt = "Extract the invoice as JSON. " + TEXT.format(i=i)
        if mode == "unconstrained":
            out.append(Request(prompt, max_tokens=max_tokens, stop_token_ids=[]))  # always full length
        elif mode == "json_schema":
            out.append(Request(prompt, json_schema=SCHEMA, max_tokens=max_tokens))
        else:  # mixed: a third each of schema, regex and choices
            kind = i % 3
            out.append(Request(prompt, json_schema=SCHEMA if kind == 0 else None,
                               regex=r"INV-\d{4}: [A-Za-z ]{1,40}, total \d{1,4}\.\d{2} (EUR|USD)" if kind == 1 else None,
                               choices=["paid", "unpaid", "partially paid"] if kind == 2 else None,
                               max_tokens=max_tokens))
    return out


def run_one(engine: Engine, mode: str, batch: int, max_tokens: int, device: str) -> dict:
    reqs = requests(mode, batch, max_tokens)
    engine.max_batch = batch
    sync(device)
    t0 = time.perf_counter()
    results = engine.run(reqs)
    sync(device)
    wall = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) + (r.finish_reason == "stop") for r in results)
    forced = sum(r.forced_tokens for r in results)
    return {
        "mode": mode, "batch": batch, "wall_s": round(wall, 3), "tokens": tokens, "forced": forced,
        "tok_per_s": round(tokens / wall, 1),
        "stop": sum(r.finish_reason == "stop" for r in results),
        "length": sum(r.finish_reason == "length" for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--modes", default="unconstrained,json_schema,mixed")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument("--suite", choices=("eager", "graph"), default="eager",
                    help="graph: CUDA-graph decode loop, all engines, two models (bench/engine_graph.py)")
    ap.add_argument("--models", default="smollm2,llama8b", help="graph suite: smollm2 and/or llama8b")
    ap.add_argument("--data", default=".bench_data", help="graph suite: folder written by --prepare")
    ap.add_argument("--tiny", action="store_true", help="graph suite: 2-layer Llama-3 stand-in (CPU smoke test)")
    ap.add_argument("--hf-baseline", action="store_true", help="graph suite: also HF generate + xgrammar")
    ap.add_argument("--sweeps", type=int, default=3,
                    help="graph suite: runs of every cell, constrain's grammars compiled afresh each (medians reported)")
    ap.add_argument("--prepare", default=None, metavar="DATA_DIR",
                    help="write --data (schemas from DATA_DIR/jsonschemabench, Llama-3 tokenizer) and exit")
    args = ap.parse_args()
    if args.prepare or args.suite == "graph":
        from bench import engine_graph

        if args.prepare:
            engine_graph.prepare(Path(args.data), Path(args.prepare))
            return
        if args.modes == "unconstrained,json_schema,mixed":
            args.modes = "none,constrain,constrain_defaults,constrain_host,xgrammar,llguidance"
        engine_graph.run_suite(args)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    from bench.engine_graph import smol

    loaded = smol(args.model, args.device, args.random_weights)
    engine = Engine(loaded, max_batch=max(int(b) for b in args.batches.split(",")))
    print(f"loaded {loaded.name} on {loaded.device} in {time.perf_counter() - t0:.1f} s", flush=True)
    modes = args.modes.split(",")
    for mode in modes:  # warm-up: kernel JIT, cuBLAS handles, first masks of each constraint
        run_one(engine, mode, 4, 8, args.device)
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        base = model_only(loaded, b, 32, 64, args.device)
        rows.append({"mode": "model_only", "batch": b, "tok_per_s": round(base, 1)})
        print(json.dumps(rows[-1]), flush=True)
        for mode in modes:
            rows.append(run_one(engine, mode, b, args.max_tokens, args.device))
            print(json.dumps(rows[-1]), flush=True)
    meta = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "torch": torch.__version__, "max_tokens": args.max_tokens, "random_weights": args.random_weights,
        "date": time.strftime("%Y-%m-%d"),
    }
    print("\n| batch | " + " | ".join(["model only"] + modes) + " |")
    print("|---" * (len(modes) + 2) + "|")
    for b in sorted({r["batch"] for r in rows}):
        cells = [next(r["tok_per_s"] for r in rows if r["batch"] == b and r["mode"] == m) for m in ["model_only"] + modes]
        print(f"| {b} | " + " | ".join(str(c) for c in cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
