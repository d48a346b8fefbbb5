"""Where compile time goes: JSON Schema -> IR, IR -> token automaton, first mask, per schema.

    python3 bench/compile_breakdown.py --limit 20            # 20 dev schemas per subset, tekken

One process, caches cleared per schema; prints p50/mean/p90 of each part and its share.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parent.parent))
import constrain
from constrain import compiler, tokenizers
from constrain.grammars.json_schema import json_schema_to_grammar
from constrain.testing.corpus import JSB_SUBSETS, load_cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20, help="schemas per subset (dev half)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
    args = ap.parse_args()
    vocab = tokenizers.tekken()
    constrain.compile_json_schema({"type": "boolean"}, vocab)  # the vocabulary's trie, built once
    parts: dict[str, list[float]] = {"front end": [], "automaton": [], "first mask": []}
    for case in load_cases(Path(args.data), list(JSB_SUBSETS), "dev", limit=args.limit):
        try:
            t0 = time.perf_counter()
            grammar = json_schema_to_grammar(case.schema)
            t1 = time.perf_counter()
            compiled = compiler.compile_grammar(grammar, vocab)
            t2 = time.perf_counter()
            compiled.matcher().fill_next_token_bitmask(constrain.allocate_token_bitmask(1, vocab.vocab_size), 0)
            t3 = time.perf_counter()
        except Exception:
            continue
        for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
            parts[name].append(dt * 1e3)
    total = np.sum([parts[k] for k in parts], axis=0)
    print(f"{len(total)} schemas compiled; total p50 {np.median(total):.2f} ms, mean {total.mean():.2f} ms")
    for name, v in parts.items():
        a = np.array(v)
        print(f"{name:12s} p50 {np.median(a):7.2f} ms  mean {a.mean():7.2f}  p90 {np.percentile(a, 90):7.2f}  "
              f"share {a.sum() / total.sum():.0%}")


if __name__ == "__main__":
    main()
