"""Extraction quality: can the model read an object back out of prose, under its schema?

Each item is a JSONSchemaBench schema (the test half: odd positions) with one of its valid
instances; the instance is rendered as prose ("field: value." sentences) and the model is asked,
greedily and with the schema in its prompt, to extract it back. Each configuration runs the same
prompts through the public ``Engine`` (the scheduler a user gets), and the table says per
configuration how many outputs finished, parsed as JSON and validated against the schema, the
share of the reference's fields that came back right, the exact objects, the outputs with
*invented keys* (a key the reference does not have: the text never stated it), and tokens/s.

    python3 -m bench.extraction --limit 10                      # CPU slice
    python3 -m bench.extraction --device cuda --limit 100       # the full run (H200)

Items whose schema constrain cannot compile (in either JSON configuration) or whose prompt is
too long are left out before any run and counted in the header, so every configuration sees
the same prompts. The anchors (xgrammar with and without its strict mode, llguidance) run
through the same scheduler behind ``bench.engine_graph.AnchorMatcher``; an item an anchor
cannot compile counts as not finished for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from bench.engine_graph import AnchorMatcher
from bench.engines import LLGuidance, XGrammar, _FactoryCompiled, _StdMatcher
from bench.tok import Tok
from constrain.testing.corpus import DEFAULT_DATA, load_cases, make_checker

DEFAULT_SUBSETS = "Glaiveai2K,Github_trivial,Github_easy,Github_medium,JsonSchemaStore"
MAX_LEAVES = 16
MAX_SCHEMA_CHARS = 6000
INSTRUCTIONS = ("Extract the information from the text below. Answer with one JSON object that follows the "
                "schema. Use only facts stated in the text.")


@dataclass
class Item:
    id: str
    schema: dict[str, Any]
    reference: dict[str, Any]
    prompt: str


def leaves(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, scalar) for every scalar inside ``value``; list positions are path parts too."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*path, str(k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, f"item {i + 1}"))
    else:
        yield path, value


def key_paths(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every object key inside ``value`` (list positions collapsed)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, str(k))
            yield from key_paths(v, (*path, str(k)))
    elif isinstance(value, list):
        for v in value:
            yield from key_paths(v, (*path, "[]"))


def render_prose(instance: dict[str, Any]) -> str:
    """The instance as "field: value." sentences: what a form or a record reads like in text."""
    parts = []
    for path, value in leaves(instance):
        text = value if isinstance(value, str) else json.dumps(value)
        parts.append(f"{' '.join(path)}: {text}.")
    return " ".join(parts)


def prompt_for(schema: Any, text: str) -> str:
    return f"{INSTRUCTIONS}\n\nJSON Schema:\n{json.dumps(schema)}\n\nText:\n{text}"


def load_items(subsets: Sequence[str], limit: int, split: str = "test", instances: int | None = 1) -> list[Item]:
    """Up to ``limit`` items, taken round-robin over ``subsets`` (so a small slice mixes them);
    ``instances``: valid instances per schema, each an item of its own (None: all of them)."""
    per_subset = [load_cases(DEFAULT_DATA, [s], split=split) for s in subsets]
    items: list[Item] = []
    for case in (c for group in zip_longest(*per_subset) for c in group if c is not None):
        schema = case.schema
        if not isinstance(schema, dict) or len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
            continue
        usable = [t["data"] for t in case.tests if t["valid"] and isinstance(t["data"], dict)
                  and 0 < len(list(leaves(t["data"]))) <= MAX_LEAVES]
        for instance in usable[:instances]:
            if len(items) == limit:
                return items
            items.append(Item(case.id, schema, instance, prompt_for(schema, render_prose(instance))))
    return items


def same(a: Any, b: Any) -> bool:
    """JSON equality (``True`` is not ``1``; ``1`` is ``1.0``)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or (
        type(a) in (int, float) and type(b) in (int, float) and a == b)


def score(item: Item, text: str, finish_reason: str) -> dict[str, Any]:
    """One output's row: finished, parsed, schema-valid, fields right (of the reference's), exact, invented,
    and the output itself beside its reference (``--jsonl`` keeps them, to read what a user would)."""
    ref = dict(leaves(item.reference))
    row: dict[str, Any] = {"id": item.id, "finished": finish_reason == "stop", "parsed": False, "valid": False,
                           "fields": len(ref), "right": 0, "exact": False, "invented": False,
                           "text": text, "reference": item.reference}
    try:
        out = json.loads(text)
    except json.JSONDecodeError:
        return row
    got = dict(leaves(out))
    known = set(key_paths(item.reference))
    row.update(parsed=True, valid=make_checker(item.schema, False, DEFAULT_DATA)(out)[0],
               right=sum(1 for p, v in ref.items() if p in got and same(got[p], v)),
               exact=same(out, item.reference), invented=any(p not in known for p in key_paths(out)))
    return row


def configurations() -> dict[str, dict[str, Any]]:
    """Request keyword arguments per configuration (the schema is filled in per item)."""
    from constrain.engine.constraints import JSON_SCHEMA_SEMANTICS

    return {
        "constrain, defaults": {"json_options": None},
        "constrain, full semantics": {"json_options": dict(JSON_SCHEMA_SEMANTICS)},
        "unconstrained": {},
    }


class StrictXGrammar(XGrammar):
    """xgrammar in its strict mode (no undeclared keys; the bench adapter's default is off)."""

    options = XGrammar.options.replace("strict_mode=False", "strict_mode=True")

    def compile(self, schema: Any) -> Any:
        import xgrammar as xgr

        cg = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                               strict_mode=True)
        return _FactoryCompiled(lambda: _StdMatcher(xgr.GrammarMatcher(cg)))


