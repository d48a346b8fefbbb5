"""Whether a value satisfies a subschema, per the ``jsonschema`` package: the front end's oracle.

The normalizer asks it where a keyword has no exact shape (enums under other keywords, ``oneOf``
branches that may overlap). It holds no reference to the translator: a translation's objects
form no cycle, so they go as soon as the grammar is built rather than at Python's next full
collection (a server's latency, paid by whichever request runs then).
"""

from __future__ import annotations

from typing import Any, Literal

from constrain.grammars.json_schema.document import ANNOTATIONS, Document, Sub

__all__ = ["ValidityOracle"]

# Keywords that assert nothing: a schema made only of these accepts every value.
_ANNOTATIONS = ANNOTATIONS | {"$schema", "$id", "id", "$anchor", "$defs", "definitions", "contentMediaType",
                              "contentEncoding"}
_TYPE_NAMES = frozenset({"null", "boolean", "object", "array", "string", "number", "integer"})


def _type_says(value: Any, type_: Any) -> bool | None:
    """Whether JSON ``value`` satisfies ``{"type": type_}``, where every draft agrees (None where
    they differ, an integral float against "integer", or for a malformed ``type``)."""
    names = [type_] if isinstance(type_, str) else type_
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in _TYPE_NAMES for n in names):
        return None
    if isinstance(value, bool):
        kind = "boolean"
    elif value is None:
        kind = "null"
    elif isinstance(value, str):
        kind = "string"
    elif isinstance(value, list):
        kind = "array"
    elif isinstance(value, dict):
        kind = "object"
    elif isinstance(value, int):
        return "integer" in names or "number" in names
    elif isinstance(value, float):
        if "number" in names:
            return True
        return None if value.is_integer() and "integer" in names else False
    else:
        return None
    return kind in names


class ValidityOracle:
    """``valid(value, sub)`` for the subschemas of one document, its validator made once."""

    def __init__(self, doc: Document, format_mode: Literal["enforce", "annotation"]) -> None:
        self.doc = doc
        self.format_mode = format_mode
        self._root: Any = None  # the document's validator, made on first use
        self._stripped: dict[int, dict] = {}

    def valid(self, value: Any, sub: Sub, strip_enum: bool = False) -> bool | None:
        """Whether ``value`` satisfies ``sub`` per the ``jsonschema`` package (None: cannot tell).

        ``strip_enum``: the caller has checked ``enum``/``const`` already (they are slow to recheck).
        """
        if sub.schema is True:
            return True
        if sub.schema is False:
            return False
        schema = sub.schema
        if strip_enum and ("enum" in schema or "const" in schema):
            stripped = self._stripped.get(id(schema))
            if stripped is None:
                stripped = self._stripped[id(schema)] = {k: v for k, v in schema.items() if k not in ("enum", "const")}
            schema = stripped
            if not schema.keys() - _ANNOTATIONS:
                return True
        if isinstance(schema, dict) and "type" in schema and not schema.keys() - _ANNOTATIONS - {"type"}:
            verdict = _type_says(value, schema["type"])
            if verdict is not None:  # the usual enum + type: no validator needed
                return verdict
        try:
            validator = self._validator()
            check = validator.evolve(schema=schema)
            return not any(True for _ in check.iter_errors(value))
        except Exception:  # unresolvable reference, unknown dialect, recursion...
            return None

    def _validator(self) -> Any:
        v = self._root
        if v is None:
            import jsonschema

            root = self.doc.root
            cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
            checker = cls.FORMAT_CHECKER if self.format_mode == "enforce" else None
            try:
                from referencing import Registry, Resource
                from referencing.jsonschema import DRAFT202012, specification_with
            except ImportError:  # jsonschema < 4.18 resolves local references by itself
                v = cls(root, format_checker=checker)
            else:
                spec = specification_with(cls.META_SCHEMA.get("$schema", ""), default=DRAFT202012)
                resource = spec.create_resource(root)
                doc = self.doc

                def retrieve(uri: str) -> Any:
                    contents = doc.remote_contents(uri)
                    if contents is None:
                        raise LookupError(f"no remote schema {uri!r}")  # the registry reports it unretrievable
                    return Resource.from_contents(contents, default_specification=spec)

                # referencing's own attrs wrapper hides the class's keywords from mypy
                registry = Registry(retrieve=retrieve).with_resources(  # type: ignore[call-arg]
                    [(self.doc.root_sub.base, resource), ("", resource)])
                v = cls(root, registry=registry, format_checker=checker)
                if self.doc.root_sub.base != "":
                    v = v.evolve(_resolver=registry.resolver(base_uri=self.doc.root_sub.base))
            self._root = v
        return v
