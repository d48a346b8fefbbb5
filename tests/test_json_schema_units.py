"""JSON Schema front end: keyword by keyword, with jsonschema as the oracle."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain.derivatives import matches
from constrain.grammars.errors import SchemaError
from constrain.grammars.json_schema import json_schema_to_grammar


def dump(v) -> bytes:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode()


def agree(schema, values, **options):
    """Every value is accepted exactly when jsonschema says it is valid (values in schema key order)."""
    g = json_schema_to_grammar(schema, **options)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for value in values:
        text = value if isinstance(value, bytes) else dump(value)
        expected = v.is_valid(json.loads(text))
        assert matches(g, text) == expected, (schema, text, expected)
    return g


def test_integer_ranges_are_exact():
    values = list(range(-130, 131, 7)) + [0, -1, 1, 99, 100, 101, -100, 1000, 1.5]
    agree({"type": "integer", "minimum": -100, "maximum": 100}, values)
    agree({"type": "integer", "exclusiveMinimum": 7, "exclusiveMaximum": 101}, values)
    agree({"type": "integer", "minimum": 5, "maximum": 5}, values)
    agree({"type": "integer", "minimum": 99}, values)


def test_decimal_bounds_are_exact_at_the_boundary():
    values = [b"0.5", b"0.50", b"0.51", b"0.49", b"1", b"1.0", b"-0.5", b"2.25", b"2.250", b"2.2501", b"0", b"3"]
    agree({"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.25}, values)
    agree({"type": "number", "minimum": -0.5, "exclusiveMaximum": 2.25}, values)
    # draft-04 boolean exclusives
    agree({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 0.5,
           "exclusiveMinimum": True}, values)


def test_multiple_of():
    values = list(range(-30, 31)) + [0.5, 1.25, 2.5, 0.01, 0.015]
    agree({"type": "integer", "multipleOf": 7}, values)
    agree({"type": "number", "multipleOf": 0.25, "maximum": 3}, [b"0.25", b"0.5", b"0.3", b"1.75", b"2.26", b"3.00"])
    agree({"type": "number", "multipleOf": 0.01}, [b"1.23", b"1.234", b"1.230", b"-4.5", b"7"])


def test_strings_count_code_points_and_escapes():
    s = {"type": "string", "minLength": 2, "maxLength": 3}
    g = agree(s, ["a", "ab", "abc", "abcd", "é€", "😀😀", "😀😀😀😀"])
    assert matches(g, b'"\\u00e9\\n"')  # two characters, both escaped
    assert matches(g, b'"\\ud83d\\ude00x"')  # a surrogate pair is one character
    assert not matches(g, b'"\\ud83d\\ude00"')
    assert not matches(g, b'"a\x01"')  # raw control characters are not JSON


def test_pattern_uses_search_semantics():
    agree({"type": "string", "pattern": "[0-9]{3}"}, ["abc123", "12", "x999y", ""])
    agree({"type": "string", "pattern": "^a.c$"}, ["abc", "abcd", "a\nc", "xabc"])


def test_formats():
    agree({"format": "date", "type": "string"}, ["2024-02-29", "2023-02-29", "2023-04-31", "2023-12-01", "2023-1-01"])
    agree({"format": "ipv4", "type": "string"}, ["1.2.3.4", "256.1.1.1", "01.2.3.4", "1.2.3"])
    agree({"format": "uuid", "type": "string"}, ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"])
    # An unknown format asserts nothing (validators ignore it): ignored by default, with a note.
    g = json_schema_to_grammar({"type": "string", "format": "int32"})
    assert matches(g, b'"x"')
    assert any("int32" in n and "#/format" in n for n in g.notes), g.notes
    with pytest.raises(SchemaError, match="unknown format 'int32'") as info:
        json_schema_to_grammar({"type": "string", "format": "int32"}, unknown_format="error")
    assert info.value.keyword == "format" and info.value.pointer == "#/format"
    agree({"type": "string", "format": "int32"}, ["x", "12", ""])


def test_object_members_in_any_order_no_duplicates():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}
    g = agree(schema, [{"a": "x"}, {"b": 1, "a": "x"}, {"b": 1}, {"b": 1, "a": "x", "c": [1]}, {}])
    assert matches(g, b'{"a":"x","b":1}') and matches(g, b'{"c":[1],"a":"x","b":1}')
    assert not matches(g, b'{"b":1,"a":"x","b":2}')
    assert not matches(g, b'{"b":1,"a":"x","\\u0062":2}')  # extra keys never spell a declared one


def test_declared_property_order_option():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}
    g = agree(schema, [{"a": "x"}, {"b": 1, "a": "x"}, {"b": 1, "a": "x", "c": [1]}], property_order="declared")
    assert not matches(g, b'{"a":"x","b":1}')
    assert not matches(g, b'{"c":[1],"a":"x"}')  # additional members come last


OBJECT_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
     "required": ["a", "c"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
     "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 3},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "patternProperties": {"^x": {"type": "string"}},
     "additionalProperties": False, "minProperties": 1},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
     "dependentRequired": {"a": ["b"]}, "maxProperties": 2},
    {"type": "object", "propertyNames": {"enum": ["a", "c", "x1"]}, "additionalProperties": {"type": "integer"},
     "properties": {"a": {"type": "string"}}, "minProperties": 2},
]


def test_listed_property_names_never_repeat():
    """A repeated key counts once for minProperties: keys from a propertyNames enum are declared."""
    g = json_schema_to_grammar({"propertyNames": {"enum": ["a", "b"]}, "minProperties": 2})
    assert matches(g, b'{"b":1,"a":2}')
    assert not matches(g, b'{"a":1,"a":2}')
    assert not matches(g, b'{"a":1,"c":2}')


@pytest.mark.parametrize("schema", OBJECT_SCHEMAS)
@settings(max_examples=150, deadline=None)
@given(members=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "x1", "y"]),
                                  st.one_of(st.integers(-3, 3), st.sampled_from(["s", True]))),
                        max_size=6, unique_by=lambda m: m[0]),
       repeat=st.sampled_from(["a", "b", "c"]))
def test_objects_in_any_member_order_agree_with_jsonschema(schema, members, repeat):
    """Every order of the same members gets jsonschema's verdict; a declared key never repeats."""
    g = json_schema_to_grammar(schema)
    text = b"{" + b",".join(dump(k) + b":" + dump(v) for k, v in members) + b"}"
    assert matches(g, text) == jsonschema.Draft202012Validator(schema).is_valid(dict(members)), text
    if repeat in dict(members) and repeat in schema.get("properties", {}):
        assert not matches(g, text[:-1] + b"," + dump(repeat) + b":1}")