ANCHORS: dict[str, type[Any]] = {
    "xgrammar, strict_mode=False": XGrammar,
    "xgrammar, strict_mode=True": StrictXGrammar,
    "llguidance": LLGuidance,
}


def compiles(engine: Any, item: Item, configs: dict[str, dict[str, Any]]) -> bool:
    from constrain.engine.constraints import Constraint
    from constrain.grammars.errors import GrammarError

    try:
        for kw in configs.values():
            if "json_options" in kw:
                engine.compile(Constraint.from_args(item.schema, json_options=kw["json_options"]))
    except GrammarError:
        return False
    return True


def run(engine: Any, items: list[Item], kwargs: dict[str, Any], max_tokens: int) -> tuple[list[dict[str, Any]], float]:
    from constrain.engine.api import Request

    reqs = [Request(it.prompt, json_schema=it.schema if "json_options" in kwargs else None,
                    json_options=kwargs.get("json_options"), max_tokens=max_tokens) for it in items]
    t0 = time.perf_counter()
    results = engine.run(reqs)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for r in results)
    return [score(it, r.text, r.finish_reason) for it, r in zip(items, results)], tokens / elapsed


def anchor_tok(engine: Any) -> Tok:
    """The engine's vocabulary as the anchors' adapters read it (same bytes, stop ids and width)."""
    v = engine.vocab

    def encode(text: str) -> list[int]:
        return [int(i) for i in engine.tokenizer(text, add_special_tokens=False)["input_ids"]]

    return Tok(engine.loaded.name, v, list(v.token_bytes), tuple(v.eos_token_ids), int(v.vocab_size), encode)


def run_anchor(engine: Any, items: list[Item], adapter: Any, max_tokens: int) -> tuple[list[dict[str, Any]], float]:
    """An anchor's matchers behind the scheduler's verbs, through the engine's own scheduler
    (no forced text and no budget-aware close: the anchors have neither)."""
    from constrain.engine.generate import run_requests
    from constrain.engine.sampler import SamplingParams
    from constrain.engine.types import GenerationRequest

    eos = tuple(engine.vocab.eos_token_ids)
    matchers: list[Any] = []
    for it in items:
        try:
            matchers.append(AnchorMatcher(adapter.compile(it.schema).matcher(), eos))
        except Exception as exc:  # the anchors raise their own types for schemas they reject
            print(f"{adapter.name}: {it.id} does not compile: {str(exc)[:120]}", file=sys.stderr)
            matchers.append(None)
    reqs = [GenerationRequest(engine.loaded.encode_prompt(it.prompt), None, SamplingParams(0.0), max_tokens,
                              frozenset(eos), force_tokens=False, budget_close=False, matcher=m)
            for it, m in zip(items, matchers) if m is not None]
    t0 = time.perf_counter()
    # The Engine has no public entry for ready matchers: its own scheduler, driven directly.
    results = iter(run_requests(engine._scheduler(reqs), reqs) if reqs else [])
    elapsed = time.perf_counter() - t0
    rows, tokens = [], 0
    for it, m in zip(items, matchers):
        if m is None:
            rows.append(score(it, "", "error"))
            continue
        r = next(results)
        tokens += len(r.token_ids)
        rows.append(score(it, r.text, r.finish_reason))
    return rows, tokens / elapsed


HEADER = ("| configuration | finished | parsed | schema-valid | fields right | exact objects | invented keys "
          "| tokens/s |\n|---|--:|--:|--:|--:|--:|--:|--:|")


def table_row(name: str, rows: list[dict[str, Any]], tps: float) -> str:
    def count(key: str) -> int:
        return sum(1 for r in rows if r[key])

    right = 100 * sum(r["right"] for r in rows) / max(sum(r["fields"] for r in rows), 1)
    return (f"| {name} | {count('finished')} | {count('parsed')} | {count('valid')} | {right:.1f}% "
            f"| {count('exact')} | {count('invented')} | {tps:.0f} |")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--limit", type=int, default=100, help="items")
    p.add_argument("--subsets", default=DEFAULT_SUBSETS, help="JSONSchemaBench subsets, round-robin")
    p.add_argument("--model", default=None, help="model folder (default: the SmolLM2-135M-Instruct demo)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--anchors", action=argparse.BooleanOptionalAction, default=True,
                   help="also xgrammar (strict and not) and llguidance, through the same scheduler")
    p.add_argument("--jsonl", default=None, help="append every item's row here")
    args = p.parse_args(argv)

    from constrain.engine.api import Engine

    engine = Engine.from_pretrained(args.model, device=args.device, max_batch=args.batch_size)
    configs = configurations()
    items: list[Item] = []
    skipped = 0
    for it in load_items([s.strip() for s in args.subsets.split(",") if s.strip()], 10 * args.limit):
        if len(items) == args.limit:
            break
        if compiles(engine, it, configs):
            items.append(it)
        else:
            skipped += 1
    print(f"{len(items)} items ({skipped} candidates left out: constrain cannot compile their schema); model {engine.loaded.name} on {args.device} ({engine.backend}), greedy, "
          f"max_tokens {args.max_tokens}", file=sys.stderr)
    runs: list[tuple[str, Any]] = [(name, lambda kw=kw: run(engine, items, kw, args.max_tokens))
                                   for name, kw in configs.items()]
    if args.anchors:
        tok = anchor_tok(engine)
        runs += [(name, lambda cls=cls: run_anchor(engine, items, cls(tok), args.max_tokens))
                 for name, cls in ANCHORS.items()]
    print(HEADER, flush=True)
    for name, go in runs:  # each row as soon as it is measured: a slow slice still reports
        rows, tps = go()
        print(table_row(name, rows, tps), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as f:
                f.writelines(json.dumps({"configuration": name, **row}) + "\n" for row in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
