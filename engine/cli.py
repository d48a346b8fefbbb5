"""The ``constrain`` command: ``generate`` under a constraint, or ``compile`` to check one.

Everything the user passes is read and checked before the model loads (files exist, the schema
is JSON, the constraint compiles), so a typo fails in a second with a clear message and a
non-zero exit, never after minutes of generation. Output files are written to a temporary file
and renamed into place, so a failure never leaves half an output behind.

Exit codes: 0 success, 2 bad input (usage, files, constraint, model path), 3 some output ran out
of ``--max-tokens`` while ``--strict`` was given, 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

logger = logging.getLogger("constrain")

EXIT_BAD_INPUT = 2
EXIT_TRUNCATED = 3


class UsageError(Exception):
    """Bad user input: printed as ``constrain: error: ...`` with exit code 2."""


def _add_constraint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", help="JSON Schema file the output must validate against")
    g.add_argument("--regex", metavar="PATTERN", help="regular expression the whole output must match")
    g.add_argument("--grammar", metavar="FILE", help="Lark grammar file (or the name of a built-in grammar)")
    g.add_argument("--choice", action="append", metavar="TEXT", help="allowed output (repeat for each choice)")
    p.add_argument("--property-order", choices=("any", "declared"), default=None,
                   help="with --json-schema: object members in any order (default) or in the order of 'properties'")
    p.add_argument("--strict-properties", action="store_true",
                   help="with --json-schema: no keys beyond the declared ones unless the schema allows them explicitly")
    p.add_argument("--model", metavar="PATH", help="model folder or .gguf file (default: SmolLM2-135M-Instruct demo)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v: progress info, -vv: debug")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="constrain", description="Structured-output constrained decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text that satisfies a constraint")
    _add_constraint_args(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable)")
    src.add_argument("--input", metavar="FILE", help='JSONL of prompts: {"prompt": ...} or a JSON string per line')
    gen.add_argument("--output", metavar="FILE", help="write JSONL results here (default: stdout)")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--system", metavar="TEXT", help="system prompt for chat models")
    gen.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    gen.add_argument("--batch-size", type=int, default=None, help="most sequences decoded at once")
    gen.add_argument("--strict", action="store_true", help="exit 3 if any output ran out of --max-tokens")

    comp = sub.add_parser("compile", help="check that a constraint compiles; report notes")
    _add_constraint_args(comp)
    return parser


# -- input checking (before any model loads) ------------------------------------------------------
def _read_text(path: str, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} file not found: {path}")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} file {path}: {exc}") from exc


def _grammar_text(arg: str) -> str:
    if Path(arg).is_file():
        return _read_text(arg, "grammar")
    from constrain import grammars

    builtin = Path(grammars.__file__).parent / f"{arg}.lark"
    if builtin.is_file():
        return builtin.read_text(encoding="utf-8")
    raise UsageError(f"grammar file not found: {arg}")


def constraint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The constraint as ``Engine.generate`` keyword arguments (empty: unconstrained)."""
    options = {k: v for k, v in (("property_order", args.property_order),
                                 ("strict_properties", args.strict_properties or None)) if v is not None}
    if options and not args.json_schema:
        raise UsageError("--property-order and --strict-properties need --json-schema")
    if args.json_schema:
        text = _read_text(args.json_schema, "JSON Schema")
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{args.json_schema} is not valid JSON: {exc}") from exc
        return {"json_schema": schema, "json_options": options} if options else {"json_schema": schema}
    if args.regex is not None:
        return {"regex": args.regex}
    if args.grammar:
        return {"grammar": _grammar_text(args.grammar)}
    if args.choice:
        return {"choices": list(args.choice)}
    return {}


