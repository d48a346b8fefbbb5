"""JSON values written out as IR: for ``enum``/``const`` and for excluding values under ``not``.

``value_ir`` is the compact spelling (what we generate: object keys in the order given), plus, on
request, the ``1.0`` spelling of an integral number (JSON Schema holds ``1 == 1.0``, but draft-04's
``"type": "integer"`` rejects ``1.0``, so the caller decides). ``complete_value_ir``
admits every spelling the generated grammar could produce for the value (string escapes, numbers
without exponents, whitespace between tokens), so that its complement is a sound "not this value".
"""

from __future__ import annotations

import json
from typing import Any

from constrain.grammars.ir import NOTHING, Node, alt, literal, seq
from constrain.grammars.json_schema.json_strings import char_spellings, string_literal

__all__ = ["value_ir", "complete_value_ir", "dedupe_values", "json_equal", "hashable", "Incomplete"]


class Incomplete(Exception):
    """The value has spellings (several key orders) that cannot all be listed."""


def json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: numbers by value (1 == 1.0), booleans distinct from numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def hashable(v: Any) -> Any:
    """A hashable key equal for JSON-equal values (1 and 1.0 alike, True and 1 apart)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, (int, float)):
        return ("num", v)  # 1 == 1.0 hash alike
    if isinstance(v, list):
        return ("list", tuple(hashable(x) for x in v))
    return ("dict", tuple(sorted((k, hashable(x)) for k, x in v.items())))


def dedupe_values(values: list[Any]) -> list[Any]:
    """``values`` without JSON-equal repeats, first occurrence kept (linear time)."""
    seen: set[Any] = set()
    out = []
    for v in values:
        h = hashable(v)
        if h not in seen:
            seen.add(h)
            out.append(v)
    return out


def _number_spellings(v: int | float, fraction: bool) -> list[str]:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        v = int(v)
    if isinstance(v, int):
        return [str(v), f"{v}.0"] if fraction else [str(v)]
    return [json.dumps(v)]


def is_integral(v: Any) -> bool:
    """A number with no fractional part (which has a second spelling, ``1.0``)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()


def value_ir(v: Any, ws: Node, comma: Node, colon: Node, fraction: bool = False) -> Node:
    """The spelling of ``v`` we generate (keys in given order), with ``ws``/separators between tokens.

    ``fraction`` also admits the ``1.0`` spelling of integral numbers (nested ones included).
    """
    if isinstance(v, bool) or v is None:
        return literal(json.dumps(v))
    if isinstance(v, (int, float)):
        return alt(*[literal(s) for s in _number_spellings(v, fraction)])
    if isinstance(v, str):
        return string_literal(v)
    if isinstance(v, list):
        if not v:
            return seq(literal("["), ws, literal("]"))
        items = []
        for i, x in enumerate(v):
            items += ([comma] if i else []) + [value_ir(x, ws, comma, colon, fraction)]
        return seq(literal("["), ws, *items, ws, literal("]"))
    if isinstance(v, dict):
        if not v:
            return seq(literal("{"), ws, literal("}"))
        items = []
        for i, (k, x) in enumerate(v.items()):
            items += ([comma] if i else []) + [string_literal(k), colon, value_ir(x, ws, comma, colon, fraction)]
        return seq(literal("{"), ws, *items, ws, literal("}"))
    raise TypeError(f"not a JSON value: {v!r}")


def complete_value_ir(v: Any, ws: Node, comma: Node, colon: Node) -> Node:
    """Every spelling of ``v`` our grammars can produce; raises ``Incomplete`` for objects with 2+ keys."""
    if isinstance(v, bool) or v is None:
        return literal(json.dumps(v))
    if isinstance(v, (int, float)):
        from constrain.grammars.json_schema.numbers import Bound, number_ir, to_decimal

        d = to_decimal(v)
        exact = number_ir(Bound(d), Bound(d))
        return exact if exact != NOTHING else NOTHING
    if isinstance(v, str):
        return seq(literal('"'), *[char_spellings(ord(c)) for c in v], literal('"'))
    if isinstance(v, list):
        items = []
        for i, x in enumerate(v):
            items += ([comma] if i else []) + [complete_value_ir(x, ws, comma, colon)]
        return seq(literal("["), ws, *items, ws, literal("]"))
    if isinstance(v, dict):
        if len(v) > 1:
            raise Incomplete()
        items = []
        for k, x in v.items():
            items += [complete_value_ir(k, ws, comma, colon), colon, complete_value_ir(x, ws, comma, colon)]
        return seq(literal("{"), ws, *items, ws, literal("}"))
    raise TypeError(f"not a JSON value: {v!r}")


