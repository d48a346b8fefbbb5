"""JSON Schema front end: remote references, formats, uniqueItems, pretty printing (jsonschema as the oracle)."""

from __future__ import annotations

import json
import re
import warnings

import jsonschema
import pytest

from constrain.derivatives import matches
from constrain.grammars.errors import SchemaError
from constrain.grammars.json_schema import json_schema_to_grammar


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
    from hypothesis import given, settings
    from hypothesis import strategies as st

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


# ------------------------------------------------------------------------------ uniqueItems

def _arrays(values, max_len=4):
    import itertools

    out = [[]]
    for n in range(1, max_len + 1):
        out += [list(p) for p in itertools.product(values, repeat=n)]
    return out


def test_unique_items_over_finite_sets():
    agree({"type": "array", "items": {"enum": ["a", "b", 1]}, "uniqueItems": True}, _arrays(["a", "b", 1, 1.0]))
    agree({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, _arrays([True, False, None], 3))
    agree({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3}, "uniqueItems": True},
          _arrays([0, 1, 2, 3], 4))
    # tuples: finite positions, with and without more items
    agree({"prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "items": False, "uniqueItems": True},
          _arrays([True, False, 1], 3))
    agree({"prefixItems": [{"type": "boolean"}, {"enum": [True, "x"]}], "items": {"const": "x"}, "uniqueItems": True},
          _arrays([True, False, "x"], 4))


def test_unique_items_with_disjoint_positions():
    schema = {"prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}], "items": False,
              "uniqueItems": True}
    agree(schema, [["a", 1, True], ["a", 1], ["a"], [1, 1], ["a", "a"], ["a", 1, True, False]])
    # a string position next to a repeated finite rest of numbers
    agree({"prefixItems": [{"type": "string"}], "items": {"enum": [1, 2]}, "uniqueItems": True},
          [["a", 1, 2], ["a", 1, 1], ["a", 2, 1], ["a"], ["a", 1, 2, 1], [1]])
    # at most one item: always unique
    agree({"type": "array", "items": {"type": "string"}, "maxItems": 1, "uniqueItems": True}, [[], ["a"], ["a", "a"]])
    # one string position, one item beyond that may be anything but a string
    agree({"prefixItems": [{"type": "string"}], "items": {"type": "number"}, "maxItems": 2, "uniqueItems": True},
          [["a", 1], ["a"], ["a", "a"], ["a", 1, 2]])


def test_unique_items_undecidable_is_an_error():
    for schema in ({"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                   {"prefixItems": [{"type": "string"}, {"type": "string"}], "items": False, "uniqueItems": True},
                   {"prefixItems": [{"type": "boolean"}], "uniqueItems": True}):
        with pytest.raises(SchemaError, match="uniqueItems") as info:
            json_schema_to_grammar(schema)
        assert info.value.pointer == "#/uniqueItems"
    g = json_schema_to_grammar({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, lenient=True)
    assert any("uniqueItems" in n for n in g.notes)


# ------------------------------------------------------------------------------ negated additionalProperties

OBJECTS = [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": "x"}, {"a": "s"}, {"x1": "s"}, {"x1": 2}, {"a": 1, "x1": 2},
           {"b": None, "c": True}, {"next": "n"}, {"previous": "p"}, {"next": "n", "previous": "p"}, {"next": 1}]


def test_not_additional_properties():
    agree({"not": {"properties": {"a": {}}, "additionalProperties": False}}, OBJECTS + [1, "x"])
    agree({"type": "object", "not": {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}}, OBJECTS)
    agree({"type": "object", "not": {"patternProperties": {"^x": {"type": "string"}}}}, OBJECTS)
    agree({"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
           "not": {"properties": {"b": {}}, "additionalProperties": False}}, OBJECTS)


def test_one_of_with_closed_objects():
    schema = {"type": "object", "oneOf": [
        {"additionalProperties": False, "properties": {"next": {"type": "string"}}},
        {"additionalProperties": False, "properties": {"previous": {"type": "string"}}}]}
    agree(schema, OBJECTS)
    schema = {"oneOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
                        {"properties": {"b": {}}, "additionalProperties": False}]}
    agree(schema, OBJECTS + [{"a": 1, "c": "s"}, {"b": 1, "c": "s"}, {"a": 1, "b": "s"}])


def test_one_of_narrowed_when_exact_negation_is_too_large():
    keys = [f"k{i}" for i in range(10)]
    schema = {"type": "object", "oneOf": [
        {"required": [k], "properties": {k: {"type": "integer", "minimum": 0}}} for k in keys]}
    g = json_schema_to_grammar(schema)
    assert any("narrower" in n for n in g.notes), g.notes
    v = validator(schema)
    cases = [{}, {"k0": 1}, {"k3": 0}, {"k0": 1, "k1": 2}, {"k0": 1, "k1": -1}, {"k0": -1}, {"k0": "x"},
             {"k0": 1, "x": 2}, {"k0": 1, "k9": "s"}]
    for value in cases:
        text = dump(value)
        if matches(g, text):  # sound: whatever is accepted is valid
            assert v.is_valid(value), value
    for value in [{"k0": 1}, {"k3": 0}, {"k0": 1, "x": 2}]:  # the plain cases are still accepted
        assert matches(g, dump(value)), value


def test_not_prefix_items():
    arrays = [[], [1], ["a"], [1, "a"], [1, 2], ["a", "b"], [1, "a", None], [None]]
    agree({"not": {"prefixItems": [{"type": "integer"}, {"type": "string"}]}}, arrays + [{}, 1])
    agree({"type": "array", "oneOf": [{"prefixItems": [{"type": "integer"}]}, {"prefixItems": [True, {"type": "string"}]}]},
          arrays)
    with pytest.raises(SchemaError, match="items"):
        json_schema_to_grammar({"not": {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}})


def test_property_names_with_not_enum():
    schema = {"type": "object", "propertyNames": {"not": {"enum": ["a", "bc"]}}}
    agree(schema, [{}, {"a": 1}, {"b": 1}, {"bc": 1}, {"b": 1, "bcd": 2}, {"x": 1, "a": 2}])
    schema = {"type": "object", "propertyNames": {"oneOf": [{"enum": ["a", "b"]}, {"pattern": "^x"}]}}
    agree(schema, [{}, {"a": 1}, {"xa": 1}, {"c": 1}, {"b": 1, "x": 2}])


def test_double_negation_of_enum():
    values = [1, 2, "a", "b", None, [1], {"a": 1}]
    agree({"not": {"not": {"enum": [1, "a", [1]]}}}, values)
    agree({"not": {"type": "string", "not": {"enum": ["a"]}}}, values)
    agree({"properties": {"x": {"not": {"properties": {"y": {"not": {"const": 1}}}}}}},
          [{"x": {"y": 1}}, {"x": {"y": 2}}, {"x": {}}, {"x": 3}])


# ------------------------------------------------------------------------------ indent


def _pretty(value, n):
    return json.dumps(value, indent=n, ensure_ascii=False).encode()


@pytest.mark.parametrize("n", [2, 4, 0])
def test_indent_matches_json_dumps(n):
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "pos": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x"]},
        "kind": {"enum": [[1, 2], {"a": [True]}, "s"]}, "rest": {}, "list": {"prefixItems": [{"type": "integer"}],
                                                                               "items": {"type": "object"}}},
        "required": ["name"], "additionalProperties": {"type": "number"}}
    g = json_schema_to_grammar(schema, indent=n)
    v = validator(schema)
    values = [{"name": "a"}, {"name": "a", "tags": []}, {"name": "a", "tags": ["x", "y"]},
              {"name": "a", "pos": {"x": 1, "y": 2}}, {"name": "a", "pos": {"x": 1}}, {"name": "a", "kind": [1, 2]},
              {"name": "a", "kind": {"a": [True]}}, {"name": "a", "rest": {"q": [1, {"z": None}], "e": {}}},
              {"name": "a", "list": [1, {}, {"k": [[]]}]}, {"name": "a", "extra": 2.5}, {"name": "a", "extra": "no"},
              {"tags": []}, {"name": "a", "pos": {"y": 1}}]
    for value in values:
        assert matches(g, _pretty(value, n)) == v.is_valid(value), value
        if value and v.is_valid(value):  # exactly that layout
            assert not matches(g, dump(value)), value
    assert matches(g, b'{\n' + b' ' * n + b'"name": "a",\n' + b' ' * n + b'"tags": []\n}')
    assert not matches(g, b'{\n' + b' ' * n + b'"name": "a",\n' + b' ' * n + b'"tags": [\n' + b' ' * n + b']\n}')


def test_indent_with_unique_items_and_objects_with_witnesses():
    schema = {"type": "array", "items": {"enum": ["a", "b", [1]]}, "uniqueItems": True}
    g = json_schema_to_grammar(schema, indent=2)
    v = validator(schema)
    for value in [[], ["a"], ["a", "b"], ["a", "a"], [[1], "a"], [[1], [1]]]:
        assert matches(g, _pretty(value, 2)) == v.is_valid(value), value
    schema = {"type": "object", "not": {"properties": {"a": {}}, "additionalProperties": False}}
    g = json_schema_to_grammar(schema, indent=2)
    v = validator(schema)
    for value in [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": [2]}]:
        assert matches(g, _pretty(value, 2)) == v.is_valid(value), value