def read_prompts(path: str) -> list[dict[str, Any]]:
    """Prompts from JSONL: each line a JSON string or an object with a string ``prompt``."""
    items = []
    for n, line in enumerate(_read_text(path, "input").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{n}: not valid JSON: {exc}") from exc
        if isinstance(obj, str):
            obj = {"prompt": obj}
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise UsageError(f'{path}:{n}: expected a JSON string or an object with a string "prompt"')
        items.append(obj)
    if not items:
        raise UsageError(f"{path}: no prompts")
    return items


def _check_numbers(args: argparse.Namespace) -> None:
    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be >= 1")
    if args.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    if not 0 < args.top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    if args.top_k < 0:
        raise UsageError("--top-k must be >= 0")
    if args.batch_size is not None and args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    if args.output and args.input and Path(args.output).resolve() == Path(args.input).resolve():
        raise UsageError("--output must not be the --input file")
    if args.output and not Path(args.output).resolve().parent.is_dir():
        raise UsageError(f"output folder does not exist: {Path(args.output).parent}")


def _compile_or_fail(vocab: Any, kwargs: dict[str, Any]) -> Any:
    from constrain.engine.constraints import Constraint
    from constrain.grammars.errors import GrammarError

    try:
        c = Constraint.from_args(**kwargs)
        return None if c is None else c.compile(vocab)
    except (GrammarError, ValueError, TypeError) as exc:
        raise UsageError(f"constraint does not compile: {exc}") from exc


# -- commands -------------------------------------------------------------------------------------
def _write_jsonl_atomic(path: str, rows: Sequence[dict[str, Any]]) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.resolve().parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            _dump_rows(f, rows)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _dump_rows(f: TextIO, rows: Sequence[dict[str, Any]]) -> None:
    for row in rows:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


def cmd_generate(args: argparse.Namespace) -> int:
    from constrain.engine.model import ModelLoadError

    _check_numbers(args)
    kwargs = constraint_kwargs(args)
    items = read_prompts(args.input) if args.input else [{"prompt": p} for p in args.prompt]
    from constrain.engine.api import Engine, Request

    try:
        engine = Engine.from_pretrained(args.model, device=args.device, max_batch=args.batch_size)
    except ModelLoadError as exc:
        raise UsageError(str(exc)) from exc
    _compile_or_fail(engine.vocab, kwargs)
    reqs = [
        Request(it["prompt"], max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, seed=None if args.seed is None else args.seed + i,
                system=it.get("system", args.system), **kwargs)
        for i, it in enumerate(items)
    ]
    from tqdm import tqdm

    bar = tqdm(total=len(reqs), unit="prompt", disable=args.input is None or None, file=sys.stderr)
    t0 = time.perf_counter()
    try:
        results = engine.run(reqs, on_result=lambda i, r: bar.update(1))
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    rows = []
    for it, res in zip(items, results):
        row = {k: v for k, v in it.items() if k != "prompt"}
        row.update(prompt=it["prompt"], text=res.text, finish_reason=res.finish_reason, valid=res.valid,
                   completion_tokens=len(res.token_ids))
        if "json_schema" in kwargs and res.valid:
            row["json"] = json.loads(res.text)
        rows.append(row)
    if args.output:
        _write_jsonl_atomic(args.output, rows)
    else:
        _dump_rows(sys.stdout, rows)
    n_tok = sum(len(r.token_ids) for r in results)
    logger.info("%d prompts, %d tokens in %.1f s (%.1f tok/s)", len(results), n_tok, elapsed, n_tok / max(elapsed, 1e-9))
    cut = sum(1 for r in results if r.finish_reason == "length")
    if cut:
        print(f"constrain: warning: {cut} of {len(results)} outputs hit --max-tokens {args.max_tokens} "
              "before completing (finish_reason \"length\", valid false)", file=sys.stderr)
        if args.strict:
            return EXIT_TRUNCATED
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from constrain import Vocabulary, allocate_token_bitmask
    from constrain.engine.model import ModelLoadError, load_tokenizer

    kwargs = constraint_kwargs(args)
    if not kwargs:
        raise UsageError("compile needs one of --json-schema, --regex, --grammar, --choice")
    try:
        tokenizer, width = load_tokenizer(args.model)
    except ModelLoadError as exc:
        raise UsageError(str(exc)) from exc
    vocab = Vocabulary.from_hf(tokenizer, vocab_size=width)
    t0 = time.perf_counter()
    grammar = _compile_or_fail(vocab, kwargs)
    t1 = time.perf_counter()
    matcher = grammar.matcher()
    bitmask = allocate_token_bitmask(1, vocab.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
    t2 = time.perf_counter()
    allowed = int(sum(bin(int(w) & 0xFFFFFFFF).count("1") for w in bitmask[0].tolist()))
    kind = next(iter(kwargs)).replace("_", " ")
    print(f"ok: {kind} compiled against {vocab.name} ({vocab.vocab_size} tokens) in {1000 * (t1 - t0):.1f} ms")
    print(f"first mask: {allowed} tokens allowed, {1000 * (t2 - t1):.1f} ms")
    forced = matcher.find_jump_forward_bytes()
    if forced:
        print(f"forced prefix: {forced.decode('utf-8', 'replace')!r}")
    for note in grammar.notes:
        print(f"note: {note}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``constrain`` console script."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("constrain").setLevel(level)
    try:
        return cmd_generate(args) if args.command == "generate" else cmd_compile(args)
    except UsageError as exc:
        print(f"constrain: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("constrain: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:  # unexpected: one line by default, the traceback with -vv
        if args.verbose >= 2:
            raise
        print(f"constrain: internal error: {type(exc).__name__}: {exc} (run with -vv for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
