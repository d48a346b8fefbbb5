"""Built-in Lark grammars (json, sql_select): constrain vs xgrammar and llguidance, side by side.

    python3 bench/grammar_compare.py                       # llama3 + tekken, 30 walks x 300 tokens
    python3 bench/grammar_compare.py --tokenizers llama3 --walks 5 --depths 10,100

Every engine gets the same grammar text (`grammars/<name>.lark`, read by `grammars.builtin.load`):
constrain through `lark_to_grammar` + `constrain.compile_grammar`, xgrammar through its own Lark
front end (`GrammarCompiler.compile_lark`), llguidance through `LLMatcher.grammar_from_lark`.
xgrammar's built-in JSON grammar (`compile_builtin_json_grammar`) is an extra row for json (a
different language: its whitespace is not json.lark's bounded one).

Per engine, grammar and tokenizer: time to first mask (grammar text -> compiled -> matcher -> first
mask filled; median of --reps fresh compiles; the tokenizer is prepared once beforehand, as every
engine caches that per vocabulary), host mask time per token from seeded random constrained walks
(`bench.walk.random_walk`; a walk's choices depend only on the mask, so engines with the same
masks make the same walks, and the first step where two engines' masks differ is reported), and
soundness: every finished document must parse with lark's Earley parser on the grammar text.
For json, also mask time per token along `[`*d `1` `]`*d for nesting depths d (fresh compile per
depth). Each engine runs in its own process with one thread (bench.worker.THREAD_ENV), one at a
time. The markdown report is printed and, with --write-benchmarks, appended to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from bench import REPO_ROOT
from bench.compare import append_benchmarks, git_commit, machine
from bench.engines import Compiled, Constrain, LLGuidance, XGrammar, _FactoryCompiled, _LlgMatcher, _StdMatcher
from bench.report import pct
from bench.worker import THREAD_ENV

GRAMMARS = ("json", "sql_select")
ENGINES = ("constrain", "xgrammar", "llguidance", "xgrammar-builtin")
ANCHORS = ENGINES[1:]
TOKENIZERS = ("llama3", "tekken")

# Walk bias ("structural" picks, half of all picks): tokens made only of these bytes for json (the
# same set as bench.walk), and for sql_select tokens that are a keyword, a closer or a separator
# once surrounding whitespace is stripped (so that walks reach FROM, close parentheses and end).
SQL_WORDS = frozenset(b"from where limit offset and or as on join inner left by group order having "
                      b"asc desc null is not in like between true false distinct".split())
SQL_PUNCT = frozenset(b"),;*.=<>'")
# EOS is taken with this probability where allowed (a top-level JSON number allows it at every step).
P_EOS = {"json": 0.1, "sql_select": 0.2}


def structural_set(grammar: str, token_bytes: list[bytes | None]) -> list[bool]:
    if grammar == "json":
        allowed = frozenset(b'"{}[],:')
        return [bool(b) and all(c in allowed for c in b) for b in token_bytes]
    out = []
    for b in token_bytes:
        s = (b or b"").strip().lower()
        word = s in SQL_WORDS and b[:1] in (b" ", b"\t", b"\n")   # cannot continue an identifier
        out.append(bool(s) and (word or all(c in SQL_PUNCT for c in s)))
    return out


# ------------------------------------------------------------------------------------ adapters
# The JSON Schema harness's adapters (tokenizer set-up, matcher verbs), given a grammar entry point.

class ConstrainG(Constrain):
    options = "grammars.lark_frontend.lark_to_grammar(text) + constrain.compile_grammar(ir, vocab)"

    def compile_grammar(self, name: str) -> Compiled:
        from constrain.grammars.builtin import load
        from constrain.grammars.lark_frontend import lark_to_grammar

        cg = self.constrain.compile_grammar(lark_to_grammar(load(name)), self.tok.vocab)
        return _FactoryCompiled(lambda: _StdMatcher(cg.matcher()))


class XGrammarG(XGrammar):
    options = "GrammarCompiler(max_threads=1, cache_enabled=False).compile_lark(text)"

    def compile_grammar(self, name: str) -> Compiled:
        import xgrammar as xgr

        from constrain.grammars.builtin import load

        cg = self.compiler.compile_lark(load(name))
        return _FactoryCompiled(lambda: _StdMatcher(xgr.GrammarMatcher(cg)))


class XGrammarBuiltin(XGrammar):
    options = "GrammarCompiler(max_threads=1, cache_enabled=False).compile_builtin_json_grammar() (json only)"

    def compile_grammar(self, name: str) -> Compiled:
        import xgrammar as xgr

        if name != "json":
            raise NotImplementedError("xgrammar's built-in grammar is JSON only")
        cg = self.compiler.compile_builtin_json_grammar()
        return _FactoryCompiled(lambda: _StdMatcher(xgr.GrammarMatcher(cg)))


class LLGuidanceG(LLGuidance):
    options = "LLMatcher.grammar_from_lark(text), default limits; walks use deep copies of the first matcher"

    def compile_grammar(self, name: str) -> Compiled:
        from constrain.grammars.builtin import load

        llg = self.llg
        m = llg.LLMatcher(self.tokenizer, llg.LLMatcher.grammar_from_lark(load(name)), log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        nbytes = self.nbytes
        return _FactoryCompiled(lambda: _LlgMatcher(m.deep_copy(), nbytes))


ADAPTERS = {"constrain": ConstrainG, "xgrammar": XGrammarG, "llguidance": LLGuidanceG,
            "xgrammar-builtin": XGrammarBuiltin}


# -------------------------------------------------------------------------------------- worker

def _first_mask(engine: Any, name: str) -> tuple[Compiled, float]:
    t0 = time.perf_counter()
    compiled = engine.compile_grammar(name)
    engine._masks.reset()
    compiled.matcher().fill(engine._masks.bitmask)
    return compiled, time.perf_counter() - t0


def _walk(compiled: Compiled, masks: Any, rng: random.Random, max_tokens: int, p_eos: float) -> dict[str, Any]:
    """bench.walk.random_walk, plus a CRC and a count of every mask (to find where engines differ)."""
    from bench.walk import random_walk

    crcs: list[int] = []
    counts: list[int] = []
    allowed_ids = masks.allowed_ids

    def traced() -> Any:
        ids = allowed_ids()
        crcs.append(zlib.crc32(masks.bytes.tobytes()))
        counts.append(len(ids))
        return ids

    masks.allowed_ids = traced
    try:
        r = random_walk(compiled, masks, rng, max_tokens=max_tokens, p_eos=p_eos)
    finally:
        del masks.allowed_ids
    r["crcs"], r["counts"] = crcs, counts
    return r


def _deep(engine: Any, masks: Any, depth: int) -> dict[str, Any]:
    """Mask time per token along `[`*depth `1` `]`*depth then EOS (one fresh compile)."""
    from bench.walk import check_instance

    tb = engine.tok.token_bytes
    lb, one, rb = tb.index(b"["), tb.index(b"1"), tb.index(b"]")
    r = check_instance(engine.compile_grammar("json"), masks, [lb] * depth + [one] + [rb] * depth)
    return {"status": "ok" if r["accepted"] else f"token {r['pos']}: {r['why']}", "ns": r["mask_ns"]}


def worker(args: argparse.Namespace) -> None:
    import torch

    from bench.tok import load
    from bench.walk import Masks

    torch.set_num_threads(1)
    tok = load(args.tokenizer)
    engine = ADAPTERS[args.engine](tok)
    masks = Masks(tok)
    engine._masks = masks
    out: dict[str, Any] = {"version": engine.version(), "options": engine.options, "grammars": {}}
    for name in args.grammars.split(","):
        rec: dict[str, Any] = {}
        out["grammars"][name] = rec
        try:
            compiled, first = None, []
            for _ in range(args.reps):
                compiled, s = _first_mask(engine, name)
                first.append(s)
        except NotImplementedError:
            del out["grammars"][name]
            continue
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {str(e)[:500]}"
            continue
        rec["compile_s"] = first
        masks.structural[: len(tok.token_bytes)] = structural_set(name, tok.token_bytes)
        walks = []
        for w in range(args.walks):
            rng = random.Random(zlib.crc32(f"{args.seed}:{name}:{w}".encode()))
            r = _walk(compiled, masks, rng, args.max_tokens, P_EOS.get(name, 0.5))
            r["doc"] = r["doc"].decode("utf-8", "replace")
            walks.append(r)
        rec["walks"] = walks
        # The same compiled grammar serving new requests: walks with other seeds (constrain's states
        # and masks from the first walks are cached; the anchors keep no per-state cache).
        rec["warm_ns"] = []
        for w in range(args.walks, args.walks + args.warm_walks):
            rng = random.Random(zlib.crc32(f"{args.seed}:{name}:{w}".encode()))
            rec["warm_ns"] += _walk(compiled, masks, rng, args.max_tokens, P_EOS.get(name, 0.5))["mask_ns"]
        if name == "json":
            rec["deep"] = {str(d): _deep(engine, masks, d) for d in args.depths}
    Path(args.out).write_text(json.dumps(out), encoding="utf-8")


def run_worker(engine: str, tokenizer: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, "-m", "bench.grammar_compare", "--worker", "--engine", engine, "--tokenizers", tokenizer,
           "--grammars", ",".join(args.grammar_list), "--walks", str(args.walks), "--max-tokens",
           str(args.max_tokens), "--seed", str(args.seed), "--reps", str(args.reps),
           "--depths", ",".join(map(str, args.depths)), "--warm-walks", str(args.warm_walks), "--out", path]
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=args.timeout)
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text) if text else {"error": f"worker exit code {proc.returncode}"}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return {"error": f"timed out after {args.timeout:g} s"}
    finally:
        os.unlink(path)


# -------------------------------------------------------------------------------------- report

def lark_checker(name: str) -> Callable[[str], str]:
    """doc -> "" if lark's Earley parser (dynamic lexer) accepts it on the grammar, else the error."""
    import lark

    from constrain.grammars.builtin import load

    parser = lark.Lark(load(name), parser="earley", lexer="dynamic")

    def check(doc: str) -> str:
        try:
            parser.parse(doc)
            return ""
        except Exception as e:
            return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return check


