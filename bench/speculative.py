"""Constraint-aware speculation: accepted length and speedup per drafter, at several batch sizes.

The extraction tasks of ``bench.extraction`` (JSONSchemaBench schemas, an instance rendered as
prose, greedy extraction under the schema) run through the public ``Engine`` once per
configuration: no speculation (the baseline), then each drafter (``forced``, ``lookup``,
``forced+lookup``) with drafts cut by the constraint's masks, and the lookup drafters with
*unmasked* drafts (a forbidden draft token is left to verification to reject), on the same
prompts, and ``forced+lookup fixed``: every row verifies up to ``max_draft`` lookup tokens
whatever its acceptance rate (the default adapts it per row). At batch b the items run in groups
of b requests (one ``Engine.run`` each), so the batch is b at the start of each group and shrinks
as rows finish.

Every configuration starts from the same constraint state, as a user with new schemas would
meet it: the compiler's caches cleared (compiled grammars with their per-state masks and
transitions, shared walks; the vocabulary's trie then rebuilt by compiling a held-out schema)
and, on the graph backend, a fresh GPU state table. What is not about constraints stays warm
and shared, as in a serving process: the loaded model, the KV cache, and the CUDA graphs, which
the warm-up captures by running every configuration once on held-out items before any is timed
(capturing one inside a timed run costs more than many steps). Before, the baseline ran first
and paid every grammar compile and first visit of a state for the configurations after it.
With ``--caches warm`` each configuration first runs the same requests once, untimed, from that
cold start: the timing then holds decoding alone, as in a server whose schemas it has seen
(compiled, their states' masks and transitions cached, the GPU table filled).

Columns: tokens/s (emitted tokens over wall time, forced text included), speedup over the
baseline at the same batch, mean accepted length (tokens emitted per decode step of a request:
1.0 plus forced text for the baseline), draft tokens proposed per request and the share the
target accepted, scheduler steps, the share of the wall time spent drafting on the host
(``step_clock``), outputs token-identical to the baseline's (greedy speculation is exact up to
the numerics of a several-token forward against a one-token one), and schema-valid outputs.
The log line of each run adds the steps that drafted, the mean wall time of those and of the
others (prefills included), and the CUDA graphs captured inside the timing.

    python3 -m bench.speculative --smoke                                  # CPU, tiny (a check)
    python3 -m bench.speculative --device cuda --model SmolLM2-135M-Instruct.Q4_1.gguf   # H200
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from bench.extraction import DEFAULT_SUBSETS, Item, compiles, configurations, load_items, score

DRAFTERS = ("none", "forced", "lookup", "forced+lookup", "forced+lookup fixed", "lookup unmasked",
            "forced+lookup unmasked")
HEADER = ("| drafter | batch | caches | tokens/s | speedup | accepted length | drafts/request | accepted | "
          "steps | drafting | same as baseline | schema-valid |\n|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")


def config(name: str, max_draft: int) -> Any:
    """The ``Engine.speculative`` value of a configuration name (None for the baseline)."""
    from constrain.engine.speculative import SpeculativeConfig

    if name == "none":
        return None
    drafters, _, variant = name.partition(" ")
    return SpeculativeConfig(drafters=tuple(drafters.split("+")), max_draft=max_draft,
                             mask_drafts=variant != "unmasked", adaptive=variant != "fixed")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_groups(engine: Any, items: Sequence[Item], batch: int, max_tokens: int, device: str) -> tuple[list[Any], float]:
    """All items in groups of ``batch`` requests; (results in item order, wall seconds)."""
    from constrain.engine.api import Request

    reqs = [Request(it.prompt, json_schema=it.schema, max_tokens=max_tokens) for it in items]
    engine.max_batch = batch
    results: list[Any] = []
    sync(device)
    t0 = time.perf_counter()
    for i in range(0, len(reqs), batch):
        results += engine.run(reqs[i:i + batch])
    sync(device)
    return results, time.perf_counter() - t0


def cold_start(engine: Any, name: str, args: argparse.Namespace, held_out: Item) -> None:
    """Drop every constraint cache a configuration could inherit from the ones before (see the
    module docstring) and set ``name``'s drafting; the trie comes back with ``held_out``'s
    compile, the GPU state table's sample graphs are captured again outside the timing."""
    from constrain import get_default_compiler
    from constrain.engine.graph_loop import GraphStep

    get_default_compiler().clear()
    step = engine._step  # the step backend: its state table caches states of grammars compiled before
    if isinstance(step, GraphStep):
        engine._step = GraphStep(step.runner, engine.vocab.vocab_size)
        engine._step.capture()
    compiles(engine, held_out, {"constrain": configurations()["constrain, defaults"]})
    engine.speculative = config(name, args.max_draft)


