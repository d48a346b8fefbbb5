"""constrain vs xgrammar, llguidance and outlines-core, side by side, on one tokenizer and one slice.

    python3 bench/compare.py --tokenizer tekken --split dev --limit 20
    python3 bench/compare.py --subsets Github_easy,ts --engines llguidance,xgrammar --limit 5

Per engine: coverage, time to first mask, host mask time per token from seeded random constrained
walks (every finished document validated: a failure is UNSOUND), and the labelled instances fed
token by token (valid ones must be accepted, invalid ones rejected). Each engine runs in its own
worker process, one CPU thread, with a per-schema compile timeout. Raw per-schema results go to
bench/results/*.jsonl; the markdown table is printed and, with --write-benchmarks, appended to
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench import REPO_ROOT
from bench.engines import ADAPTERS, ENGINES
from bench.report import build_report
from bench.runner import run_engine
from bench.tok import TOKENIZERS
from constrain.testing.corpus import DEFAULT_DATA, expand_subsets, load_cases


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=("dev", "test", "all"), default="dev",
                    help="dev = even positions in each subset file, test = odd (default dev)")
    ap.add_argument("--subsets", default="all",
                    help="comma list: JSONSchemaBench subset names, 'jsb', 'ts' (all suite files), ts/<file>")
    ap.add_argument("--ts-optional", action="store_true", help="with 'ts', include the suite's optional/ files")
    ap.add_argument("--limit", type=int, default=None, help="at most N schemas per subset (file)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--tokenizer", choices=TOKENIZERS, default="tekken")
    ap.add_argument("--timeout", type=float, default=30.0, help="per-schema compile timeout, seconds")
    ap.add_argument("--test-timeout", type=float, default=120.0, help="per-schema walks+instances timeout")
    ap.add_argument("--walks", type=int, default=3, help="random walks per schema")
    ap.add_argument("--max-tokens", type=int, default=300, help="walk length cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="engines run at once (1 = cleanest timings)")
    ap.add_argument("--mem-gb", type=float, default=8.0, help="address-space limit per worker (0 = none)")
    ap.add_argument("--freeze-heap", action="store_true",
                    help="each worker freezes its startup heap (gc.freeze) before the first schema, as servers do "
                         "(vLLM's freeze_gc_heap): Python's full collections then walk only what came after")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=None, help="raw JSONL (default bench/results/<stamp>.jsonl)")
    ap.add_argument("--write-benchmarks", action="store_true", help="append the report to BENCHMARKS.md")
    ap.add_argument("--rereport", type=Path, default=None, metavar="JSONL",
                    help="run nothing: rebuild the report of an earlier run from its raw JSONL (and its .md header), "
                         "judging its failed walk documents again with the current validator")
    return ap.parse_args(argv)


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"`{' '.join(platform.uname())}`; CPU: {cpu}; {os.cpu_count()} cores visible"


def git_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()

    dirty = " (+ uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    return (git("rev-parse", "--short", "HEAD") or "?") + dirty


def append_benchmarks(report: str) -> None:
    path = REPO_ROOT / "BENCHMARKS.md"
    with open(path, "a", encoding="utf-8") as f:
        f.write(("\n" if path.exists() and path.stat().st_size else "# Benchmarks\n\n") + report)
    print(f"appended to {path}", file=sys.stderr)


def rereport(args: argparse.Namespace, command: str) -> int:
    """The report of an earlier run, its walk verdicts judged again (documents kept in the JSONL)."""
    from bench.walk import judge_doc
    from constrain.testing.corpus import make_checker

    recs = [json.loads(line) for line in args.rereport.read_text(encoding="utf-8").splitlines() if line.strip()]
    subsets = sorted({r["subset"] for r in recs})
    by_id = {c.id: c for c in load_cases(args.data, subsets, "all")}
    results, engines, changed = [], [], 0
    for r in recs:
        engine, case = r.pop("engine"), by_id[r["id"]]
        if engine not in engines:
            engines.append(engine)
        for w in r.get("walks", []):
            doc = w.get("doc")
            if doc is not None and len(doc.encode("utf-8")) < 2000:   # kept whole: judge again
                verdict, msg = judge_doc(doc.encode("utf-8"), make_checker(case.schema, case.is_suite, args.data))
                verdict = "finished" if verdict == "valid" else verdict
                if verdict != w["status"]:
                    changed += 1
                    w["status"], w["detail"] = verdict, msg
        results.append((engine, case, r))
    order = sorted(engines, key=lambda e: ENGINES.index(e))
    md = args.rereport.with_suffix(".md")
    head = md.read_text(encoding="utf-8").split("\n### ", 1)[0].rstrip("\n") + "\n" if md.exists() else ""
    head += (f"- report rebuilt by `{command}` at commit {git_commit()}; {changed} walk verdicts changed "
             f"by judging the documents again\n\n")
    report = head + build_report(order, results)
    print(report)
    args.rereport.with_suffix(".rereport.md").write_text(report, encoding="utf-8")
    if args.write_benchmarks:
        append_benchmarks(report)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python3 bench/compare.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.rereport:
        return rereport(args, command)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e!r}; known: {', '.join(ENGINES)}")
    subsets = expand_subsets(args.subsets, args.data, args.ts_optional)
    cases = load_cases(args.data, subsets, args.split, args.limit)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO_ROOT / "bench" / "results" / f"{stamp}-{args.tokenizer}-{args.split}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{len(cases)} schemas from {len(subsets)} subsets; engines {', '.join(engines)}; "
          f"tokenizer {args.tokenizer}; raw results -> {out}", file=sys.stderr)

    opts = {"tokenizer": args.tokenizer, "data": str(args.data), "walks": args.walks,
            "max_tokens": args.max_tokens, "seed": args.seed, "mem_gb": args.mem_gb, "freeze_heap": int(args.freeze_heap)}
    results: list[tuple[str, object, dict]] = []
    versions: dict[str, str] = {}
    lock = threading.Lock()
    t_start = time.time()
    load_start = os.getloadavg()[0]
    done: dict[str, int] = {e: 0 for e in engines}

    with open(out, "w", encoding="utf-8") as raw:
        def on_result(engine: str, case, rec: dict) -> None:
            with lock:
                results.append((engine, case, rec))
                raw.write(json.dumps({"engine": engine, "tokenizer": args.tokenizer, "id": case.id,
                                      "subset": case.subset, "index": case.index, **rec}) + "\n")
                raw.flush()
                done[engine] += 1
                if done[engine] % 25 == 0 or done[engine] == len(cases):
                    print(f"[{engine}] {done[engine]}/{len(cases)} ({time.time() - t_start:.0f}s)", file=sys.stderr)

        def one(engine: str) -> None:
            log = out.with_suffix(f".{engine}.log")
            versions[engine] = run_engine(engine, cases, opts, args.timeout, args.test_timeout, log, on_result)

        pending = list(engines)
        while pending:
            batch, pending = pending[: max(1, args.jobs)], pending[max(1, args.jobs):]
            threads = [threading.Thread(target=one, args=(e,)) for e in batch]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    elapsed = time.time() - t_start

    ran = [e for e in engines if versions.get(e)]
    skipped = [e for e in engines if not versions.get(e)]
    order = sorted(ran, key=lambda e: ENGINES.index(e))
    body = build_report(order, [r for r in results if r[0] in ran])
    head = (f"## {datetime.date.today().isoformat()}: {args.tokenizer}, split {args.split}, "
            f"{len(cases)} schemas{'' if args.limit is None else f' (--limit {args.limit} per subset)'}\n\n"
            f"- command: `{command}`\n- commit: {git_commit()}\n- machine: {machine()}\n"
            f"- engines: {', '.join(f'{e} {versions[e]}' for e in order)}"
            f"{'; not run (unavailable): ' + ', '.join(skipped) if skipped else ''}\n"
            f"- one CPU thread per engine, engines run {'one at a time' if args.jobs <= 1 else f'{args.jobs} at a time'}; "
            f"compile timeout {args.timeout:g} s (timeouts enter the compile percentiles at that value); "
            f"{args.walks} walks per schema, cap {args.max_tokens} tokens; wall time {elapsed:.0f} s\n"
            f"- load average (1 min) {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end (times are wall clock)\n"
            + "".join(f"- {e}: {ADAPTERS[e].options}\n" for e in order)
            + "- ratios in parentheses are engine / llguidance\n\n")
    report = head + body
    print(report)
    out.with_suffix(".md").write_text(report, encoding="utf-8")
    if args.write_benchmarks:
        append_benchmarks(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
