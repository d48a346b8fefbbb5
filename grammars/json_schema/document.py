"""The schema document: parsing, dialect, and ``$ref`` resolution within it and to other documents.

References are resolved the way the specification says: ``$id`` (``id`` in draft-04) sets the
base URI of its subtree, ``$anchor`` and plain-name ``$id`` fragments name subschemas, fragments
that start with ``/`` are JSON pointers (``~0``/``~1`` and %-escapes decoded). A reference to a
URI outside the document is looked up in the caller's registry (``remote_schemas``: a mapping
from URI to schema, or a function URI -> schema or None); the document found there is indexed
with its own ``$id`` (or the URI it was found under) as its base. Nothing is ever fetched from
the network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from constrain.grammars.errors import SchemaError

__all__ = ["Sub", "Document", "load_schema", "MAX_SCHEMA_DEPTH"]

DEFAULT_BASE = "urn:constrain:root"
# How many objects/arrays deep a schema document may nest. JSONSchemaBench's deepest is 26; the
# bound keeps every later stage (JSON parsing, literals, grammar analysis) far from Python's stack.
MAX_SCHEMA_DEPTH = 512
_POINTER_TOKENS_SHOWN = 6
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}

RemoteSchemas = Mapping[str, Any] | Callable[[str], Any] | None

# Dialects by the text their $schema URI contains; anything else reads as 2020-12.
DIALECTS = ("draft-03", "draft-04", "draft-06", "draft-07", "2019-09", "2020-12")
# Keywords this front end reads that a dialect does not define (what jsonschema's validator for
# that draft ignores). ``additionalItems`` stays in 2020-12 next to the array form of ``items``.
_SINCE_2019 = {"dependentRequired", "dependentSchemas", "unevaluatedProperties", "unevaluatedItems",
               "minContains", "maxContains"}
_SINCE_2020 = {"prefixItems", "$dynamicRef"}
_FOREIGN_KEYWORDS = {
    "draft-03": frozenset({"const", "contains", "propertyNames", "if", "then", "else"} | _SINCE_2019 | _SINCE_2020),
    "draft-04": frozenset({"const", "contains", "propertyNames", "if", "then", "else"} | _SINCE_2019 | _SINCE_2020),
    "draft-06": frozenset({"if", "then", "else"} | _SINCE_2019 | _SINCE_2020),
    "draft-07": frozenset(_SINCE_2019 | _SINCE_2020),
    "2019-09": frozenset({"dependencies"} | _SINCE_2020),
    "2020-12": frozenset({"dependencies"}),
}

# Keywords whose value is a schema / a list of schemas / a map of name -> schema.
SCHEMA_KEYWORDS = frozenset({
    "additionalProperties", "additionalItems", "items", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties", "contentSchema",
})
LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
MAP_KEYWORDS = frozenset({
    "properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies",
})
# Keywords that assert nothing about a value (what a translation never reads).
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "example", "$comment", "deprecated",
                         "readOnly", "writeOnly"})


@dataclass(frozen=True, eq=False)
class Sub:
    """A subschema together with where it lives: its base URI and JSON pointer (for messages)."""

    schema: Any
    base: str
    pointer: str

    def key(self) -> tuple[int, str]:
        return (id(self.schema), self.base)


def escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _own_base(node: dict, base: str, draft4: bool) -> str:
    ident = node.get("id" if draft4 and "$id" not in node else "$id")
    if isinstance(ident, str) and not ident.startswith("#"):
        return urldefrag(urljoin(base, ident))[0] or base
    return base


def _too_deep(what: str, pointer: str) -> SchemaError:
    return SchemaError(f"{what} nests objects and arrays more than {MAX_SCHEMA_DEPTH} levels deep (the limit)", pointer)


def _check_text_depth(text: str) -> None:
    """Refuse JSON text nested deeper than ``MAX_SCHEMA_DEPTH``, counted without parsing it.

    Escaped backslashes and quotes are dropped first so that the quotes left delimit strings; the
    brackets outside them are then counted by C-level string operations and one pass over them."""
    unquoted = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(unquoted.split('"')[::2])
    steps = map(_BRACKET_STEP.__getitem__, _NOT_BRACKET.sub("", outside))
    if max(accumulate(steps), default=0) > MAX_SCHEMA_DEPTH:
        raise _too_deep("the schema's JSON text", "")


def _check_depth(schema: Any) -> None:
    """Refuse a schema nested deeper than ``MAX_SCHEMA_DEPTH`` (or containing itself), iteratively.

    A walk that keeps only depths (each container's children pushed by one C-level ``extend``);
    where it finds a place too deep, ``_refuse_deep`` walks again to name it.
    """
    stack: list[tuple[Any, int]] = [(schema, 0)]
    pop, extend = stack.pop, stack.extend
    while stack:
        value, depth = pop()
        if isinstance(value, dict):
            children: Iterable[Any] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth >= MAX_SCHEMA_DEPTH:
            _refuse_deep(schema)
        extend(zip(children, repeat(depth + 1)))


def _refuse_deep(schema: Any) -> None:
    """``_check_depth``'s error, naming the first place too deep (each entry links to its parent,
    so the pointer is spelt only for that place)."""
    stack: list[tuple[Any, int, Any, str]] = [(schema, 0, None, "")]
    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[1]
        if isinstance(value, dict):
            children: Iterable[tuple[Any, Any]] = value.items()
        elif isinstance(value, list):
            children = enumerate(value)
        else:
            continue
        if depth >= MAX_SCHEMA_DEPTH:
            tokens = []
            while entry[2] is not None:
                tokens.append(escape_pointer(entry[3]))
                entry = entry[2]
            shown = "/".join(reversed(tokens[-_POINTER_TOKENS_SHOWN:]))
            raise _too_deep("the schema", f"#/{shown}/... ({len(tokens)} levels down)")
        stack.extend((child, depth + 1, entry, str(key)) for key, child in children)


def _sub_at(top: Sub, entry: tuple[Any, str, Any, tuple[str | int, ...]]) -> Sub:
    """The ``Sub`` of a ``Document._index`` walk entry: ``Document.child`` along its tokens."""
    if entry[2] is None:
        return top
    node, base = entry[0], entry[1]
    tokens: list[str | int] = []
    while entry[2] is not None:
        tokens.extend(reversed(entry[3]))
        entry = entry[2]
    return Sub(node, base, top.pointer + "".join("/" + escape_pointer(str(t)) for t in reversed(tokens)))


def load_schema(schema: Any) -> Any:
    """Accept a dict, a bool or JSON text; anything else is a ``SchemaError``."""
    if isinstance(schema, (bytes, bytearray)):
        schema = bytes(schema).decode(json.detect_encoding(schema), "surrogatepass")
    if isinstance(schema, str):
        _check_text_depth(schema)
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(
                f"schema is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", ""
            ) from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}", "")
    _check_depth(schema)
    return schema


class Document:
    """Index of every resource (``$id``) and anchor in the document, for ``$ref`` resolution."""

    def __init__(self, root: Any, remote_schemas: RemoteSchemas = None) -> None:
        self.root = root
        self.remote_schemas = remote_schemas
        # URI -> contents of every other document a reference led to (for the validation oracle).
        self.remotes: dict[str, Any] = {}
        meta = root.get("$schema", "") if isinstance(root, dict) else ""
        meta = meta if isinstance(meta, str) else ""
        self.dialect = next((d for d in DIALECTS if d in meta), "2020-12")
        self.draft3 = self.dialect == "draft-03"
        self.draft4 = self.dialect in ("draft-03", "draft-04")
        # $ref siblings are ignored up to draft-07.
        self.ref_overrides = self.dialect.startswith("draft-")
        self._foreign = _FOREIGN_KEYWORDS[self.dialect]
        self._own_keywords: dict[int, tuple[dict, dict]] = {}
        self.resources: dict[str, Sub] = {}
        self._negations: dict[tuple[int, str], Sub] = {}
        self.anchors: dict[tuple[str, str], Sub] = {}
        base = _own_base(root, DEFAULT_BASE, self.draft4) if isinstance(root, dict) else DEFAULT_BASE
        self.root_sub = Sub(root, base, "#")
        self.resources[base] = self.root_sub
        self.resources.setdefault(DEFAULT_BASE, self.root_sub)
        self._index(self.root_sub)

    def _index(self, top: Sub) -> None:
        """Record the resources and anchors below ``top``. The walk keeps each subschema as (schema,
        base, parent, tokens): its ``Sub`` (and pointer) is spelt only for what is recorded."""
        draft4 = self.draft4
        stack: list[tuple[Any, str, Any, tuple[str | int, ...]]] = [(top.schema, top.base, None, ())]
        while stack:
            entry = stack.pop()
            node, base = entry[0], entry[1]
            if not isinstance(node, dict):
                continue
            ident = node.get("id" if draft4 and "$id" not in node else "$id")
            if isinstance(ident, str):
                if ident.startswith("#") and len(ident) > 1:  # draft-04..07 plain-name fragment
                    self.anchors.setdefault((base, ident[1:]), _sub_at(top, entry))
                else:
                    self.resources.setdefault(base, _sub_at(top, entry))
                    frag = urldefrag(urljoin(base, ident))[1]
                    if frag and not frag.startswith("/"):
                        self.anchors.setdefault((base, frag), _sub_at(top, entry))
            for kw in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(kw), str):
                    self.anchors.setdefault((base, node[kw]), _sub_at(top, entry))
            for kw, value in node.items():
                if kw in ("enum", "const", "examples", "default"):
                    continue
                if kw in SCHEMA_KEYWORDS and isinstance(value, (dict, bool)):
                    stack.append((value, _own_base(value, base, draft4) if isinstance(value, dict) else base,
                                  entry, (kw,)))
                elif kw in LIST_KEYWORDS and isinstance(value, list):
                    stack.extend((v, _own_base(v, base, draft4) if isinstance(v, dict) else base, entry, (kw, i))
                                 for i, v in enumerate(value))
                elif kw in MAP_KEYWORDS and isinstance(value, dict):
                    stack.extend((v, _own_base(v, base, draft4) if isinstance(v, dict) else base, entry, (kw, k))
                                 for k, v in value.items() if isinstance(v, (dict, bool)))

    def child(self, sub: Sub, *tokens: str | int) -> Sub:
        """The subschema at ``tokens`` below ``sub``, with its own base URI."""
        node, pointer = sub.schema, sub.pointer
        for t in tokens:
            node = node[t]
            pointer += "/" + escape_pointer(str(t))
        base = _own_base(node, sub.base, self.draft4) if isinstance(node, dict) else sub.base
        return Sub(node, base, pointer)

    def keywords(self, schema: Any) -> Any:
        """``schema`` without the keywords its dialect does not have (annotations there, as
        validators of that draft treat them: draft-04's ``const``, draft-07's ``prefixItems``...)."""
        if not isinstance(schema, dict) or self._foreign.isdisjoint(schema):
            return schema
        got = self._own_keywords.get(id(schema))
        if got is None or got[0] is not schema:
            got = self._own_keywords[id(schema)] = (schema, {k: v for k, v in schema.items() if k not in self._foreign})
        return got[1]

    def foreign_keywords(self, schema: dict) -> list[str]:
        """The keywords of ``schema`` that its dialect does not have."""
        return [k for k in schema if k in self._foreign]

    def negation(self, sub: Sub) -> Sub:
        """The subschema ``not sub``, one object per ``sub``.

        Negating a recursive schema meets the same negation again one value down; being the same
        subschema (same key) it becomes the same rule, a ``Ref`` cycle, instead of a new rule each
        time (an endless compile). Kept alive here, its key (an ``id``) is never reused.
        """
        if isinstance(sub.schema, bool):
            return Sub(not sub.schema, sub.base, sub.pointer)
        got = self._negations.get(sub.key())
        if got is None:
            got = self._negations[sub.key()] = Sub({"not": sub.schema}, sub.base, sub.pointer)
        return got

    def resolve(self, ref: str, sub: Sub) -> Sub:
        """The subschema ``ref`` (found in ``sub``) points to."""
        target = urljoin(sub.base, ref)
        uri, fragment = urldefrag(target)
        where = sub.pointer + "/$ref"
        resource = self.resources.get(uri or sub.base)
        if resource is None:
            resource = self._load_remote(uri, ref, where)
        fragment = unquote(fragment)
        if not fragment:
            return resource
        if not fragment.startswith("/"):
            found = self.anchors.get((resource.base, fragment))
            if found is None:
                raise SchemaError(f"cannot resolve $ref {ref!r}: no anchor {fragment!r}", where, "$ref")
            return found
        out = resource
        for raw in fragment[1:].split("/"):
            token = raw.replace("~1", "/").replace("~0", "~")
            node = out.schema
            if isinstance(node, dict) and token in node:
                out = self.child(out, token)
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                out = self.child(out, int(token))
            else:
                raise SchemaError(f"cannot resolve $ref {ref!r}: nothing at {fragment!r}", where, "$ref")
        if not isinstance(out.schema, (dict, bool)):
            raise SchemaError(f"$ref {ref!r} points to a {type(out.schema).__name__}, not a schema", where, "$ref")
        return out

    def remote_contents(self, uri: str) -> Any:
        """The document at ``uri`` from the registry (None when unknown); not indexed."""
        if uri in self.remotes:
            return self.remotes[uri]
        registry = self.remote_schemas
        try:
            contents = None if registry is None else registry(uri) if callable(registry) else registry.get(uri)
            return None if contents is None else load_schema(contents)
        except Exception:
            return None

    def _load_remote(self, uri: str, ref: str, where: str) -> Sub:
        """The root of the document at ``uri`` from the ``remote_schemas`` registry, indexed."""
        registry = self.remote_schemas
        contents = None
        if registry is not None:
            try:
                contents = registry(uri) if callable(registry) else registry.get(uri)
            except Exception as exc:  # a registry that raises for unknown URIs
                contents = None
                why = f" ({type(exc).__name__}: {exc})"
            else:
                why = ""
        if contents is None:
            hint = ("remote_schemas does not have it" + why if registry is not None else
                    "remote documents are never fetched: pass remote_schemas={url: schema}, "
                    "or inline it under $defs with a matching $id")
            raise SchemaError(f"cannot resolve $ref {ref!r}: the remote schema {uri!r} is not part of this schema "
                              f"and {hint}", where, "$ref")
        try:
            contents = load_schema(contents)
        except SchemaError as exc:
            raise SchemaError(f"remote schema {uri!r} for $ref {ref!r}: {exc}", where, "$ref") from None
        self.remotes[uri] = contents
        base = _own_base(contents, uri, self.draft4) if isinstance(contents, dict) else uri
        top = Sub(contents, base, uri + "#")
        self.resources.setdefault(uri, top)
        self.resources.setdefault(base, top)
        self._index(top)
        return top
