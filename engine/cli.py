"""The ``constrain`` command: ``generate`` under a constraint, or ``compile`` to check one.

Everything the user passes is read and checked before the model loads (files exist, the schema
is JSON, numbers are in range) and the constraint is compiled before any generation, so a typo
fails early with a clear message and a non-zero exit, never after minutes of generation. Output files are written to a temporary file
and renamed into place, so a failure never leaves half an output behind.

Exit codes: 0 success, 2 bad input (usage, files, constraint, model path),
3 some output ran out of ``--max-tokens`` while ``--strict`` was given, 4 some request failed
alone (``finish_reason`` "error", e.g. a prompt longer than the model's context; every other
row is still written), 1 anything unexpected (one line; the traceback with -vv).
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
from urllib.parse import urlsplit

logger = logging.getLogger("constrain")

EXIT_BAD_INPUT = 2
EXIT_TRUNCATED = 3
EXIT_FAILED = 4


class UsageError(Exception):
    """Bad user input: printed as ``constrain: error: ...`` with exit code 2."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def _add_constraint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE|JSON",
                   help="JSON Schema the output must validate against: a file, or the schema itself as inline JSON")
    g.add_argument("--regex", metavar="PATTERN", help="regular expression the whole output must match")
    g.add_argument("--grammar", metavar="FILE", help="Lark grammar file (or the name of a built-in grammar)")
    g.add_argument("--choice", action="append", metavar="TEXT", help="allowed output (repeat for each choice)")
    js = p.add_argument_group("JSON Schema options (with --json-schema)")
    js.add_argument("--property-order", choices=("any", "declared"), default=None,
                    help="object members in the order of 'properties' (the default when generating) or in any order")
    js.add_argument("--strict-properties", action=argparse.BooleanOptionalAction, default=None,
                    help="no keys beyond the declared ones unless the schema allows them explicitly "
                         "(the default when generating; --no-strict-properties for JSON Schema's open objects)")
    js.add_argument("--full-semantics", action="store_true",
                    help="full JSON Schema semantics: members in any order, undeclared keys where the schema "
                         "does not forbid them (what a validator accepts)")
    js.add_argument("--lenient", action="store_true",
                    help="drop keywords that cannot be enforced (each one listed as a note) instead of failing")
    js.add_argument("--oneof-as-anyof", action="store_true",
                    help="accept any matching oneOf branch where exclusivity cannot be enforced")
    js.add_argument("--remote-schemas", metavar="DIR",
                    help="resolve $ref to other documents from the JSON files in DIR (by their $id, "
                         "else by the URL's path under DIR); nothing is ever fetched")
    js.add_argument("--format-mode", choices=("enforce", "annotation"), default=None,
                    help="'format' is enforced (default) or only an annotation")
    p.add_argument("--model", metavar="PATH", help="model folder or .gguf file (default: SmolLM2-135M-Instruct demo)")
    p.add_argument("-v", "--verbose", action="count", default=0, help="-v: progress info, -vv: debug and tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="constrain", description="Structured-output constrained decoding.",
                                     formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text that satisfies a constraint", formatter_class=_HelpFormatter,
                         description="Generate text that satisfies a constraint (unconstrained without one).")
    _add_constraint_args(gen)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeatable)")
    src.add_argument("--input", metavar="FILE", help='JSONL of prompts: {"prompt": ...} or a JSON string per line')
    gen.add_argument("--output", metavar="FILE", help="write JSONL results here (default: stdout)")
    gen.add_argument("--max-tokens", metavar="N", type=int, default=256, help="most tokens per output, the stop token included")
    gen.add_argument("--temperature", metavar="T", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-p", metavar="P", type=float, default=1.0, help="nucleus sampling mass")
    gen.add_argument("--top-k", metavar="K", type=int, default=0, help="sample among the k likeliest tokens (0: all)")
    gen.add_argument("--seed", metavar="SEED", type=int, default=None, help="seed of prompt i is SEED + i")
    gen.add_argument("--system", metavar="TEXT", help="system prompt for chat models")
    gen.add_argument("--device", metavar="DEVICE", default="cpu", help="cpu or cuda[:N]")
    gen.add_argument("--batch-size", metavar="N", type=int, default=None, help="most sequences decoded at once "
                                                                    "(default: 16 on CPU, 64 on CUDA)")
    gen.add_argument("--speculative", choices=("off", "forced", "lookup", "forced+lookup"), default="off",
                     help="draft and verify several tokens per step (the grammar's forced text, prompt lookup): "
                          "the same outputs (greedy: the same tokens) in fewer steps")
    gen.add_argument("--strict", action="store_true", help="exit 3 if any output ran out of --max-tokens")
    gen.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bars on stderr (default: when stderr is a terminal)")

    comp = sub.add_parser("compile", help="check that a constraint compiles; report notes",
                          formatter_class=_HelpFormatter,
                          description="Check that a constraint compiles against a model's vocabulary (no weights "
                                      "are loaded) and report its first mask and notes.")
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


def _json_schema(arg: str) -> Any:
    """``--json-schema``: inline JSON when it looks like JSON (``{...}``, ``true``, ``false``), else a file."""
    inline = arg.lstrip().startswith("{") or arg.strip() in ("true", "false")
    what = "inline JSON Schema" if inline else arg
    text = arg if inline else _read_text(arg, "JSON Schema")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc}") from exc