@contextmanager
def step_clock() -> Iterator[dict[str, float]]:
    """Scheduler steps taken and host seconds spent drafting (``Scheduler._draft_all``: the walk
    along the drafts, their masks, the drafters) while the block runs: the drafting is host work
    before each speculative forward, with the GPU idle, so its share of the wall time is what
    the host costs speculation at that batch."""
    from constrain.engine.scheduler import Scheduler

    clock = {"steps": 0, "drafting_s": 0.0, "drafted": 0, "drafted_s": 0.0, "plain_s": 0.0}
    step, draft_all = Scheduler.step, Scheduler._draft_all

    def counted(self: Any) -> Any:
        clock["steps"] += 1
        drafted, t0 = clock["drafted"], time.perf_counter()
        try:
            return step(self)
        finally:
            kind = "drafted_s" if clock["drafted"] > drafted else "plain_s"
            clock[kind] += time.perf_counter() - t0

    def timed(self: Any, batch: Any) -> Any:
        clock["drafted"] += 1
        t0 = time.perf_counter()
        try:
            return draft_all(self, batch)
        finally:
            clock["drafting_s"] += time.perf_counter() - t0

    Scheduler.step, Scheduler._draft_all = counted, timed  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        Scheduler.step, Scheduler._draft_all = step, draft_all  # type: ignore[method-assign]


def measure(engine: Any, name: str, items: Sequence[Item], batch: int, args: argparse.Namespace) -> dict[str, Any]:
    profile = f"{name}@{batch}" in args.profile.split(",")
    prof = cProfile.Profile() if profile else None
    captures = getattr(getattr(engine._step, "runner", None), "captures", 0)
    with step_clock() as clock:
        if prof is not None:
            prof.enable()
        results, wall = run_groups(engine, items, batch, args.max_tokens, args.device)
        if prof is not None:
            prof.disable()
            print(f"profile of {name} at batch {batch} (wall {wall:.2f} s, with the profiler's overhead):", file=sys.stderr)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile_top)
    tokens = sum(len(r.token_ids) for r in results)
    steps = sum(r.steps for r in results)
    proposed = sum(r.draft_tokens for r in results)
    accepted = sum(r.accepted_draft_tokens for r in results)
    ids = [r.token_ids for r in results]
    row = {
        "drafter": name, "batch": batch, "items": len(items), "tokens": tokens, "wall_s": round(wall, 3),
        "tok_per_s": tokens / wall, "accepted_length": tokens / max(steps, 1),
        "drafts_per_request": proposed / len(items), "acceptance": accepted / max(proposed, 1),
        "valid": sum(score(it, r.text, r.finish_reason)["valid"] for it, r in zip(items, results)),
        "steps": clock["steps"], "drafting_share": clock["drafting_s"] / wall, "ids": ids,
        "captures": getattr(getattr(engine._step, "runner", None), "captures", 0) - captures,
        "drafted_steps": clock["drafted"], "ms_per_drafted_step": 1e3 * clock["drafted_s"] / max(clock["drafted"], 1),
        "ms_per_plain_step": 1e3 * clock["plain_s"] / max(clock["steps"] - clock["drafted"], 1),
    }
    return row