def _json_check(doc: str) -> str:
    """For xgrammar's own JSON grammar (not json.lark's language: its whitespace is unbounded)."""
    try:
        json.loads(doc)
        return ""
    except ValueError as e:
        return f"not JSON: {e}"


def _us(ns: list[int], q: float | None = None) -> float:
    return (sum(ns) / len(ns) if q is None else pct(ns, q)) / 1e3


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def build_report(res: dict[str, dict[str, dict]], args: argparse.Namespace) -> tuple[str, list[str]]:
    """res[tokenizer][engine] = worker output. Returns (markdown, verdict lines)."""
    lines: list[str] = []
    verdicts: list[str] = []
    notes: list[str] = []
    checkers = {g: lark_checker(g) for g in args.grammar_list}
    lines += [f"| tokenizer | grammar | engine | first mask ms (p50 of {args.reps}) | mask µs mean | p50 | p99 | max | "
              "tokens | walks fin/trunc/other | lark-sound | same walks as constrain | "
              f"next {args.warm_walks} walks: mask µs mean / p99 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary: dict[tuple[str, str, str], dict[str, float]] = {}
    for tname in args.tok_list:
        for g in args.grammar_list:
            base = res[tname].get("constrain", {}).get("grammars", {}).get(g, {}).get("walks")
            for e in args.engine_list:
                out = res[tname].get(e, {})
                rec = out.get("grammars", {}).get(g)
                if rec is None:
                    if "error" in out and not (e == "xgrammar-builtin" and g != "json"):
                        lines.append(f"| {tname} | {g} | {e} | {out['error'][:80]} |" + " |" * 8)
                    continue
                if "error" in rec:
                    lines.append(f"| {tname} | {g} | {e} | error: {rec['error'][:80]} |" + " |" * 8)
                    continue
                walks = rec["walks"]
                ns = [t for w in walks for t in w["mask_ns"]]
                fin = [w for w in walks if w["status"] == "finished"]
                trunc = sum(w["status"] == "truncated" for w in walks)
                other = [w for w in walks if w["status"] not in ("finished", "truncated")]
                check = _json_check if e == "xgrammar-builtin" else checkers[g]
                bad = [(w["doc"], err) for w in fin if (err := check(w["doc"]))]
                same = "-"
                if base is not None and e != "constrain":
                    same_n = sum(w["crcs"] == b["crcs"] for w, b in zip(walks, base))
                    same = f"{same_n}/{len(walks)}"
                    for i, (w, b) in enumerate(zip(walks, base)):
                        if w["crcs"] != b["crcs"]:
                            k = next((j for j, (x, y) in enumerate(zip(w["crcs"], b["crcs"])) if x != y),
                                     min(len(w["crcs"]), len(b["crcs"])))
                            prefix = w["doc"][:200]
                            notes.append(f"{tname}/{g}/{e}: walk {i} first differs from constrain's at step {k} "
                                         f"(allowed tokens {w['counts'][k] if k < len(w['counts']) else '-'} vs "
                                         f"constrain {b['counts'][k] if k < len(b['counts']) else '-'}); "
                                         f"{e}'s document starts {prefix!r}")
                            break
                warm = rec.get("warm_ns", [])
                comp_ms = statistics.median(rec["compile_s"]) * 1e3
                st = {"compile": comp_ms, "mean": _us(ns), "p50": _us(ns, 50), "p99": _us(ns, 99),
                      "max": _us(ns, 100)}
                summary[(tname, g, e)] = st
                sound = f"{len(fin) - len(bad)}/{len(fin)}" + (" **UNSOUND**" if bad else "")
                if e == "xgrammar-builtin":
                    sound += " (json.loads)"
                for doc, err in bad[:2]:
                    notes.append(f"{tname}/{g}/{e}: finished document rejected by lark: {doc[:200]!r} ({err})")
                for w in other[:2]:
                    notes.append(f"{tname}/{g}/{e}: walk {w['status']}: {w.get('detail', '')[:200]}")
                lines.append(f"| {tname} | {g} | {e} | {_fmt(comp_ms)} | {_fmt(st['mean'])} | {_fmt(st['p50'])} | "
                             f"{_fmt(st['p99'])} | {_fmt(st['max'])} | {len(ns)} | {len(fin)}/{trunc}/{len(other)} | "
                             f"{sound} | {same} | {_fmt(_us(warm)) if warm else '-'} / {_fmt(_us(warm, 99)) if warm else '-'} |")
            c = summary.get((tname, g, "constrain"))
            anchors = {e: summary[(tname, g, e)] for e in ANCHORS if (tname, g, e) in summary}
            if c and anchors:
                parts, ok = [], True
                for key, label in (("mean", "mask mean"), ("p99", "mask p99"), ("compile", "first mask")):
                    best_e = min(anchors, key=lambda a: anchors[a][key])
                    r = c[key] / anchors[best_e][key]
                    ok &= r <= 2.0
                    parts.append(f"{label} {r:.2f}x best ({best_e})")
                verdicts.append(f"- {tname}/{g}: constrain {'MEETS' if ok else 'MISSES'} the 2x target: "
                                + "; ".join(parts))
    # deep recursion
    deep = ["", "Nested JSON array `[`*d `1` `]`*d (2d+2 masks, fresh compile per depth), mask µs per token:", "",
            "| tokenizer | engine | " + " | ".join(f"d={d} mean / p99 / max" for d in args.depths) + " |",
            "|---|---|" + "---|" * len(args.depths)]
    for tname in args.tok_list:
        for e in args.engine_list:
            rec = res[tname].get(e, {}).get("grammars", {}).get("json", {})
            if "deep" not in rec:
                continue
            cells = []
            for d in args.depths:
                r = rec["deep"][str(d)]
                cell = f"{_fmt(_us(r['ns']))} / {_fmt(_us(r['ns'], 99))} / {_fmt(_us(r['ns'], 100))}" if r["ns"] else ""
                if r["status"] != "ok":
                    cell += f" ({r['status']} after {len(r['ns'])} masks)"
                cells.append(cell)
            deep.append(f"| {tname} | {e} | " + " | ".join(cells) + " |")
    md = "\n".join(lines + deep) + "\n"
    if notes:
        md += "\nNotes from the run:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return md, verdicts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizers", default=",".join(TOKENIZERS))
    ap.add_argument("--grammars", default=",".join(GRAMMARS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--walks", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-walks", type=int, default=10,
                    help="further walks (other seeds) on the same compiled grammar, reported apart")
    ap.add_argument("--reps", type=int, default=5, help="fresh compiles timed per grammar (median reported)")
    ap.add_argument("--depths", default="10,100,1000")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per engine and tokenizer, seconds")
    ap.add_argument("--write-benchmarks", action="store_true", help="append the report to BENCHMARKS.md")
    ap.add_argument("--raw", type=Path, default=None, help="raw results JSON (default bench/results/grammars-<stamp>.json)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.tok_list = [t for t in args.tokenizers.split(",") if t]
    args.grammar_list = [g for g in args.grammars.split(",") if g]
    args.engine_list = [e for e in args.engines.split(",") if e]
    args.depths = [int(d) for d in str(args.depths).split(",") if d]
    for e in args.engine_list:
        if e not in ENGINES:
            raise SystemExit(f"unknown engine {e!r}; known: {', '.join(ENGINES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        args.tokenizer = args.tok_list[0]
        worker(args)
        return 0
    command = "python3 bench/grammar_compare.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    raw = args.raw or REPO_ROOT / "bench" / "results" / f"grammars-{stamp}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    t_start, load_start, commit = time.time(), os.getloadavg()[0], git_commit()
    res: dict[str, dict[str, dict]] = {}
    for tname in args.tok_list:
        res[tname] = {}
        for e in args.engine_list:
            print(f"[{tname}] {e} ... ({time.time() - t_start:.0f}s)", file=sys.stderr)
            res[tname][e] = run_worker(e, tname, args)
    raw.write_text(json.dumps(res), encoding="utf-8")
    body, verdicts = build_report(res, args)
    versions = {e: " / ".join(dict.fromkeys(r[e].get("version") or "?" for r in res.values() if e in r)) or "?"
                for e in args.engine_list}
    options = {e: next((r[e].get("options") for r in res.values() if r.get(e, {}).get("options")), "")
               for e in args.engine_list}
    head = (f"## Grammars: built-in JSON and SQL vs xgrammar and llguidance, {datetime.date.today().isoformat()}\n\n"
            f"- command: `{command}`\n- commit: {commit} at start, {git_commit()} at end\n- machine: {machine()}\n"
            f"- engines: {', '.join(f'{e} {versions[e]}' for e in args.engine_list)}\n"
            + "".join(f"- {e}: {options[e]}\n" for e in args.engine_list)
            + f"- one CPU thread per engine, engines run one at a time; {args.walks} seeded walks per grammar, cap "
              f"{args.max_tokens} tokens, half the picks from structural tokens (json: made of `\"{{}}[],:`; sql: a "
              f"keyword after whitespace, or made of `),;*.=<>'`), EOS taken where allowed with p="
              f"{', '.join(f'{g} {p}' for g, p in P_EOS.items())}; wall time {time.time() - t_start:.0f} s; load average (1 min) {load_start:.1f} at start, "
              f"{os.getloadavg()[0]:.1f} at end (times are wall clock)\n"
              f"- first mask = grammar text to first mask filled (tokenizer prepared beforehand); lark-sound = finished "
              f"documents that lark's Earley parser (lexer=dynamic) accepts on the same .lark text; same walks = "
              f"walks whose every mask equals constrain's (same masks => same seeded walk); the last column: "
              f"{args.warm_walks} more walks (other seeds) on the same compiled grammar\n\n")
    report = head + body + "\nAgainst the target (constrain mask mean, mask p99 and first mask each <= 2x the best " \
        "anchor's):\n\n" + "\n".join(verdicts) + "\n"
    print(report)
    raw.with_suffix(".md").write_text(report, encoding="utf-8")
    if args.write_benchmarks:
        append_benchmarks(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
