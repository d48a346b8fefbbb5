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
import gzip
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATA = ROOT.parent / "shared" / "data"
BENCH = DATA / "jsonschemabench"
SUITE = DATA / "json-schema-test-suite" / "draft2020-12"
REMOTES = DATA / "json-schema-test-suite" / "remotes"
REMOTE_PREFIX = "http://localhost:1234/"


def suite_remote(uri: str) -> Any:
    """The test suite's remote documents: http://localhost:1234/<path> -> remotes/<path> (never fetched)."""
    if not uri.startswith(REMOTE_PREFIX):
        return None
    path = REMOTES / uri[len(REMOTE_PREFIX):]
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------- instances in schema order


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node = root
    for raw in ref[1:].split("/")[1:]:
        from urllib.parse import unquote

        tok = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and tok in node:
            node = node[tok]
        elif isinstance(node, list) and tok.isdigit() and int(tok) < len(node):
            node = node[int(tok)]
        else:
            return None
    return node


def _branches(root: Any, schema: Any, value: Any, check: Any, seen: set[int]) -> Iterator[dict]:
    """``schema`` and the subschemas applied in place to ``value`` (refs, allOf, the anyOf/oneOf
    branch ``value`` matches, if/then/else...), in the order the front end merges them."""
    if not isinstance(schema, dict) or id(schema) in seen:
        return
    seen.add(id(schema))
    if isinstance(schema.get("$ref"), str):
        meta = root.get("$schema", "") if isinstance(root, dict) else ""
        if any(f"draft-0{n}" in str(meta) for n in (3, 4, 6, 7)):  # $ref siblings are ignored
            yield from _branches(root, _resolve(root, schema["$ref"]), value, check, seen)
            return
    yield schema
    if isinstance(schema.get("$ref"), str):
        yield from _branches(root, _resolve(root, schema["$ref"]), value, check, seen)
    if isinstance(schema.get("allOf"), list):
        for b in schema["allOf"]:
            yield from _branches(root, b, value, check, seen)
    for kw in ("anyOf", "oneOf"):
        if isinstance(schema.get(kw), list):
            good = [b for b in schema[kw] if check(b, value)]
            for b in good[:1] or schema[kw]:
                yield from _branches(root, b, value, check, seen)
    if "if" in schema:
        if check(schema["if"], value):
            yield from _branches(root, schema["if"], value, check, seen)
            yield from _branches(root, schema.get("then"), value, check, seen)
        else:
            yield from _branches(root, schema.get("else"), value, check, seen)
    for kw in ("dependentSchemas", "dependencies"):
        if isinstance(schema.get(kw), dict) and isinstance(value, dict):
            for name, v in schema[kw].items():
                if name in value:
                    yield from _branches(root, v, value, check, seen)


def in_schema_order(root: Any, schemas: list[Any], value: Any, check: Any = None) -> Any:
    """``value`` with object keys reordered as the generated grammar writes them."""
    if check is None:
        base = oracle(root)

        def check(schema: Any, v: Any) -> bool:
            try:
                return base.evolve(schema=schema).is_valid(v)
            except Exception:
                return False
    parts = [b for s in schemas for b in _branches(root, s, value, check, set())]
    if isinstance(value, dict):
        declared: dict[str, None] = {}
        required: dict[str, None] = {}
        for b in parts:
            if isinstance(b.get("properties"), dict):
                declared.update(dict.fromkeys(b["properties"]))
        for b in parts:
            if isinstance(b.get("required"), list):
                required.update(dict.fromkeys(k for k in b["required"] if isinstance(k, str) and k not in declared))
            for kw in ("dependentRequired", "dependencies"):
                for name, deps in (b.get(kw) or {}).items() if isinstance(b.get(kw), dict) else ():
                    if isinstance(deps, list) and name in value:
                        required.update(dict.fromkeys(k for k in [name, *deps] if isinstance(k, str) and k not in declared))
        order = {k: i for i, k in enumerate(list(declared) + list(required))}
        keys = sorted(value, key=lambda k: (order.get(k, len(order)),))
        out = {}
        for k in keys:
            subs = []
            for b in parts:
                if isinstance(b.get("properties"), dict) and k in b["properties"]:
                    subs.append(b["properties"][k])
                if isinstance(b.get("patternProperties"), dict):
                    subs += [s for p, s in b["patternProperties"].items() if _search(p, k)]
                if isinstance(b.get("additionalProperties"), dict):
                    subs.append(b["additionalProperties"])
            out[k] = in_schema_order(root, subs, value[k], check)
        return out
    if isinstance(value, list):
        out_list = []
        for i, x in enumerate(value):
            subs = []
            for b in parts:
                pre = b.get("prefixItems") if isinstance(b.get("prefixItems"), list) else (
                    b.get("items") if isinstance(b.get("items"), list) else None)
                if pre is not None and i < len(pre):
                    subs.append(pre[i])
                elif isinstance(b.get("items"), dict):
                    subs.append(b["items"])
                elif isinstance(b.get("additionalItems"), dict):
                    subs.append(b["additionalItems"])
                if isinstance(b.get("contains"), dict):
                    subs.append(b["contains"])
            out_list.append(in_schema_order(root, subs, x, check))
        return out_list
    return value


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except (re.error, RecursionError):
        return False


# ---------------------------------------------------------------------- checking


OUTCOMES = ("pass", "format", "compile", "reject_valid", "accept_invalid", "timeout", "crash")


class Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Timeout()


def _registry() -> Any:
    try:
        from referencing import Registry, Resource
        from referencing.exceptions import NoSuchResource
        from referencing.jsonschema import DRAFT202012
    except ImportError:
        return None

    def retrieve(uri: str) -> Any:
        contents = suite_remote(uri)
        if contents is None:
            raise NoSuchResource(ref=uri)
        return Resource.from_contents(contents, default_specification=DRAFT202012)

    return Registry(retrieve=retrieve)


def oracle(schema: Any) -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    registry = _registry()
    extra = {} if registry is None else {"registry": registry}
    return cls(schema, format_checker=cls.FORMAT_CHECKER, **extra)


def dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


class Matcher:
    """Byte-level membership on one grammar, sharing derivatives across instances."""

    def __init__(self, grammar: Any) -> None:
        from constrain.derivatives import NOTHING, ExprTable

        self.table, self.nothing = ExprTable(grammar), NOTHING

    def __call__(self, data: bytes) -> bool:
        old = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old, 20000))
        try:
            s = self.table.start
            for b in data:
                s = self.table.derive(s, b)
                if s == self.nothing:
                    return False
            return self.table.nullable(s)
        finally:
            sys.setrecursionlimit(old)


def check(schema: Any, tests: list[tuple[Any, bool | None]], options: dict, timeout: float = 20.0,
          counts: collections.Counter | None = None) -> tuple[str, str]:
    """("pass"|"format"|"compile"|"reject_valid"|"accept_invalid"|"timeout"|"crash", detail).

    "format": passes, except valid instances that fail a ``format`` the oracle cannot check
    (uri, hostname... need optional packages) but we enforce by design. An accepted invalid
    instance outranks a rejected valid one. ``counts`` (if given) gets "valid" and "accepted":
    the valid instances of a compiled schema and how many of them were accepted ("format_rejected":
    how many were rejected only for a ``format`` we enforce by design).
    """
    from constrain.grammars.errors import GrammarError
    from constrain.grammars.json_schema import json_schema_to_grammar

    counts = collections.Counter() if counts is None else counts
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        try:
            grammar = json_schema_to_grammar(schema, **options)
        except GrammarError as exc:
            if "unsatisfiable" in str(exc) and not any(oracle(schema).is_valid(v) for v, _ in tests):
                return "pass", ""  # refusing a schema nothing satisfies is right
            return "compile", str(exc)
        match = Matcher(grammar)
        validator = oracle(schema)
        by_design: Any = None
        format_rejects = 0
        rejected = accepted = None
        for value, _ in tests:
            try:
                ok = validator.is_valid(value)
            except Exception:  # the oracle itself cannot judge (e.g. \p{...} in Python's re)
                continue
            if ok:
                counts["valid"] += 1
                data = dump(in_schema_order(schema, [schema], value))
                if match(data):
                    counts["accepted"] += 1
                    continue
                if by_design is None:
                    try:
                        by_design = Matcher(json_schema_to_grammar(schema, **{**options, "format_mode": "annotation"}))
                    except GrammarError:
                        by_design = lambda data: False
                if by_design(data):
                    format_rejects += 1
                    counts["format_rejected"] += 1
                    continue
                rejected = rejected or data.decode("utf-8", "replace")[:200]
            else:
                data = dump(value)
                if match(data):
                    accepted = accepted or data.decode("utf-8", "replace")[:200]
        if accepted is not None:
            return "accept_invalid", accepted
        if rejected is not None:
            return "reject_valid", rejected
        return ("format", "") if format_rejects else ("pass", "")
    except Timeout:
        return "timeout", ""
    except RecursionError:
        return "crash", "RecursionError"
    except Exception as exc:  # a bug of ours: report it, keep going
        return "crash", f"{type(exc).__name__}: {exc}"[:200]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def bench_cases(subset: str | None, limit: int | None) -> Iterator[tuple[str, str, Any, list]]:
    files = sorted(BENCH.glob("*.jsonl.gz")) if subset is None else [BENCH / f"{subset}.jsonl.gz"]
    for f in files:
        with gzip.open(f, "rt") as fh:
            for i, line in enumerate(fh):
                if limit is not None and i >= limit:
                    break
                d = json.loads(line)
                yield f.name.split(".")[0], d["id"], d["schema"], [(t["data"], t["valid"]) for t in d["tests"]]


def suite_cases(include_optional: bool = False) -> Iterator[tuple[str, str, Any, list]]:
    files = sorted(SUITE.glob("*.json")) + (sorted((SUITE / "optional").rglob("*.json")) if include_optional else [])
    for f in files:
        for group in json.loads(f.read_text()):
            yield f.stem, f"{f.stem}: {group['description']}", group["schema"], [
                (t["data"], t["valid"]) for t in group["tests"]]


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
    cases = suite_cases(args.optional) if args.suite else bench_cases(args.subset, args.limit)
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    start = time.time()
    for subset, name, schema, tests in cases:
        outcome, detail = check(schema, tests, options, args.timeout, per[subset])
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
    if args.suite and "format" in per:
        rest = collections.Counter(total)
        rest.subtract(per["format"])
        row("TOTAL without format.json", rest)
    print(f"({time.time() - start:.0f}s)  most common failures:")
    for key, count in reasons.most_common(args.show):
        print(f"{count:5}  {key}\n       e.g. {examples[key]}")


if __name__ == "__main__":
    main()