def test_additional_and_pattern_properties():
    schema = {"type": "object", "properties": {"id": {"type": "integer"}},
              "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False}
    agree(schema, [{"id": 1}, {"id": 1, "x-a": "s"}, {"id": 1, "x-a": 2}, {"id": 1, "y": "s"}, {"x-id": "q"}])
    agree({"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1, "maxProperties": 2},
          [{}, {"a": True}, {"a": True, "b": False}, {"a": True, "b": False, "c": True}, {"a": 1}])


def test_min_max_properties_with_optional_keys():
    schema = {"properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2, "maxProperties": 2,
              "additionalProperties": False}
    agree(schema, [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "c": 2}, {"a": 1, "b": 2, "c": 3}])


def test_dependent_required_and_schemas():
    agree({"dependentRequired": {"a": ["b"]}, "properties": {"a": {}, "b": {}}},
          [{}, {"a": 1}, {"a": 1, "b": 2}, {"b": 2}])
    agree({"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"a": {}, "b": {"type": "integer"}},
           "dependencies": {"a": {"required": ["b"]}}}, [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "b": "x"}])


def test_arrays():
    agree({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
          [[], [1], [1, "a"], [1, "a", 2], ["a"]])
    agree({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
          [[], [1], [1, 2], [1, 2, 3], [1, 2, 3, 4], [1, "a"]])
    agree({"type": "array", "contains": {"const": 5}, "minContains": 2, "maxContains": 3, "items": {"type": "integer"}},
          [[], [5], [5, 5], [1, 5, 2, 5], [5, 5, 5, 5], [5, 5, 5]])
    agree({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
          [[], ["a"], ["a", "b"], ["a", "a"], ["c", "b", "a"], ["a", "b", "a"]])


def test_unique_items_on_open_items_is_an_error_unless_lenient():
    schema = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    with pytest.raises(SchemaError, match="uniqueItems.*#/uniqueItems"):
        json_schema_to_grammar(schema)
    g = json_schema_to_grammar(schema, lenient=True)
    assert any("uniqueItems" in n for n in g.notes)


def test_combinators():
    agree({"anyOf": [{"type": "string", "maxLength": 1}, {"type": "integer", "minimum": 10}]}, ["a", "ab", 5, 10, None])
    agree({"oneOf": [{"type": "integer"}, {"minimum": 2}]}, [1, 2, 2.5, "x"])
    agree({"oneOf": [{"required": ["a"]}, {"required": ["b"]}], "properties": {"a": {}, "b": {}}},
          [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}])
    agree({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"minimum": 3}},
                                                                  "required": ["a"]}]}, [{}, {"a": 1}, {"a": 4}])
    agree({"not": {"type": ["string", "null"]}}, ["a", None, 1, [], {}])
    agree({"type": "integer", "not": {"enum": [1, 2]}}, [0, 1, 2, 3])
    agree({"if": {"properties": {"k": {"const": "n"}}, "required": ["k"]},
           "then": {"properties": {"v": {"type": "integer"}}}, "else": {"properties": {"v": {"type": "string"}}},
           "properties": {"k": {}, "v": {}}},
          [{"k": "n", "v": 1}, {"k": "n", "v": "s"}, {"k": "m", "v": "s"}, {"k": "m", "v": 1}])


