"""JSON Schema (draft-04 to 2020-12) -> grammar IR. See ``json_schema_to_grammar``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from constrain.grammars.errors import SchemaError
from constrain.grammars.ir import Grammar
from constrain.grammars.json_schema.document import load_schema
from constrain.grammars.json_schema.translate import Options, Translator

__all__ = ["json_schema_to_grammar", "translate_schema", "Options"]


def json_schema_to_grammar(
    schema: dict[str, Any] | bool | str,
    *,
    whitespace: Literal["compact", "flexible"] = "compact",
    max_whitespace: int = 4,
    indent: int | None = None,
    strict_properties: bool = False,
    lenient: bool = False,
    max_recursion_depth: int | None = None,
    format_mode: Literal["enforce", "annotation"] = "enforce",
    unknown_format: Literal["error", "ignore"] = "ignore",
    oneof_as_anyof: bool = False,
    remote_schemas: Mapping[str, Any] | Callable[[str], Any] | None = None,
    property_order: Literal["any", "declared"] = "any",
) -> Grammar:
    """The grammar of JSON documents that are valid against ``schema`` (a dict, bool or JSON text).

    Documents are compact JSON (``{"a":1,"b":[1,2]}``) unless ``whitespace="flexible"``, which
    admits runs of at most ``max_whitespace`` spaces/newlines/tabs around structural tokens.
    Object members come in any order, as JSON allows (each key at most once);
    ``property_order="declared"`` instead fixes declared keys in the order of ``properties`` and
    puts additional keys after them (what most engines generate). ``strict_properties`` forbids undeclared keys
    unless ``additionalProperties``/``patternProperties`` allow them explicitly. Bounded numbers
    and numbers with ``multipleOf`` are written without exponents; integers as plain digits.

    Soundness first: a keyword that cannot be enforced raises ``SchemaError`` naming it and its
    JSON pointer; ``lenient=True`` drops it instead and records a note in ``Grammar.notes``.
    ``oneof_as_anyof`` accepts any matching ``oneOf`` branch where exclusivity is undecidable.
    ``format_mode="annotation"`` ignores ``format``. A ``format`` this module does not know asserts
    nothing (the specification makes unknown formats annotations, and validators ignore them), so
    by default (``unknown_format="ignore"``) it is ignored with a note in ``Grammar.notes``;
    ``unknown_format="error"`` raises ``SchemaError`` instead. ``max_recursion_depth`` bounds how deep recursive
    ``$ref`` structures may nest. ``indent=n`` pretty prints exactly as ``json.dumps(value,
    indent=n)`` does (members on their own lines, ``": "`` after keys, ``[]``/``{}`` when empty);
    values may then nest at most 48 levels deep.

    An unsatisfiable schema raises ``UnsatisfiableSchemaError`` naming the first unsatisfiable place
    found; ``translate_schema`` leaves that question to the compiler, which raises the same.

    ``remote_schemas`` resolves ``$ref`` to other documents: a mapping from absolute URI (no
    fragment) to schema (dict, bool or JSON text), or a function taking the URI and returning the
    schema or None. Each such document keeps its own ``$id`` as the base of its references. Nothing
    is fetched from the network; a reference to a URI the registry does not know is a
    ``SchemaError`` naming the URI.
    """
    grammar = translate_schema(schema, whitespace=whitespace, max_whitespace=max_whitespace, indent=indent,
                               strict_properties=strict_properties, lenient=lenient,
                               max_recursion_depth=max_recursion_depth, format_mode=format_mode,
                               unknown_format=unknown_format, oneof_as_anyof=oneof_as_anyof,
                               remote_schemas=remote_schemas, property_order=property_order)
    grammar.check_satisfiable()
    return grammar


def translate_schema(schema: dict[str, Any] | bool | str, *, seconds: float | None = None, **options: Any) -> Grammar:
    """``json_schema_to_grammar`` (same options) without its satisfiability check, for callers that
    compile the grammar: the compiler measures the rules anyway, in C++, and raises the same error.
    ``seconds``: a time limit (``TimeLimitError`` past it; the compiler passes its budget's)."""
    unknown = sorted(set(options) - set(Options.__dataclass_fields__))
    if unknown:
        raise TypeError(f"json_schema_to_grammar() got an unexpected keyword argument {unknown[0]!r}")
    o = Options(**options)
    for name, value, allowed in (("whitespace", o.whitespace, ("compact", "flexible")),
                                 ("format_mode", o.format_mode, ("enforce", "annotation")),
                                 ("unknown_format", o.unknown_format, ("error", "ignore")),
                                 ("property_order", o.property_order, ("any", "declared"))):
        if value not in allowed:
            raise ValueError(f"json_schema_to_grammar({name}) must be one of {allowed}, not {value!r}")
    depth = 0 if o.max_recursion_depth is None else o.max_recursion_depth  # None: unbounded
    for name, number in (("max_whitespace", o.max_whitespace), ("max_recursion_depth", depth)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(f"json_schema_to_grammar({name}) must be a non-negative int, not {number!r}")
    if o.indent is not None and o.whitespace != "compact":
        raise SchemaError("indent (pretty printing) and whitespace='flexible' exclude each other", "")
    return Translator(load_schema(schema), o, seconds).run()
