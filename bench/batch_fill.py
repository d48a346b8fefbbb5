"""Batch fill: one call fills the bitmask rows of a whole batch, constrain beside xgrammar.

    python3 bench/batch_fill.py --tokenizer llama3 --batches 64,256 --threads 16

Each row is a dev schema (JSONSchemaBench, those both engines compile; ``--schemas`` distinct ones,
cycled) fed its first valid instance token by token, as a model's output would arrive; at every step every row accepts
its next token, then one call fills every row's mask: constrain's ``BatchMatcher``, xgrammar's
``BatchGrammarMatcher`` (same threads). Reported: ms per batch fill (mean, p50, p99) over the
steps, every engine from fresh compiles (first visits of states count: a decode meets them).
Each distinct schema is compiled once per engine and batch (its rows share the compiled grammar,
as a server's requests of one schema would); xgrammar's compiles, which hold no state a matcher
adds to, are made once and serve every batch (with one thread, one Llama-3 compile took ~10 s).
Schemas are chosen by constrain's compile and xgrammar's grammar construction (no vocabulary
work); one that xgrammar then fails to compile is skipped.
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
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.compare import git_commit, machine
from constrain.testing.corpus import DEFAULT_DATA, expand_subsets, load_cases


def schemas_of(tok: Any, limit: int, distinct: int) -> list[tuple[dict, list[int]]]:
    """(schema, instance tokens) of up to ``distinct`` dev schemas that constrain compiles and
    xgrammar builds a grammar for."""
    import xgrammar as xgr

    from bench.engines import ADAPTERS

    ours = ADAPTERS["constrain"](tok)
    out = []
    for case in load_cases(DEFAULT_DATA, expand_subsets("jsb", DEFAULT_DATA), "dev")[:limit]:
        valid = [t for t in case.tests if t["valid"]]
        if not valid:
            continue
        try:
            ours.compile(case.schema)
            xgr.Grammar.from_json_schema(json.dumps(case.schema), any_whitespace=False, separators=(",", ":"))
            text = json.dumps(valid[0]["data"], separators=(",", ":"), ensure_ascii=False)
            ids = tok.encode(text)
        except Exception:
            continue
        out.append((case.schema, ids))
        if len(out) == distinct:
            break
    return out


def compile_all(engine: str, tok: Any, schemas: list[tuple[dict, list[int]]]) -> tuple[float, list[Any]]:
    """ms compiling every schema (a fresh compiler, one thread) and the compiled grammars (None
    where the engine failed)."""
    import constrain
    from bench.engines import ADAPTERS

    if engine == "constrain":
        constrain.set_default_compiler(constrain.GrammarCompiler())
    adapter = ADAPTERS[engine](tok)
    out = []
    t0 = time.perf_counter()
    for schema, _ in schemas:
        try:
            out.append(adapter.compile(schema))
        except Exception:
            out.append(None)
    return (time.perf_counter() - t0) * 1e3, out


def run(engine: str, tok: Any, rows: list[tuple[Any, list[int]]], threads: int) -> list[float]:
    """ms per batch fill at every step; ``rows``: (compiled grammar, instance tokens)."""
    import constrain

    matchers = [compiled.matcher().m for compiled, _ in rows]
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
    return times


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
    raw: dict[str, Any] = {}
    schemas = schemas_of(tok, args.limit, args.schemas)
    xgr_ms, xgr_compiled = compile_all("xgrammar", tok, schemas)
    keep = [i for i, c in enumerate(xgr_compiled) if c is not None]
    schemas, xgr_compiled = [schemas[i] for i in keep], [xgr_compiled[i] for i in keep]
    print(f"{len(schemas)} schemas; xgrammar compiled them in {xgr_ms / 1e3:.1f} s", flush=True)
    print("| batch | engine | steps | ms per fill: mean | p50 | p99 | mean vs xgrammar | compile ms (its schemas) | "
          "compile + every fill, s |\n|---|---|--:|--:|--:|--:|--:|--:|--:|")
    for b in (int(x) for x in args.batches.split(",")):
        ours_ms, ours_compiled = compile_all("constrain", tok, schemas)
        compile_ms = {"xgrammar": xgr_ms, "constrain": ours_ms}
        compiled = {"xgrammar": xgr_compiled, "constrain": ours_compiled}
        runs = {e: run(e, tok, [(compiled[e][i % len(schemas)], schemas[i % len(schemas)][1]) for i in range(b)],
                       args.threads) for e in ("xgrammar", "constrain")}
        got = {e: np.array(t) for e, t in runs.items()}
        for e, t in got.items():
            ratio = t.mean() / got["xgrammar"].mean()
            print(f"| {b} | {e} | {len(t)} | {t.mean():.2f} | {np.median(t):.2f} | {np.percentile(t, 99):.2f} | "
                  f"{ratio:.2f}x | {compile_ms[e]:.0f} | {(compile_ms[e] + t.sum()) / 1e3:.2f} |", flush=True)
            raw[f"{e}/{b}"] = {"compile_ms": compile_ms[e], "fill_ms": t.tolist()}
    if args.out:
        args.out.write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