def test_enum_and_const_of_any_value():
    agree({"enum": [1, "a", None, [1, 2], {"x": 1}]}, [1, 1.0, "a", None, [1, 2], [2, 1], {"x": 1}, {"x": 2}, 2])
    agree({"const": 2, "type": "integer"}, [2, 2.0, 3])


def test_refs_pointers_anchors_and_recursion():
    schema = {
        "$defs": {"a/b": {"type": "integer"}, "t~": {"$anchor": "node", "type": "object",
                                                     "properties": {"kids": {"type": "array", "items": {"$ref": "#node"}}}}},
        "properties": {"x": {"$ref": "#/$defs/a~1b"}, "tree": {"$ref": "#/$defs/t~0"}},
    }
    agree(schema, [{"x": 1}, {"x": "s"}, {"tree": {"kids": [{"kids": []}, {}]}}, {"tree": {"kids": [1]}}])
    g = json_schema_to_grammar(schema, max_recursion_depth=1)
    assert matches(g, b'{"tree":{"kids":[{}]}}')
    assert not matches(g, b'{"tree":{"kids":[{"kids":[{}]}]}}')


def test_errors_are_clear():
    with pytest.raises(SchemaError, match="not valid JSON"):
        json_schema_to_grammar('{"type": ')
    with pytest.raises(SchemaError, match=r"cannot resolve \$ref.*#/properties/a/\$ref"):
        json_schema_to_grammar({"properties": {"a": {"$ref": "#/$defs/missing"}}})
    with pytest.raises(SchemaError, match="not part of this schema"):
        json_schema_to_grammar({"$ref": "http://example.com/other.json"})
    with pytest.raises(SchemaError, match="unsatisfiable.*minimum"):
        json_schema_to_grammar({"type": "integer", "minimum": 5, "maximum": 1})
    with pytest.raises(SchemaError, match="unsatisfiable"):
        json_schema_to_grammar({"type": []})
    with pytest.raises(SchemaError, match="unsatisfiable.*required property 'a'"):
        json_schema_to_grammar({"type": "object", "required": ["a"], "additionalProperties": False})
    with pytest.raises(SchemaError, match=r"'\$recursiveRef' is not supported at #/\$recursiveRef"):
        json_schema_to_grammar({"$recursiveRef": "#"})


