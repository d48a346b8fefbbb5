"""Batch fill: one call fills the bitmask rows of a whole batch, constrain beside xgrammar.

    python3 bench/batch_fill.py --tokenizer llama3 --batches 64,256 --threads 16

Each row is a dev schema (JSONSchemaBench, those both engines compile; ``--schemas`` distinct ones,
cycled) fed its first valid instance token by token, as a model's output would arrive; at every step every row accepts
its next token, then one call fills every row's mask: constrain's ``BatchMatcher``, xgrammar's
``BatchGrammarMatcher`` (same threads). Reported: ms per batch fill (mean, p50, p99) over the
steps, every engine from fresh compiles (first visits of states count: a decode meets them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compare import git_commit, machine
from constrain.testing.corpus import DEFAULT_DATA, expand_subsets, load_cases


def rows_of(tok: Any, batch: int, limit: int, distinct: int) -> list[tuple[dict, list[int]]]:
    """(schema, instance tokens) for ``batch`` rows: ``distinct`` schemas (or fewer, if fewer
    compile in both engines), cycled."""
    from bench.engines import ADAPTERS

    engines = [ADAPTERS[e](tok) for e in ("constrain", "xgrammar")]
    out = []
    for case in load_cases(DEFAULT_DATA, expand_subsets("jsb", DEFAULT_DATA), "dev")[:limit]:
        valid = [t for t in case.tests if t["valid"]]
        if not valid:
            continue
        try:
            for e in engines:
                e.compile(case.schema)
            text = json.dumps(valid[0]["data"], separators=(",", ":"), ensure_ascii=False)
            ids = tok.encode(text)
        except Exception:
            continue
        out.append((case.schema, ids))
        if len(out) == min(batch, distinct):
            break
    return [out[i % len(out)] for i in range(batch)]


def run(engine: str, tok: Any, rows: list[tuple[dict, list[int]]], threads: int) -> tuple[float, list[float]]:
    """ms compiling the rows' schemas (fresh compiler, one thread) and ms per batch fill at every step."""
    import constrain
    from bench.engines import ADAPTERS

    if engine == "constrain":
        constrain.set_default_compiler(constrain.GrammarCompiler())
    adapter = ADAPTERS[engine](tok)
    t0 = time.perf_counter()
    matchers = [adapter.compile(schema).matcher().m for schema, _ in rows]
    compile_ms = (time.perf_counter() - t0) * 1e3
    n_words = (tok.vocab_size + 31) // 32
    bitmask = constrain.allocate_token_bitmask(len(rows), n_words * 32)
    if engine == "constrain":
        batch = constrain.BatchMatcher(threads)
        fill = lambda: batch.batch_fill_next_token_bitmask(matchers, bitmask)
    else:
        import xgrammar as xgr

        xbatch = xgr.BatchGrammarMatcher(threads)
        fill = lambda: xbatch.batch_fill_next_token_bitmask(matchers, bitmask)
    times = []
    for step in range(max(len(ids) for _, ids in rows)):
        for m, (_, ids) in zip(matchers, rows):
            if step and step - 1 < len(ids):
                m.accept_token(ids[step - 1])
        t0 = time.perf_counter()
        fill()
        times.append((time.perf_counter() - t0) * 1e3)
    return compile_ms, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="llama3")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--limit", type=int, default=1200, help="dev schemas to draw rows from")
    ap.add_argument("--schemas", type=int, default=32,
                    help="distinct schemas, cycled over the rows (rows of one schema share its compiled grammar)")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every step's time")
    args = ap.parse_args()
    from bench.tok import load

    tok = load(args.tokenizer)
    print(f"commit {git_commit()}, {machine()}, tokenizer {args.tokenizer}, {args.threads} threads", flush=True)
    print("| batch | engine | steps | ms per fill: mean | p50 | p99 | mean vs xgrammar | compile ms (all rows) | "
          "compile + every fill, s |\n|---|---|--:|--:|--:|--:|--:|--:|--:|")
    raw: dict[str, Any] = {}
    for b in (int(x) for x in args.batches.split(",")):
        rows = rows_of(tok, b, args.limit, args.schemas)
        runs = {e: run(e, tok, rows, args.threads) for e in ("xgrammar", "constrain")}
        got = {e: np.array(t) for e, (_, t) in runs.items()}
        for e, t in got.items():
            compile_ms = runs[e][0]
            ratio = t.mean() / got["xgrammar"].mean()
            print(f"| {b} | {e} | {len(t)} | {t.mean():.2f} | {np.median(t):.2f} | {np.percentile(t, 99):.2f} | "
                  f"{ratio:.2f}x | {compile_ms:.0f} | {(compile_ms + t.sum()) / 1e3:.2f} |", flush=True)
            raw[f"{e}/{b}"] = {"compile_ms": compile_ms, "fill_ms": t.tolist()}
    if args.out:
        args.out.write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
