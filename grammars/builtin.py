"""Built-in Lark grammars (``grammars/*.lark``) and the tool-call grammar builder.

``load(name)`` returns a grammar's text (for lark itself, or to adapt); ``builtin_grammar(name)``
its IR. The built-ins can also be imported from other Lark grammars: ``%import json.value``.

- ``json``: any JSON value, with bounded whitespace (see the file's header).
- ``sql_select``: a SQL SELECT subset (joins, WHERE, GROUP BY, HAVING, ORDER BY, LIMIT).
- ``expr``: arithmetic/boolean expressions with precedence, calls and parentheses.
- ``tool_call``: ``{"name": ..., "arguments": {...}}``; ``tool_call_grammar(tools)`` binds the
  names and argument schemas of a set of tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache, partial
from importlib import resources
from typing import Any

from constrain.grammars import ir
from constrain.grammars.analysis import RefMapper, reachable_rules
from constrain.grammars.errors import GrammarError
from constrain.grammars.lark_frontend import lark_to_grammar

__all__ = ["names", "load", "builtin_grammar", "tool_call_grammar"]


def names() -> tuple[str, ...]:
    """The built-in grammars' names."""
    files = resources.files("grammars").iterdir()
    return tuple(sorted(f.name[: -len(".lark")] for f in files if f.name.endswith(".lark")))


def load(name: str) -> str:
    """The Lark text of built-in grammar ``name`` (e.g. ``"json"``)."""
    path = resources.files("grammars").joinpath(f"{name}.lark")
    if not path.is_file():
        raise GrammarError(f"no built-in grammar {name!r}; there are {', '.join(names())}")
    return path.read_text(encoding="utf-8")


@cache
def builtin_grammar(name: str, start: str = "start") -> ir.Grammar:
    """The IR of built-in grammar ``name``."""
    return lark_to_grammar(load(name), start=start)


def _prefixed(prefix: str, name: str) -> ir.Node:
    return ir.ref(prefix + name)


def tool_call_grammar(tools: Mapping[str, dict[str, Any] | bool], **schema_options: Any) -> ir.Grammar:
    """``{"name": N, "arguments": A}`` where N is one of ``tools`` and A satisfies N's JSON Schema.

    ``tools`` maps tool names to JSON Schemas of their arguments. Each schema is compiled with
    ``grammars.json_schema.json_schema_to_grammar(schema, **schema_options)`` (so the arguments'
    whitespace is that front end's: compact unless ``whitespace="flexible"``; the envelope's is
    json.lark's bounded whitespace) and its rules are merged under the prefix ``tool<i>:``. The
    name and the arguments are bound together: a tool's arguments are checked against that
    tool's schema only.
    """
    from constrain.grammars.json_schema import json_schema_to_grammar

    if not tools:
        raise GrammarError("tool_call_grammar needs at least one tool")
    base = builtin_grammar("tool_call")
    rules = dict(base.rules)
    call = rules["call"]
    notes = list(base.notes)
    alternatives = []
    for i, (tool, schema) in enumerate(tools.items()):
        if not isinstance(tool, str) or not tool:
            raise GrammarError(f"tool names must be non-empty strings, got {tool!r}")
        sub = json_schema_to_grammar(schema, **schema_options)
        prefix = f"tool{i}:"
        rename = RefMapper(partial(_prefixed, prefix))
        for name, body in sub.rules.items():
            rules[prefix + name] = rename(body)
        notes += [f"tool {tool!r}: {note}" for note in sub.notes]
        bound = {"tool_name": ir.literal(json.dumps(tool, ensure_ascii=False)),
                 "arguments": ir.ref(prefix + sub.start)}
        bind = RefMapper(bound.get)
        alternatives.append(bind(call))
    rules["call"] = ir.alt(*alternatives)
    used = reachable_rules(rules, base.start)
    return ir.Grammar({k: v for k, v in rules.items() if k in used}, base.start, notes=tuple(notes))
