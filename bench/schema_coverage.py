"""JSON Schema front-end coverage over JSONSchemaBench and the JSON Schema Test Suite.

For each schema: does it compile, is every valid instance accepted (serialized compactly with keys
in schema declaration order), is every instance that ``jsonschema`` rejects refused (soundness).
Prints per-subset rates and the most common failure reasons.

    python bench/schema_coverage.py                       # all JSONSchemaBench subsets
    python bench/schema_coverage.py --subset Github_easy --limit 200
    python bench/schema_coverage.py --suite               # JSON Schema Test Suite draft2020-12
    python bench/schema_coverage.py --unknown-format error --lenient

Defaults are json_schema_to_grammar's (unknown formats are ignored: they assert nothing). With
--suite, ``$ref``s to http://localhost:1234/ are served from the suite's remotes/ folder.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from constrain.testing.corpus import DEFAULT_DATA, JSB_SUBSETS, load_cases, suite_files, suite_remote
from constrain.testing.schema_check import OUTCOMES, check


def _reason(detail: str) -> str:
    """A failure message with its specifics (names, pointers, values) blanked, for counting."""
    text = re.sub(r"'[^']*'", "'…'", detail)
    text = re.sub(r"\bat #\S*", "at #…", text)
    text = re.sub(r"\d+", "N", text)
    return text[:140]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subset")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--suite", action="store_true", help="JSON Schema Test Suite instead of JSONSchemaBench")
    ap.add_argument("--optional", action="store_true", help="with --suite: include optional/ (formats...)")
    ap.add_argument("--lenient", action="store_true")
    ap.add_argument("--oneof-as-anyof", action="store_true")
    ap.add_argument("--unknown-format", default="ignore", choices=["error", "ignore"],
                    help="json_schema_to_grammar's unknown_format (default: ignore, its default)")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--show", type=int, default=15, help="how many failure reasons to list")
    ap.add_argument("--verbose", action="store_true", help="print every failure")
    args = ap.parse_args()
    options: dict[str, Any] = {"lenient": args.lenient, "unknown_format": args.unknown_format,
                               "oneof_as_anyof": args.oneof_as_anyof}
    if args.suite:
        options["remote_schemas"] = suite_remote
    subsets = suite_files(DEFAULT_DATA, args.optional) if args.suite else [args.subset] if args.subset else list(JSB_SUBSETS)
    cases = load_cases(DEFAULT_DATA, subsets, "all", args.limit)
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    start = time.time()
    for case in cases:
        name, subset = case.id, case.subset
        tests = [(t["data"], t["valid"]) for t in case.tests]
        outcome, detail = check(case.schema, tests, options, args.timeout, per[subset])
        per[subset][outcome] += 1
        if outcome not in ("pass", "format"):
            key = f"{outcome}: {_reason(detail)}"
            reasons[key] += 1
            examples.setdefault(key, f"{name}: {detail[:160]}")
            if args.verbose:
                print(f"{outcome:15} {name}: {detail[:300]}")
    print("pass+fmt: also counting schemas whose only rejected valid instances fail a format we enforce")
    print("valid_acc: valid instances of compiled schemas accepted (a format we enforce by design counts as rejected)")
    head = f"{'subset':28} {'n':>5} {'pass':>6} {'pass+fmt':>8} {'compile':>8} {'valid_acc':>9} {'rej_valid':>9} {'acc_inval':>9} {'other':>6}"
    print(head)

    def row(label: str, c: collections.Counter) -> None:
        n = sum(c[k] for k in OUTCOMES)
        if not n:
            return
        acc = f"{c['accepted'] / c['valid']:9.1%}" if c["valid"] else f"{'-':>9}"
        print(f"{label:28} {n:5} {c['pass'] / n:6.1%} {(c['pass'] + c['format']) / n:8.1%} {(n - c['compile']) / n:8.1%} "
              f"{acc} {c['reject_valid']:9} {c['accept_invalid']:9} {c['timeout'] + c['crash']:6}")

    total: collections.Counter = collections.Counter()
    for subset in sorted(per):
        row(subset, per[subset])
        total.update(per[subset])
    row("TOTAL", total)
    if args.suite and "ts/format" in per:
        rest = collections.Counter(total)
        rest.subtract(per["ts/format"])
        row("TOTAL without format.json", rest)
    print(f"({time.time() - start:.0f}s)  most common failures:")
    for key, count in reasons.most_common(args.show):
        print(f"{count:5}  {key}\n       e.g. {examples[key]}")


if __name__ == "__main__":
    main()
