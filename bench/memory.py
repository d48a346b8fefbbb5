"""Resident memory per compiled grammar, constrain beside the anchors, same tokenizer and schemas.

    python3 bench/memory.py --tokenizer tekken --limit 5          # 5 dev schemas per subset

Each engine runs in a process of its own (``--worker``): it loads the tokenizer and the engine,
compiles one warm-up schema (the per-vocabulary structures: token trie, shared walks), notes its
resident set, then compiles every schema and feeds each valid instance token by token with a mask
at every step (constrain's states, like any lazy engine's, exist once visited), keeping every
compiled grammar and matcher alive. Reported: the growth of the resident set per compiled grammar
(mean, and the largest single step), the peak, and what the engine says its grammars hold where it
says (constrain: ``GrammarCompiler.cache_bytes``; xgrammar: ``memory_size_bytes``). Schemas that
fail to compile in any engine are dropped for all, so every engine holds the same grammars.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench.compare import git_commit, machine
from constrain.testing.corpus import DEFAULT_DATA, expand_subsets, load_cases

ENGINES = ("constrain", "xgrammar", "llguidance")


def _rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _engine_bytes(engine: str) -> int | None:
    """What the engine itself accounts for its compiled grammars (None: not exposed through the adapter)."""
    if engine == "constrain":
        import constrain

        return int(constrain.get_default_compiler().cache_bytes)  # grammars, trie and shared walks
    return None


def worker(engine: str, tokenizer: str, cases_file: Path) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from bench.engines import ADAPTERS
    from bench.tok import load
    from bench.walk import Masks, check_instance

    tok = load(tokenizer)
    adapter = ADAPTERS[engine](tok)
    masks = Masks(tok)
    warm = adapter.compile({"type": "object", "properties": {"a": {"type": "string"}}})
    check_instance(warm, masks, tok.encode('{"a":"warm"}'))
    base = _rss_kib()
    cases = json.loads(cases_file.read_text())
    held: list[Any] = []  # every compiled grammar stays alive (and with it what its states cached)
    steps: list[int] = []
    ok: list[str] = []
    for case in cases:
        before = _rss_kib()
        try:
            compiled = adapter.compile(case["schema"])
        except Exception:
            continue
        for text in case["instances"]:
            check_instance(compiled, masks, tok.encode(text))
        held.append(compiled)
        steps.append(_rss_kib() - before)
        ok.append(case["id"])
        print(f"{engine}: {case['id']} +{steps[-1]} KiB", file=sys.stderr, flush=True)
    growth = _rss_kib() - base
    return {"engine": engine, "compiled": ok, "growth_kib": growth, "max_step_kib": max(steps, default=0),
            "peak_kib": _rss_kib("VmHWM"), "base_kib": base, "engine_bytes": _engine_bytes(engine)}


def run(engine: str, tokenizer: str, cases_file: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--worker", engine, "--tokenizer", tokenizer,
                          "--cases", str(cases_file)], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{engine} worker failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default="tekken")
    ap.add_argument("--limit", type=int, default=5, help="dev schemas per subset")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cases", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokenizer, args.cases)))
        return 0
    cases = load_cases(args.data, expand_subsets(None, args.data), split="dev", limit=args.limit)
    rows = [{"id": c.id, "schema": c.schema,
             "instances": [json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)
                           for t in c.tests if t["valid"]]} for c in cases]
    cases_file = Path("/tmp") / f"constrain-memory-{args.tokenizer}-{args.limit}.json"
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    cases_file.write_text(json.dumps(rows))
    results = {e: run(e, args.tokenizer, cases_file) for e in engines}
    common = set.intersection(*(set(r["compiled"]) for r in results.values()))
    if any(len(r["compiled"]) != len(common) for r in results.values()):  # the same grammars everywhere
        cases_file.write_text(json.dumps([r for r in rows if r["id"] in common]))
        results = {e: run(e, args.tokenizer, cases_file) for e in engines}
    n = len(common)
    print(f"{n} dev schemas ({args.limit} per subset) compiled by every engine, {args.tokenizer}, their valid "
          f"instances fed token by token; commit {git_commit()}; {machine()}\n")
    print("| engine | resident growth per grammar (mean) | largest one grammar | peak resident | engine's own count per grammar |")
    print("|---|--:|--:|--:|--:|")
    for e, r in results.items():
        own = f"{r['engine_bytes'] / n / 1024:.0f} KiB" if r["engine_bytes"] is not None and n else "-"
        print(f"| {e} | {r['growth_kib'] / max(n, 1):.0f} KiB | {r['max_step_kib']} KiB | "
              f"{r['peak_kib'] / 1024:.0f} MiB | {own} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
