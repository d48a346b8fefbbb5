"""Is a JSON Schema's grammar right on its labelled instances? The check behind
``tests/test_json_schema_corpus.py`` and ``bench/schema_coverage.py``.

For each schema: does it compile, is every valid instance accepted (serialized compactly with keys
in the order the generated grammar writes them), is every instance ``jsonschema`` rejects refused
(soundness). Membership is tested byte by byte on the derivative engine, not through a vocabulary.
"""

from __future__ import annotations

import collections
import json
import re
import signal
import sys
from collections.abc import Iterator
from typing import Any

from constrain.testing.corpus import remote_registry

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


def oracle(schema: Any) -> Any:
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER, registry=remote_registry())


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
    from constrain.grammars.errors import GrammarError, UnsatisfiableError
    from constrain.grammars.json_schema import json_schema_to_grammar

    counts = collections.Counter() if counts is None else counts
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        try:
            grammar = json_schema_to_grammar(schema, **options)
        except GrammarError as exc:
            if isinstance(exc, UnsatisfiableError) and not any(oracle(schema).is_valid(v) for v, _ in tests):
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