class RemoteSchemaDir:
    """``--remote-schemas DIR`` as the compiler's ``remote_schemas`` callable: URI -> schema or None.

    A document is found by its ``$id`` (every ``*.json`` under DIR is indexed once), else at the
    URI's path under DIR (``http://host/a/b.json`` -> ``DIR/a/b.json``).
    """

    def __init__(self, folder: str) -> None:
        self.root = Path(folder)
        if not self.root.is_dir():
            raise UsageError(f"--remote-schemas folder not found: {folder}")
        self.by_id: dict[str, Any] = {}
        for path in sorted(self.root.rglob("*.json")):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise UsageError(f"--remote-schemas: cannot read {path}: {exc}") from exc
            if isinstance(doc, dict) and isinstance(doc.get("$id"), str):
                self.by_id.setdefault(doc["$id"].rstrip("#"), doc)

    def __call__(self, uri: str) -> Any:
        if uri.rstrip("#") in self.by_id:
            return self.by_id[uri.rstrip("#")]
        path = (self.root / urlsplit(uri).path.lstrip("/")).resolve()
        if path.is_file() and path.is_relative_to(self.root.resolve()):
            return json.loads(path.read_text(encoding="utf-8"))
        return None


def json_options(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON Schema compiler options the flags ask for (over the engine's generation defaults)."""
    options: dict[str, Any] = {}
    if args.full_semantics:
        from constrain.engine.constraints import JSON_SCHEMA_SEMANTICS

        options.update(JSON_SCHEMA_SEMANTICS)
    flags = (("property_order", args.property_order), ("strict_properties", args.strict_properties),
             ("lenient", args.lenient or None), ("oneof_as_anyof", args.oneof_as_anyof or None),
             ("format_mode", args.format_mode))
    options.update({k: v for k, v in flags if v is not None})
    if args.remote_schemas:
        options["remote_schemas"] = RemoteSchemaDir(args.remote_schemas)
    return options


def constraint_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The constraint as ``Engine.generate`` keyword arguments (empty: unconstrained)."""
    options = json_options(args)
    if options and not args.json_schema:
        raise UsageError("the JSON Schema options (--property-order, --strict-properties, --full-semantics, "
                         "--lenient, --oneof-as-anyof, --remote-schemas, --format-mode) need --json-schema")
    if args.json_schema:
        schema = _json_schema(args.json_schema)
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
    from constrain.grammars.errors import GrammarError, SchemaError

    try:
        c = Constraint.from_args(**kwargs)
        return None if c is None else c.compile(vocab)
    except SchemaError as exc:
        raise UsageError(f"constraint does not compile: {exc}\n(the compiler's options on the command line: "
                         "--lenient, --oneof-as-anyof, --remote-schemas DIR, --format-mode)") from exc
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


def _progress(args: argparse.Namespace, **kwargs: Any) -> Any:
    """A tqdm bar on stderr, shown on a terminal or with ``--progress`` (never with ``--no-progress``)."""
    from tqdm import tqdm

    show = sys.stderr.isatty() if args.progress is None else args.progress
    return tqdm(file=sys.stderr, disable=not show, dynamic_ncols=True, **kwargs)


def cmd_generate(args: argparse.Namespace) -> int:
    from constrain.engine.model import ModelLoadError

    _check_numbers(args)
    kwargs = constraint_kwargs(args)
    items = read_prompts(args.input) if args.input else [{"prompt": p} for p in args.prompt]
    if any(not it["prompt"] for it in items):
        raise UsageError("prompts must not be empty")
    from constrain.engine.api import Engine, Request

    with _progress(args, desc="loading model", bar_format="{desc} {elapsed}") as bar:
        try:
            engine = Engine.from_pretrained(args.model, device=args.device, max_batch=args.batch_size,
                                            speculative=args.speculative)
        except ModelLoadError as exc:
            raise UsageError(str(exc)) from exc
        bar.set_description_str("compiling constraint")
        _compile_or_fail(engine.vocab, kwargs)
    reqs = [
        Request(it["prompt"], max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, seed=None if args.seed is None else args.seed + i,
                system=it.get("system", args.system), **kwargs)
        for i, it in enumerate(items)
    ]
    t0 = time.perf_counter()
    with _progress(args, total=len(reqs), unit="prompt", desc="generating") as bar:
        results = engine.run(reqs, on_result=lambda i, r: bar.update(1))
    elapsed = time.perf_counter() - t0
    rows = []
    for it, res in zip(items, results):
        row = {k: v for k, v in it.items() if k != "prompt"}
        row.update(prompt=it["prompt"], text=res.text, finish_reason=res.finish_reason, valid=res.valid,
                   completion_tokens=len(res.token_ids))
        if getattr(res, "error", None):
            row["error"] = res.error
        if "json_schema" in kwargs and res.valid:
            row["json"] = json.loads(res.text)
        rows.append(row)
    if args.output:
        _write_jsonl_atomic(args.output, rows)
    else:
        _dump_rows(sys.stdout, rows)
    n_tok = sum(len(r.token_ids) for r in results)
    logger.info("%d prompts, %d tokens in %.1f s (%.1f tok/s)", len(results), n_tok, elapsed, n_tok / max(elapsed, 1e-9))
    return _report_unfinished(args, items, results)


def _report_unfinished(args: argparse.Namespace, items: Sequence[dict[str, Any]], results: Sequence[Any]) -> int:
    """Warn on stderr about outputs that were cut or failed; the exit code says whether any was."""
    failed = [(n, r) for n, r in enumerate(results, 1) if r.finish_reason == "error"]
    for n, res in failed:
        where = f"{args.input}:{n}" if args.input else f"prompt {n}"
        print(f"constrain: error: {where}: {getattr(res, 'error', None) or 'generation failed'}", file=sys.stderr)
    cut = sum(1 for r in results if r.finish_reason == "length")
    if cut:
        print(f"constrain: warning: {cut} of {len(results)} outputs hit --max-tokens {args.max_tokens} "
              "before completing (finish_reason \"length\", valid false)", file=sys.stderr)
    if failed:
        return EXIT_FAILED
    return EXIT_TRUNCATED if cut and args.strict else 0


def cmd_compile(args: argparse.Namespace) -> int:
    from constrain import allocate_token_bitmask
    from constrain.engine.model import ModelLoadError, load_vocabulary

    kwargs = constraint_kwargs(args)
    if not kwargs:
        raise UsageError("compile needs one of --json-schema, --regex, --grammar, --choice")
    try:
        vocab = load_vocabulary(args.model)
    except ModelLoadError as exc:
        raise UsageError(str(exc)) from exc
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