def compare(row: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Speedup and token-identical outputs of ``row`` against the baseline at its batch."""
    row["speedup"] = row["tok_per_s"] / baseline["tok_per_s"]
    row["same"] = sum(a == b for a, b in zip(row["ids"], baseline["ids"]))


def table_row(r: dict[str, Any]) -> str:
    acc = f"{100 * r['acceptance']:.0f}%" if r["drafter"] != "none" else "-"
    tps = f"{r['tok_per_s']:.0f}" if r["tok_per_s"] >= 10 else f"{r['tok_per_s']:.2f}"
    return (f"| {r['drafter']} | {r['batch']} | {r['caches']} | {tps} | {r['speedup']:.2f}x | "
            f"{r['accepted_length']:.2f} | {r['drafts_per_request']:.1f} | {acc} | {r['steps']} | "
            f"{100 * r['drafting_share']:.0f}% | {r['same']}/{r['items']} | "
            f"{r['valid']}/{r['items']} |")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="model folder or .gguf (default: the SmolLM2-135M-Instruct demo)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="auto", choices=("auto", "graph", "eager"))
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--groups", type=int, default=16, help="groups of `batch` requests at batch 1; larger "
                   "batches run max(64 // batch, 2) groups")
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                   help="one untimed group per configuration first (CUDA graphs, Triton kernels)")
    p.add_argument("--drafters", default=",".join(DRAFTERS), help=f"comma-separated, of {DRAFTERS}")
    p.add_argument("--caches", default="cold", help="cold: each configuration starts with empty constraint "
                   "caches (new schemas: compiles and first visits of states inside the timing); warm: after one "
                   "untimed run of the same requests (schemas a server has seen); cold,warm: both")
    p.add_argument("--profile", default="", help="comma-separated drafter@batch runs to profile (cProfile, "
                   "top functions by own time to stderr), e.g. none@32,forced+lookup@32")
    p.add_argument("--profile-top", type=int, default=30)
    p.add_argument("--max-draft", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--subsets", default=DEFAULT_SUBSETS)
    p.add_argument("--smoke", action="store_true", help="tiny settings for a CPU check: batches 1,2, one group "
                   "each, 24 tokens, no warm-up")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.groups, args.max_tokens, args.warmup = "1,2", 1, 24, False
    batches = [int(b) for b in args.batches.split(",")]
    names = [n.strip() for n in args.drafters.split(",") if n.strip()]
    if "none" not in names:  # the baseline (anywhere in the list: every configuration starts cold)
        names.insert(0, "none")

    from constrain.engine.api import Engine

    engine = Engine.from_pretrained(args.model, device=args.device, max_batch=max(batches), backend=args.backend)
    per_batch = {b: b * (args.groups if b == 1 or args.smoke else max(64 // b, 2)) for b in batches}
    need = max(per_batch.values()) + max(batches)  # the last max(batches) are the warm-up's
    configs = {"constrain": configurations()["constrain, defaults"]}
    items: list[Item] = []
    for it in load_items([s.strip() for s in args.subsets.split(",") if s.strip()], 10 * need):
        if len(items) == need:
            break
        if compiles(engine, it, configs) and len(engine.loaded.encode_prompt(it.prompt)) + args.max_tokens < 2048:
            items.append(it)
    held_out, items = items[len(items) - max(batches):], items[: len(items) - max(batches)]
    print(f"{len(items)} extraction items (+{len(held_out)} for warm-up); model {engine.loaded.name} on {args.device} "
          f"({engine.backend}), greedy, max_tokens {args.max_tokens}, max_draft {args.max_draft}",
          file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for b in batches:
        subset = items[: per_batch[b]]
        if args.warmup:  # every configuration once, untimed: the CUDA graphs they use, kernels compiled;
            # with the longest prompt, so that no timed run reallocates the KV cache (and its graphs)
            warm = held_out[: b - 1] + [max(subset, key=lambda it: len(engine.loaded.encode_prompt(it.prompt)))]
            for name in names:
                engine.speculative = config(name, args.max_draft)
                run_groups(engine, warm, b, args.max_tokens, args.device)
        for caches in args.caches.split(","):
            at_b = []
            for name in names:
                cold_start(engine, name, args, held_out[-1])
                if caches == "warm":  # the same requests once, untimed: their schemas seen before
                    run_groups(engine, subset, b, args.max_tokens, args.device)
                at_b.append({**measure(engine, name, subset, b, args), "caches": caches})
                r = at_b[-1]
                print(f"{name} batch {b} {caches}: {r['wall_s']} s; {r['drafted_steps']}/{r['steps']} steps drafted, "
                      f"{r['ms_per_drafted_step']:.2f} ms each, the others {r['ms_per_plain_step']:.2f} ms; "
                      f"{r['captures']} CUDA graphs captured",
                      file=sys.stderr, flush=True)
            for row in at_b:
                compare(row, at_b[names.index("none")])
                print(table_row(row), file=sys.stderr, flush=True)
            rows += at_b
    print(HEADER)
    for row in rows:
        print(table_row(row))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump([{k: v for k, v in r.items() if k != "ids"} for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
