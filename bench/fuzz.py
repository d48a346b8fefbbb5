"""The long fuzz run: ``tests/test_fuzz.py``'s generators and checks (``constrain.testing.fuzz``) for
minutes or hours over the dev half of ../shared/data, in worker processes, with a report.

    python3 bench/fuzz.py --minutes 60 --jobs 4                  # the issue-11 run
    python3 bench/fuzz.py --kinds lark --seed 1 --cases 1        # replay one case (a test's failing seed)

Case ``seed`` of kind ``k`` is ``fuzz.generate(k, random.Random(seed), pool)``; seeds run upward from
``--seed``, kinds taken in turn. ``--vocabs`` alternates vocabularies over the cases ("byte": 256
single-byte tokens, every mask token checked; a ``constrain.tokenizers`` name: a sample checked).
A worker that outlives a case's watchdog by a margin (a hang in native code) is counted as a hang
and the pool is rebuilt. Writes ``<out>.json`` (counts and every failure with its seed) and
``<out>.md`` (the same, readable).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench import REPO_ROOT
from bench.compare import git_commit, machine
from constrain.testing import fuzz
from constrain.testing.corpus import DEFAULT_DATA

HARD_MARGIN_S = 240.0  # past the (CPU-time) watchdog by this much wall time, the worker itself is stuck
                       # (native code, a blocked wait); generous, since others may load the machine

_pool: list[Any] = []
_vocabs: dict[str, Any] = {}


def _init(data_dir: str) -> None:
    _pool[:] = fuzz.schema_pool(Path(data_dir))


def _vocab(name: str) -> Any:
    if name not in _vocabs:
        from constrain import tokenizers

        _vocabs[name] = fuzz.byte_vocabulary() if name == "byte" else getattr(tokenizers, name)()
    return _vocabs[name]


def run_one(kind: str, seed: int, vocab: str) -> list[dict[str, Any]]:
    """The failures of one case, each with what reproduces it."""
    rng = random.Random(seed)
    case = fuzz.generate(kind, rng, _pool)
    return [{**f.to_json(), "seed": seed, "vocab": vocab} for f in fuzz.check_case(case, _vocab(vocab), rng)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--cases", type=int, help="stop after this many cases (default: run until --minutes)")
    ap.add_argument("--seed", type=int, default=0, help="the first case's seed")
    ap.add_argument("--jobs", type=int, default=max(1, (mp.cpu_count() or 2) - 1))
    ap.add_argument("--kinds", default=",".join(fuzz.KINDS))
    ap.add_argument("--vocabs", default="byte,byte,tekken", help="vocabularies taken in turn over the cases")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, help="report path without suffix (default bench/results/fuzz-<stamp>)")
    args = ap.parse_args(argv)
    kinds = args.kinds.split(",")
    vocabs = args.vocabs.split(",")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO_ROOT / "bench" / "results" / f"fuzz-{stamp}"
    out.parent.mkdir(parents=True, exist_ok=True)

    deadline = time.monotonic() + 60 * args.minutes
    counts: collections.Counter = collections.Counter()
    failures: list[dict[str, Any]] = []
    seeds = iter(range(args.seed, args.seed + args.cases)) if args.cases else itertools.count(args.seed)
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(args.jobs, initializer=_init, initargs=(str(args.data),))
    running: dict[int, tuple[str, str, Any, float]] = {}
    exhausted = False
    started = time.monotonic()
    while True:
        while not exhausted and len(running) < 2 * args.jobs and time.monotonic() < deadline:
            seed = next(seeds, None)
            if seed is None:
                exhausted = True
                break
            kind, vocab = kinds[seed % len(kinds)], vocabs[seed % len(vocabs)]
            running[seed] = (kind, vocab, pool.apply_async(run_one, (kind, seed, vocab)), time.monotonic())
        if not running:
            break
        time.sleep(0.05)
        stuck = False
        for seed, (kind, vocab, result, t0) in list(running.items()):
            if result.ready():
                del running[seed]
                counts["cases"] += 1
                counts[f"cases_{kind}"] += 1
                counts[f"cases_{kind}_{vocab}"] += 1
                try:
                    found = result.get()
                except Exception as exc:  # the worker died (a segfault shows up here as a broken pool)
                    found = [{"property": "crash", "kind": kind, "seed": seed, "vocab": vocab,
                              "detail": f"worker failed: {type(exc).__name__}: {exc}"[:500]}]
                for f in found:
                    counts[f["property"]] += 1
                    failures.append(f)
            elif time.monotonic() - t0 > fuzz.WATCHDOG_S + HARD_MARGIN_S:
                stuck = True
        if stuck:  # a worker that no longer answers: every unfinished case of this pool counts
            for seed, (kind, vocab, _result, t0) in running.items():
                if time.monotonic() - t0 > fuzz.WATCHDOG_S + HARD_MARGIN_S:
                    counts["cases"] += 1
                    counts["hang"] += 1
                    failures.append({"property": "hang", "kind": kind, "seed": seed, "vocab": vocab,
                                     "detail": "the worker stopped answering (native code past the watchdog)"})
            pool.terminate()
            pool = ctx.Pool(args.jobs, initializer=_init, initargs=(str(args.data),))
            running.clear()
    pool.terminate()
    elapsed = time.monotonic() - started
    command = "python3 bench/fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {"date": stamp, "commit": git_commit(), "machine": machine(), "command": command,
              "seconds": round(elapsed, 1), "jobs": args.jobs, "counts": {p: counts[p] for p in ("cases", *fuzz.PROPERTIES, *fuzz.NOTES)},
              "cases_by_kind": {k: counts[f"cases_{k}"] for k in kinds},
              "cases_by_kind_vocab": {f"{k}/{v}": counts[f"cases_{k}_{v}"] for k in kinds for v in dict.fromkeys(vocabs)},
              "failures": failures}
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str))
    markdown = render(report)
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    print(f"(report: {out.with_suffix('.json')}, {out.with_suffix('.md')})")
    return 1 if any(counts[p] for p in fuzz.PROPERTIES) else 0


def render(report: dict[str, Any]) -> str:
    counts = report["counts"]
    lines = [f"### Fuzz run {report['date']}", "",
             f"commit `{report['commit']}`, {report['machine']}, {report['seconds']:.0f} s, {report['jobs']} jobs: "
             f"`{report['command']}`", "",
             "| cases | " + " | ".join(fuzz.PROPERTIES) + " |", "|" + "---|" * (1 + len(fuzz.PROPERTIES)),
             f"| {counts['cases']} | " + " | ".join(str(counts[p]) for p in fuzz.PROPERTIES) + " |", "",
             "Cases by kind: " + ", ".join(f"{k} {n}" for k, n in report["cases_by_kind"].items()),
             "(by kind and vocabulary: " + ", ".join(f"{k} {n}" for k, n in report.get("cases_by_kind_vocab", {}).items()) + ")", ""]
    notes = [f for f in report["failures"] if f["property"] in fuzz.NOTES]
    for note in fuzz.NOTES:  # not failures: a clear budget refusal in time, an oracle that cannot judge
        seen = [f for f in notes if f["property"] == note]
        if seen:
            lines += [f"Not failures, {note}: {len(seen)} (" + ", ".join(
                f"{f['kind']} {f['seed']} {f['vocab']}" for f in seen[:40]) + (", ..." if len(seen) > 40 else "") + ")", ""]
    for f in report["failures"]:
        if f["property"] in fuzz.NOTES:
            continue
        source = f.get("source")
        text = source if isinstance(source, str) else json.dumps(source, ensure_ascii=False)
        lines += [f"- **{f['property']}** {f['kind']} seed {f['seed']} ({f['vocab']}): {f['detail'][:300]}",
                  f"  replay: `python3 bench/fuzz.py --kinds {f['kind']} --vocabs {f['vocab']} --seed {f['seed']} --cases 1`",
                  "  ```", "  " + (text or "")[:1500].replace("\n", "\n  "), "  ```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
