"""JSON Schema front end: remote references, formats, uniqueItems, pretty printing (jsonschema as the oracle)."""

from __future__ import annotations

import json
import re
import warnings

import jsonschema
import pytest

from constrain.derivatives import matches
from grammars.errors import SchemaError
from grammars.json_schema import json_schema_to_grammar


def dump(v) -> bytes:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()


def validator(schema, remotes=None):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    kwargs = {}
    if remotes:
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT202012

        kwargs["registry"] = Registry().with_resources(
            [(uri, Resource.from_contents(doc, default_specification=DRAFT202012)) for uri, doc in remotes.items()])
    return cls(schema, format_checker=cls.FORMAT_CHECKER, **kwargs)


def agree(schema, values, remotes=None, **options):
    """Each value is accepted exactly when jsonschema says it is valid."""
    g = json_schema_to_grammar(schema, **options)
    v = validator(schema, remotes)
    for value in values:
        text = value if isinstance(value, bytes) else dump(value)
        expected = v.is_valid(json.loads(text))
        assert matches(g, text) == expected, (schema, text, expected)
    return g


# ------------------------------------------------------------------------------ remote references

REMOTES = {
    "http://example.com/integer.json": {"type": "integer", "minimum": 3},
    "http://example.com/defs.json": {
        "$defs": {"name": {"type": "string", "maxLength": 3}, "ref": {"$ref": "#/$defs/name"},
                  "other": {"$ref": "integer.json"}},
    },
    "http://example.com/moved.json": {  # its own $id is the base of its references
        "$id": "http://example.com/elsewhere/real.json",
        "$defs": {"x": {"$ref": "leaf.json"}},
        "$ref": "#/$defs/x",
    },
    "http://example.com/elsewhere/leaf.json": {"type": "boolean"},
}


def test_remote_ref_through_a_mapping():
    values = [1, 3, 7, "ab", "abcd", None, True, 2.5]
    agree({"$ref": "http://example.com/integer.json"}, values, REMOTES, remote_schemas=REMOTES)
    agree({"$ref": "http://example.com/defs.json#/$defs/ref"}, values, REMOTES, remote_schemas=REMOTES)
    # relative to the referring document's base; a ref inside the remote resolves against the remote's URI
    agree({"$id": "http://example.com/root.json", "$ref": "defs.json#/$defs/other"}, values, REMOTES,
          remote_schemas=REMOTES)
    # The remote's own $id is the base of its relative references (RFC 3986 5.1.1; jsonschema's
    # referencing resolves them against the retrieval URI instead, so no oracle here).
    g = json_schema_to_grammar({"$ref": "http://example.com/moved.json"}, remote_schemas=REMOTES)
    assert matches(g, b"true") and matches(g, b"false") and not matches(g, b"1")
    agree({"type": "array", "items": {"$ref": "http://example.com/integer.json"}},
          [[], [3, 4], [3, 1], ["x"]], REMOTES, remote_schemas=REMOTES)


def test_remote_ref_through_a_callable():
    asked = []

    def lookup(uri):
        asked.append(uri)
        return REMOTES.get(uri)

    agree({"$ref": "http://example.com/integer.json"}, [1, 5], REMOTES, remote_schemas=lookup)
    assert asked and asked[0] == "http://example.com/integer.json"
    # JSON text is a schema too
    agree({"$ref": "urn:x"}, [1, "a"], {"urn:x": {"type": "string"}}, remote_schemas={"urn:x": '{"type": "string"}'})


def test_unknown_remote_is_an_error_naming_the_url():
    for registry in (None, REMOTES, lambda uri: None):
        with pytest.raises(SchemaError, match="http://example.com/missing.json") as info:
            json_schema_to_grammar({"properties": {"a": {"$ref": "http://example.com/missing.json#/x"}}},
                                   remote_schemas=registry)
        assert info.value.keyword == "$ref" and info.value.pointer == "#/properties/a/$ref"
    with pytest.raises(SchemaError, match="nothing at"):
        json_schema_to_grammar({"$ref": "http://example.com/defs.json#/$defs/nope"}, remote_schemas=REMOTES)


# ------------------------------------------------------------------------------ formats


def test_regex_and_uri_template_formats_are_enforced():
    agree({"type": "string", "format": "regex"},
          ["^a+$", "^(abc]", "[a-z]+\\d{2,}", "a{2,1}", "*", "[^\\]]", "\\.", "", "a|b", "(x)"])
    # jsonschema checks uri-template only with an optional package: RFC 6570 by hand
    g = json_schema_to_grammar({"type": "string", "format": "uri-template"})
    for text, ok in [("http://x/{id}", True), ("/a{?x,y*}", True), ("{+path}/here", True), ("http://x/{id", False),
                     ("{}", False), ("a b", False), ("{x:0}", False), ("{x:10}", True)]:
        assert matches(g, dump(text)) == ok, text


def test_generated_regex_formats_compile_in_python_and_are_a_subset():
    from hypothesis import given, settings, strategies as st

    g = json_schema_to_grammar({"type": "string", "format": "regex"})
    alphabet = "ab^$.|?*+()[]{}\\-/dws09az,AZ"

    @settings(max_examples=400, deadline=None)
    @given(st.text(alphabet=alphabet, max_size=8))
    def check(text):
        if matches(g, dump(text)):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                re.compile(text)

    check()