def test_deep_nesting_and_big_inputs_compile():
    schema: dict = {"type": "integer"}
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    g = json_schema_to_grammar(schema)
    assert matches(g, b'{"a":' * 200 + b"1" + b"}" * 200)
    json_schema_to_grammar({"enum": [f"value-{i}" for i in range(10_000)]})
    big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 500} for i in range(9000)}}
    assert matches(json_schema_to_grammar(json.dumps(big)), b'{"p7":"x"}')


def test_flexible_whitespace_is_bounded():
    g = json_schema_to_grammar({"type": "object", "properties": {"a": {"type": "array"}}}, whitespace="flexible",
                               max_whitespace=2)
    assert matches(g, b'{ "a" :\n[ 1 , 2 ]  }')
    assert not matches(g, b'{"a":   []}')


def test_one_of_object_branches_without_type():
    a = {"additionalProperties": False, "properties": {"mode": {"enum": ["custom"]}, "name": {"type": "string"}}}
    b = {"additionalProperties": False, "properties": {"mode": {"enum": ["reference"]}, "id": {"type": "string"}},
         "required": ["id", "mode"]}
    agree({"oneOf": [a, b]}, [{}, {"mode": "custom"}, {"mode": "reference", "id": "x"}, {"mode": "custom", "id": "x"},
                              "s", 1, None, [1], {"mode": "custom", "name": "n"}])
    disc = {"oneOf": [{"properties": {"t": {"const": "a"}, "x": {"type": "integer"}}, "required": ["t"]},
                      {"properties": {"t": {"const": "b"}, "y": {"type": "string"}}, "required": ["t"]}]}
    agree(disc, [{"t": "a", "x": 1}, {"t": "b", "y": "s"}, {"t": "c"}, {"t": "a", "x": "s"}])


def test_strict_properties_forbids_undeclared_keys():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    g = json_schema_to_grammar(schema, strict_properties=True)
    assert matches(g, b'{"a":1}') and not matches(g, b'{"a":1,"b":2}')
    g = json_schema_to_grammar({**schema, "additionalProperties": {"type": "string"}}, strict_properties=True)
    assert matches(g, b'{"a":1,"b":"x"}')


def test_equal_leaf_schemas_share_one_rule_and_keep_their_meaning():
    """Leaves equal but for annotations translate once; values of different JSON types (1, 1.0,
    true) or floats of different spelling stay apart."""
    props = {f"p{i}": {"type": "string", "description": f"field {i}"} for i in range(30)}
    props |= {"one": {"const": 1}, "flag": {"const": True}, "half": {"const": 0.5}, "neg": {"const": -0.0}}
    g = json_schema_to_grammar({"type": "object", "properties": props, "required": ["one", "flag"]})
    assert len(g.rules) < 20  # one rule for the 30 strings, not 30
    assert matches(g, b'{"one":1,"flag":true,"p3":"x","p29":"y"}')
    assert not matches(g, b'{"one":true,"flag":true}')
    assert not matches(g, b'{"one":1,"flag":1}')
    assert matches(g, b'{"one":1,"flag":true,"half":0.5}')


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=())))
def test_json_text_of_a_string_is_json_dumps_with_lone_surrogates_escaped(text: str) -> None:
    """The fast path for plain strings and json.dumps agree, quotes, controls and surrogates included."""
    from constrain.grammars.json_schema.json_strings import json_text

    expected = "".join(f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c
                       for c in json.dumps(text, ensure_ascii=False))
    assert json_text(text) == expected.encode("utf-8")
