"""The C++ trie walks (constrain._core) against the numpy walks they twin: one state's transitions and
mask, and first mask / mask per new state on a JSONSchemaBench slice with either walker.

    python3 -m bench.native_walk [--schemas 20] [--steps 30]

Timings are the best of several rounds (the walk) or per-state means over random walks (masks);
each mode compiles in its own GrammarCompiler, so no cache carries over between them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from collections.abc import Callable

import numpy as np

import constrain
from constrain.compiler import GrammarCompiler
from constrain.testing.corpus import DEFAULT_DATA
from constrain.tokenizers import llama3, tekken
from constrain.walkers import NativeWalker, NumpyWalker

VOCABS = {"tekken": tekken, "llama3": llama3}


def best_us(fn: Callable[[], object], rounds: int = 9) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e6


def walk_row(name: str, vocab: constrain.Vocabulary) -> None:
    """One state's transitions and mask: a JSON string body (dense) and a literal's first byte (sparse)."""
    for label, pattern, prefix in (("string body", r'"[^"\\]*"', b'"'), ("literal", "true|false", b"")):
        auto = GrammarCompiler().compile_regex(pattern, vocab)._automaton
        state = auto.initial_state
        for byte in prefix:
            state = int(auto.table.row(state)[byte])
        py = NumpyWalker(auto.trie, auto.table, auto.n_words)
        native = NativeWalker(auto.trie, auto.table, auto.n_words)
        tokens, _ = py.transitions(state)  # fills the rows both walks read
        assert sorted(native.transitions(state)[0].tolist()) == sorted(tokens.tolist())
        assert np.array_equal(native.mask(state), py.mask(state))
        for what in ("transitions", "mask"):
            t_py = best_us(lambda: getattr(py, what)(state))
            t_c = best_us(lambda: getattr(native, what)(state))
            print(f"| {name} | {label} | {what} | {len(tokens):,} | {t_py:,.0f} | {t_c:,.1f} | {t_py / t_c:.1f}x |")


def schemas(count: int) -> list[dict]:
    with gzip.open(DEFAULT_DATA / "jsonschemabench" / "Github_easy.jsonl.gz", "rt") as lines:
        rows = [json.loads(line)["schema"] for line in lines]
    return rows[:: max(1, len(rows) // count)][:count]


def mask_row(name: str, vocab: constrain.Vocabulary, slice_: list[dict], steps: int) -> None:
    """First mask and mean mask per new state over random walks, with the numpy walker and the C++ one."""
    for native in (False, True):
        compiler, rng = GrammarCompiler(), random.Random(0)
        first, later = [], []
        for schema in slice_:
            try:
                compiled = compiler.compile_json_schema(schema, vocab)
            except constrain.GrammarError:
                continue
            auto = compiled._automaton
            if not native:
                auto.walker = NumpyWalker(auto.trie, auto.table, auto.n_words)
            state = compiled.initial_state
            t = time.perf_counter()
            compiled.state_mask(state)
            first.append(time.perf_counter() - t)
            for _ in range(steps):
                _, nexts = compiled.state_transitions(state)
                if not len(nexts):
                    break
                state = int(nexts[rng.randrange(len(nexts))])
                t = time.perf_counter()
                compiled.state_mask(state)
                later.append(time.perf_counter() - t)
        print(f"| {name} | {'C++' if native else 'numpy'} | {len(first)} | {np.median(first) * 1e3:.2f} | "
              f"{np.percentile(first, 99) * 1e3:.1f} | {np.mean(later) * 1e6:,.0f} | {np.percentile(later, 99) * 1e6:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    vocabs = {name: make() for name, make in VOCABS.items()}
    print("| vocabulary | state | walk | tokens allowed | numpy (µs) | C++ (µs) | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for name, vocab in vocabs.items():
        walk_row(name, vocab)
    slice_ = schemas(args.schemas)
    print(f"\nJSONSchemaBench Github_easy, {len(slice_)} schemas, random walks of {args.steps} tokens\n")
    print("| vocabulary | walk | compiled | first mask p50 (ms) | p99 (ms) | mask per state mean (µs) | p99 (µs) |")
    print("|---|---|---|---|---|---|---|")
    for name, vocab in vocabs.items():
        mask_row(name, vocab, slice_, args.steps)


if __name__ == "__main__":
    main()
