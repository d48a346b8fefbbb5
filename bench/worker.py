"""One engine in its own process: `python3 -m bench.worker --engine NAME --tokenizer NAME`.

Protocol (one JSON object per line): the worker says {"ready": true, "version"} once its tokenizer
and engine are built (or {"ready": false, "error"}); then, for each case read on stdin, it answers
{"phase": "compiled", ...} as soon as the first mask is filled, and {"phase": "done", ...} after the
walks and instances. The parent times the first answer against the compile timeout and kills the
whole process on a hang. Engine output on fd 1 is sent to stderr so it cannot break the protocol.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

THREAD_ENV = {
    "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
}


def run_case(engine: Any, masks: Any, case: dict, args: argparse.Namespace, send: Any) -> None:
    from bench.walk import check_instance, judge_doc, random_walk
    from constrain.testing.corpus import make_checker

    t0 = time.perf_counter()
    try:
        compiled = engine.compile(case["schema"])
        masks.reset()
        compiled.matcher().fill(masks.bitmask)
    except Exception as e:
        send({"phase": "compiled", "ok": False, "s": time.perf_counter() - t0,
              "error": f"{type(e).__name__}: {str(e)[:500]}"})
        return
    send({"phase": "compiled", "ok": True, "s": time.perf_counter() - t0})

    check = make_checker(case["schema"], case["subset"].startswith("ts/"), Path(args.data))
    walks = []
    walk_ns: list[int] = []
    for w in range(args.walks):
        rng = random.Random(zlib.crc32(f"{args.seed}:{case['id']}:{w}".encode()))
        r = random_walk(compiled, masks, rng, max_tokens=args.max_tokens)
        walk_ns += r.pop("mask_ns")
        doc = r.pop("doc")
        if r["status"] == "finished":
            verdict, msg = judge_doc(doc, check)
            r["status"] = verdict if verdict != "valid" else "finished"
            if verdict != "valid":
                r["detail"] = msg
                r["doc"] = doc[:2000].decode("utf-8", "replace")
        walks.append(r)

    instances = []
    inst_ns: list[int] = []
    for t in case["tests"]:
        try:
            text = json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)
            ids = engine.tok.encode(text)
            if engine.tok.decode(ids) != text.encode("utf-8"):
                raise ValueError("tokenization does not round-trip")
        except Exception as e:  # lone surrogates and the like: not representable as UTF-8 text
            instances.append({"valid": t["valid"], "skipped": f"{type(e).__name__}: {str(e)[:100]}"})
            continue
        r = check_instance(compiled, masks, ids)
        inst_ns += r.pop("mask_ns")
        r.update(valid=t["valid"], ntok=len(ids))
        instances.append(r)
    send({"phase": "done", "walks": walks, "walk_mask_ns": walk_ns, "instances": instances,
          "inst_mask_ns": inst_ns})


def _exit_with_parent() -> None:
    """A worker whose driver died (killed, interrupted) must not keep a core busy on a hung compile."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--walks", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mem-gb", type=float, default=0)
    ap.add_argument("--freeze-heap", type=int, default=0, help="1: freeze the startup heap once ready")
    args = ap.parse_args()
    _exit_with_parent()

    os.environ.update(THREAD_ENV)
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    if args.mem_gb > 0:
        import resource

        limit = int(args.mem_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        import torch

        torch.set_num_threads(1)
        from bench.engines import ADAPTERS
        from bench.tok import load
        from bench.walk import Masks

        tok = load(args.tokenizer)
        engine = ADAPTERS[args.engine](tok)
        masks = Masks(tok)
    except Exception as e:
        send({"ready": False, "error": f"{type(e).__name__}: {str(e)[:500]}"})
        return
    if args.freeze_heap:  # as a server does once started (vLLM's freeze_gc_heap): collections skip it
        import gc

        gc.collect()
        gc.freeze()
    send({"ready": True, "version": ADAPTERS[args.engine].version()})

    for line in sys.stdin:
        if line.strip():
            run_case(engine, masks, json.loads(line), args, send)


if __name__ == "__main__":
    main()
