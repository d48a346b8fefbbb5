"""User-facing constraint specs and their compilation against a model's vocabulary.

Why a small spec type: the API, CLI and HF processor all accept the same four kinds of
constraint (JSON Schema, regex, Lark grammar, a list of choices) and must reject ambiguous
combinations the same way. Compilation itself is constrain's (cached there per vocabulary).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import constrain
from constrain import CompiledGrammar, Vocabulary

ConstraintKind = Literal["json_schema", "regex", "grammar", "choices"]

# What generating JSON defaults to: declared properties in declaration order, and no undeclared
# keys unless the schema asks for them (``additionalProperties: true`` or a schema, or
# ``patternProperties``), as OpenAI's strict structured outputs and xgrammar's strict mode do.
# Under JSON Schema's open-object default a small model copies the schema from its prompt.
GENERATION_JSON_OPTIONS: Mapping[str, Any] = {"property_order": "declared", "strict_properties": True}
# ``json_options=JSON_SCHEMA_SEMANTICS``: what a validator accepts (any member order, open objects).
JSON_SCHEMA_SEMANTICS: Mapping[str, Any] = {"property_order": "any", "strict_properties": False}

# Metacharacters of the regex dialect; everything else is literal. (``re.escape`` also escapes
# spaces, '-', '#', '&', '~'..., which a smaller regex front end need not accept.)
_REGEX_META = set("\\.^$*+?{}[]|()")


def escape_literal(text: str) -> str:
    """Escape ``text`` so the regex matches exactly it."""
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


def choices_regex(choices: Sequence[str]) -> str:
    """An alternation of escaped literals: the output is exactly one of ``choices``."""
    if not choices:
        raise ValueError("choices must not be empty")
    if not all(isinstance(c, str) for c in choices):
        raise TypeError("choices must be strings")
    return "(?:" + "|".join(escape_literal(c) for c in dict.fromkeys(choices)) + ")"


def schema_dict(schema: Any) -> dict[str, Any] | bool:
    """A JSON Schema from a dict, JSON text or a pydantic model class."""
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, str):
        return json.loads(schema)
    if hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    raise TypeError(f"expected a JSON Schema dict, JSON text or a pydantic model, got {type(schema).__name__}")


@dataclass(frozen=True)
class Constraint:
    """One constraint: ``kind`` and its source (schema dict, pattern, grammar text, choices);
    ``options`` are JSON Schema front-end options (``constrain.compile_json_schema``'s keywords),
    over ``GENERATION_JSON_OPTIONS`` when built by ``from_args``."""

    kind: ConstraintKind
    source: Any
    start: str = "start"
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_args(
        cls,
        json_schema: Any = None,
        regex: str | None = None,
        grammar: str | None = None,
        choices: Sequence[str] | None = None,
        json_options: Mapping[str, Any] | None = None,
    ) -> Constraint | None:
        """At most one of the arguments; None when none is given (unconstrained). A JSON Schema
        gets ``GENERATION_JSON_OPTIONS`` with ``json_options`` over them."""
        given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex),
                                   ("grammar", grammar), ("choices", choices)) if v is not None}
        if len(given) > 1:
            raise ValueError(f"give at most one constraint, got {', '.join(sorted(given))}")
        if json_options and "json_schema" not in given:
            raise ValueError("json_options apply to a json_schema constraint only")
        if not given:
            return None
        kind, value = next(iter(given.items()))
        if kind == "json_schema":
            value = schema_dict(value)
            options = {**GENERATION_JSON_OPTIONS, **(json_options or {})}
            return cls(kind, value, options=tuple(sorted(options.items())))  # type: ignore[arg-type]
        if kind == "choices":
            value = tuple(value)
            choices_regex(value)  # validate early
        return cls(kind, value)  # type: ignore[arg-type]

    def compile(self, vocab: Vocabulary) -> CompiledGrammar:
        """Compile against ``vocab``; raises constrain's ``GrammarError`` subclasses on bad input."""
        if self.kind == "json_schema":
            return constrain.compile_json_schema(self.source, vocab, **dict(self.options))
        if self.kind == "regex":
            return constrain.compile_regex(self.source, vocab)
        if self.kind == "grammar":
            return constrain.compile_lark(self.source, vocab, start=self.start)
        return constrain.compile_regex(choices_regex(self.source), vocab)
