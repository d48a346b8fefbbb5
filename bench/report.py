"""Aggregates per-case records into markdown tables: one column per engine, ratios vs llguidance."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

BASELINE = "llguidance"
FINISHED = ("finished", "format", "unsound", "unjudged")   # walk statuses of a completed document


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def _ratio(v: float | None, base: float | None) -> str:
    if v is None or base is None or base == 0:
        return ""
    return f" ({v / base:.2f}x)"


def schema_passes(rec: dict) -> bool:
    if rec["compile"]["status"] != "ok" or rec.get("test_status") != "ok":
        return False
    return all(i.get("accepted") == i["valid"] for i in rec.get("instances", []) if "skipped" not in i)


class Stats:
    """Numbers of one engine over a set of records."""

    def __init__(self, recs: list[dict]) -> None:
        self.n = len(recs)
        st = [r["compile"]["status"] for r in recs]
        self.compiled = st.count("ok")
        self.timeouts = st.count("timeout")
        self.crashes = st.count("crash")
        self.errors = st.count("error")
        self.test_timeouts = sum(1 for r in recs if r.get("test_status", "ok") != "ok")
        self.passed = sum(schema_passes(r) for r in recs)
        ok = [r for r in recs if r["compile"]["status"] == "ok"]
        inst = [i for r in ok for i in r.get("instances", []) if "skipped" not in i]
        self.skipped = sum(1 for r in ok for i in r.get("instances", []) if "skipped" in i)
        self.valid = [i for i in inst if i["valid"]]
        self.invalid = [i for i in inst if not i["valid"]]
        self.valid_ok = sum(1 for i in self.valid if i.get("accepted"))
        self.invalid_ok = sum(1 for i in self.invalid if not i.get("accepted"))
        # tests passed over all instances, a schema that does not compile failing all of its own
        self.tests = sum(1 for r in recs for i in r.get("instances", []) if "skipped" not in i) + sum(
            r.get("_ntests", 0) for r in recs if r["compile"]["status"] != "ok")
        self.tests_ok = self.valid_ok + self.invalid_ok
        # a timeout enters at the timeout itself (its record's "s")
        times = [r["compile"]["s"] for r in recs if r["compile"]["status"] in ("ok", "timeout")]
        self.compile_ms = [t * 1e3 for t in times]
        walks = [w for r in recs for w in r.get("walks", [])]
        self.walk_status: dict[str, int] = defaultdict(int)
        for w in walks:
            self.walk_status[w["status"]] += 1
        self.walks = len(walks)
        self.mask_us = [ns / 1e3 for r in recs for ns in r.get("walk_mask_ns", [])]
        # Masks while the valid and invalid instances are fed token by token: real strings and
        # numbers, so most states are first visits (what a model's output meets).
        self.replay_us = [ns / 1e3 for r in recs for ns in r.get("inst_mask_ns", [])]

    def p(self, a: int, b: int) -> float | None:
        return 100.0 * a / b if b else None


def _fmt(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def _rows(engines: list[str], stats: dict[str, Stats], metrics: list[tuple[str, Any, int]]) -> list[list[str]]:
    rows = []
    for label, fn, digits in metrics:
        vals = {e: fn(stats[e]) for e in engines}
        base = vals.get(BASELINE)
        row = [label]
        for e in engines:
            v = vals[e]
            if isinstance(v, str):
                row.append(v)
            else:
                row.append(_fmt(v, digits) + ("" if e == BASELINE or base is None or v is None else _ratio(v, base)))
        rows.append(row)
    return rows


def _mask_metrics(attr: str = "mask_us", label: str = "mask") -> list[tuple[str, Any, int]]:
    """Mask time rows of ``Stats.<attr>`` (random walks: ``mask_us``; instances: ``replay_us``)."""
    def m(q: float):
        return lambda s: pct(getattr(s, attr), q) if getattr(s, attr) else None

    def mean(s: Stats) -> float | None:
        v = getattr(s, attr)
        return sum(v) / len(v) if v else None

    return [
        (f"{label} µs p50", m(50), 1), (f"{label} µs p99", m(99), 1), (f"{label} µs mean", mean, 1),
        (f"{label} µs max", lambda s: max(getattr(s, attr)) if getattr(s, attr) else None, 0),
        (f"{label} calls", lambda s: str(len(getattr(s, attr))), 0),
    ]


def _walk_metrics() -> list[tuple[str, Any, int]]:
    def w(*keys: str):
        return lambda s: str(sum(s.walk_status.get(k, 0) for k in keys))

    return [
        ("walks finished / all", lambda s: f"{sum(s.walk_status.get(k, 0) for k in FINISHED)} / {s.walks}", 0),
        ("**UNSOUND walks**", w("unsound"), 0),
        ("format-violating walks", w("format"), 0),
        ("unjudged walks (validator cannot run)", w("unjudged"), 0),
        ("dead ends / refused / errors", lambda s: f"{s.walk_status.get('dead_end', 0)} / {s.walk_status.get('refused', 0)} / {s.walk_status.get('error', 0)}", 0),
    ]


def jsb_table(engines: list[str], stats: dict[str, Stats]) -> str:
    def c(q: float):
        return lambda s: pct(s.compile_ms, q) if s.compile_ms else None

    metrics = [
        ("schemas", lambda s: str(s.n), 0),
        ("compiled %", lambda s: s.p(s.compiled, s.n), 1),
        ("compile errors / timeouts / crashes", lambda s: f"{s.errors} / {s.timeouts} / {s.crashes}", 0),
        ("**pass %** (compiles, all valid accepted, all invalid rejected)", lambda s: s.p(s.passed, s.n), 1),
        ("valid accepted % (compiled)", lambda s: s.p(s.valid_ok, len(s.valid)), 1),
        ("invalid rejected % (compiled)", lambda s: s.p(s.invalid_ok, len(s.invalid)), 1),
        ("compile ms p50", c(50), 2), ("compile ms p90", c(90), 2), ("compile ms p99", c(99), 1),
        ("compile ms max", c(100), 1),
    ] + _mask_metrics() + _mask_metrics("replay_us", "replay mask") + _walk_metrics()
    return _table(["metric"] + engines, _rows(engines, stats, metrics))


def suite_table(engines: list[str], by_part: dict[str, dict[str, Stats]]) -> str:
    header = ["part", "metric"] + engines
    rows = []
    for part, stats in by_part.items():
        metrics = [
            ("groups", lambda s: str(s.n), 0),
            ("groups compiled %", lambda s: s.p(s.compiled, s.n), 1),
            ("valid accepted % (compiled)", lambda s: s.p(s.valid_ok, len(s.valid)), 1),
            ("invalid rejected % (compiled)", lambda s: s.p(s.invalid_ok, len(s.invalid)), 1),
            ("tests passed % (uncompiled = failed)", lambda s: s.p(s.tests_ok, s.tests), 1),
            ("groups passing %", lambda s: s.p(s.passed, s.n), 1),
            ("**UNSOUND walks**", lambda s: str(s.walk_status.get("unsound", 0)), 0),
            ("unjudged walks (validator cannot run)", lambda s: str(s.walk_status.get("unjudged", 0)), 0),
        ]
        for r in _rows(engines, stats, metrics):
            rows.append([part] + r)
    return _table(header, rows)


def subset_table(engines: list[str], by_subset: dict[str, dict[str, Stats]]) -> str:
    rows = []
    for subset, stats in by_subset.items():
        n = next(iter(stats.values())).n
        rows.append([subset, str(n)] + [f"{_fmt(s.p(s.compiled, s.n))} / {_fmt(s.p(s.passed, s.n))}"
                                        for s in (stats[e] for e in engines)])
    return _table(["subset", "schemas"] + [f"{e} compiled % / pass %" for e in engines], rows)


def unsound_examples(results: Iterable[tuple[str, Any, dict]], per_engine: int = 4) -> str:
    lines = []
    shown: dict[str, int] = defaultdict(int)
    for engine, case, rec in results:
        for w in rec.get("walks", []):
            if w["status"] == "unsound" and shown[engine] < per_engine:
                shown[engine] += 1
                doc = w.get("doc", "").replace("|", "\\|").replace("\n", " ")[:160]
                lines.append(f"- {engine} `{case.id}`: {w.get('detail', '')[:160]} — doc `{doc}`")
    return "\n".join(lines)


def build_report(engines: list[str], results: list[tuple[str, Any, dict]]) -> str:
    """results: (engine, case, record) triples -> the markdown report."""
    for _, case, rec in results:
        rec["_ntests"] = len(case.tests)
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for engine, case, rec in results:
        if case.is_suite:
            part = "format.json" if case.subset == "ts/format" else (
                "optional/" if case.subset.startswith("ts/optional/") else "suite w/o format")
            by[("ts:" + part, engine)].append(rec)
        else:
            by[("jsb", engine)].append(rec)
            by[("sub:" + case.subset, engine)].append(rec)
    out = []
    if any(k[0] == "jsb" for k in by):
        stats = {e: Stats(by[("jsb", e)]) for e in engines}
        out.append("### JSONSchemaBench\n\n" + jsb_table(engines, stats))
        subsets = sorted({k[0][4:] for k in by if k[0].startswith("sub:")})
        out.append("Per subset:\n\n" + subset_table(
            engines, {s: {e: Stats(by[("sub:" + s, e)]) for e in engines} for s in subsets}))
    parts = sorted({k[0][3:] for k in by if k[0].startswith("ts:")}, key=lambda p: (p != "suite w/o format", p))
    if parts:
        by_part = {p: {e: Stats(by[("ts:" + p, e)]) for e in engines} for p in parts}
        out.append("### JSON Schema Test Suite (draft2020-12)\n\n" + suite_table(engines, by_part))
        ts_stats = {e: Stats([r for p in parts for r in by[("ts:" + p, e)]]) for e in engines}
        out.append("Test-suite compile and mask times:\n\n" + _table(
            ["metric"] + engines, _rows(engines, ts_stats, [
                ("compile ms p50", lambda s: pct(s.compile_ms, 50) if s.compile_ms else None, 2),
                ("compile ms max", lambda s: max(s.compile_ms) if s.compile_ms else None, 1),
            ] + _mask_metrics())))
    ex = unsound_examples(results)
    if ex:
        out.append("UNSOUND examples (a finished walk whose document fails the schema, `format` aside):\n\n" + ex)
    return "\n\n".join(out) + "\n"
