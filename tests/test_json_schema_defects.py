"""The JSON Schema front end's defects found by fuzzing (issue 11), each as the case that exposed it.

Masks are checked with a Matcher over 256 single-byte tokens plus EOS; the oracle is ``jsonschema``'s
validator for the schema's declared draft.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import constrain
from constrain.grammars.errors import SchemaError
from constrain.grammars.json_schema import json_schema_to_grammar

BYTES = constrain.Vocabulary.from_token_bytes([bytes([i]) for i in range(256)] + [None], eos_token_ids=[256])
EOS = 256
BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench"


def dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def oracle(schema: Any) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def accepts(compiled: constrain.CompiledGrammar, text: bytes) -> bool:
    m = compiled.matcher()
    return m.accept_bytes(text) and m.accept_token(EOS)


def agree(schema: Any, values: list[Any], **options: Any) -> constrain.CompiledGrammar:
    """Every value (or raw JSON text) is accepted exactly when the declared draft's validator says valid."""
    compiled = constrain.compile_json_schema(schema, BYTES, **options)
    check = oracle(schema)
    for value in values:
        text = value if isinstance(value, bytes) else dump(value)
        expected = check.is_valid(json.loads(text))
        assert accepts(compiled, text) == expected, (schema, text, expected)
    return compiled


def random_walks(compiled: constrain.CompiledGrammar, schema: Any, walks: int = 8, steps: int = 120) -> int:
    """Follow the mask at random; every allowed token must be accepted and every finished document
    valid. Returns how many documents were finished."""
    check = oracle(schema)
    rng = random.Random(0)
    finished = 0
    for _ in range(walks):
        m = compiled.matcher()
        text = b""
        for _ in range(steps):
            allowed = m.allowed_token_ids().tolist()
            assert allowed, f"empty mask after {text!r}"
            assert all(m.fork().accept_token(t) for t in allowed), text
            token = EOS if EOS in allowed and rng.random() < 0.3 else rng.choice(allowed)
            assert m.accept_token(token)
            if token == EOS:
                assert check.is_valid(json.loads(text)), text
                finished += 1
                break
            text += bytes([token])
    return finished


def bench_schema(case_id: str) -> Any:
    subset = case_id.split("/")[0]
    if not (BENCH / f"{subset}.jsonl.gz").is_file():
        pytest.skip(f"JSONSchemaBench not found under {BENCH}")
    with gzip.open(BENCH / f"{subset}.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["id"] == case_id:
                return row
    raise LookupError(case_id)


# ---------------------------------------------------------------------- defect 4: compile hangs


def test_negation_of_a_recursive_schema_compiles() -> None:
    schema = {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}}, "not": {"$ref": "#/$defs/a"}}
    compiled = agree(schema, [1, "x", None, {}, [1], [[1]], [[], [[1]]], [], [[]], [[], [[]]], [[[[]]]]])
    assert random_walks(compiled, schema)


def test_one_of_with_a_recursive_member_compiles() -> None:
    row = bench_schema("Github_hard/o76745")
    schema = json.loads(row["schema"]) if isinstance(row["schema"], str) else row["schema"]
    compiled = agree(schema, [t["data"] for t in row["tests"]] + [{}, {"GroupId": 1, "Bucket": 2}])
    random_walks(compiled, schema, walks=4)


# ---------------------------------------------------------------------- defect 2: deep inputs

_DEEP_IN_A_FRESH_PROCESS = """
import json, sys
from constrain.grammars.errors import SchemaError
from constrain.grammars.json_schema import json_schema_to_grammar
nested = {"type": "integer"}
for _ in range(3000):
    nested = {"type": "object", "properties": {"a": nested}}
for schema in (nested, "[" * 100_000, json.dumps({"const": [[[[0]]]] }).replace("[", "[" * 600)):
    try:
        json_schema_to_grammar(schema)
    except SchemaError as exc:
        print(exc)
print(sys.getrecursionlimit())
"""


def test_deep_schemas_are_refused_naming_the_depth_in_a_fresh_process() -> None:
    out = subprocess.run([sys.executable, "-c", _DEEP_IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("the schema nests objects and arrays more than 512 levels deep (the limit) at "
                               "#/properties/a/properties/a/properties/a/..."), lines
    assert lines[1] == "the schema's JSON text nests objects and arrays more than 512 levels deep (the limit) at #"
    assert lines[2].startswith("the schema's JSON text nests"), lines
    assert lines[3] == "1000"  # the default: nothing raised it


def test_depth_is_counted_outside_strings_and_up_to_the_limit() -> None:
    brackets_in_strings = {"description": "[{" * 1000, "enum": ['\\"[' * 600]}
    agree(brackets_in_strings, ['\\"[' * 600, "x"])
    assert json_schema_to_grammar(json.dumps(brackets_in_strings))
    at_the_limit = {"type": "integer", "examples": json.loads("[" * 511 + "]" * 511)}  # 512 levels
    agree(at_the_limit, [1, "x"])
    assert json_schema_to_grammar(json.dumps(at_the_limit)).rules
    with pytest.raises(SchemaError, match="more than 512 levels deep"):
        json_schema_to_grammar({"type": "integer", "examples": [at_the_limit["examples"]]})
    with pytest.raises(SchemaError, match="more than 512 levels deep"):
        json_schema_to_grammar(json.dumps({"type": "integer", "examples": [at_the_limit["examples"]]}))
    cyclic: dict = {"type": "object"}
    cyclic["properties"] = {"self": cyclic}
    with pytest.raises(SchemaError, match="more than 512 levels deep"):
        json_schema_to_grammar(cyclic)


# ---------------------------------------------------------------------- defect 7: dialects

DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT6 = "http://json-schema.org/draft-06/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
DRAFT2019 = "https://json-schema.org/draft/2019-09/schema"


def test_draft4_has_no_const() -> None:
    agree({"$schema": DRAFT4, "type": "integer", "const": 1}, [1, 2, "x"])
    agree({"$schema": DRAFT4, "anyOf": [{"type": "string"}, {"not": {"const": 1}}]}, ["x", 1, 2])
    with pytest.raises(SchemaError, match="unsatisfiable"):  # not {} admits nothing
        json_schema_to_grammar({"$schema": DRAFT4, "not": {"const": 1}})
    notes = json_schema_to_grammar({"$schema": DRAFT4, "anyOf": [{"type": "string"}, {"not": {"const": 1}}]}).notes
    assert any(n.startswith("'const' at #/anyOf/1/not is not a draft-04 keyword") for n in notes), notes


def test_prefix_items_only_in_2020_12() -> None:
    values = [[[1]], [1], [], [[1], 1], ["x"]]
    schema = {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "array"}}
    agree({"$schema": DRAFT6, **schema}, values)
    agree({"$schema": DRAFT2019, **schema}, values)
    agree(schema, values)


def test_exclusive_bounds_per_draft() -> None:
    values = [4, 5, 6, 4.5, 5.5, 0, 1, 2]
    agree({"$schema": DRAFT4, "maximum": 5, "exclusiveMaximum": True}, values)
    agree({"$schema": DRAFT4, "minimum": 1, "exclusiveMinimum": False}, values)
    agree({"$schema": DRAFT7, "exclusiveMaximum": 5, "exclusiveMinimum": 1}, values)
    agree({"exclusiveMinimum": 1, "minimum": 1}, values)
    with pytest.raises(SchemaError, match=r"'exclusiveMinimum' must be a number in 2020-12, got True at #/exclusiveMinimum"):
        json_schema_to_grammar({"exclusiveMinimum": True})
    with pytest.raises(SchemaError, match=r"'exclusiveMaximum' must be a boolean .* in draft-04, got 5 at "
                                          r"#/properties/a/exclusiveMaximum"):
        json_schema_to_grammar({"$schema": DRAFT4, "properties": {"a": {"maximum": 9, "exclusiveMaximum": 5}}})


def test_keywords_of_later_drafts_are_annotations_in_earlier_ones() -> None:
    agree({"$schema": DRAFT6, "if": {"type": "integer"}, "then": {"minimum": 3}}, [1, 3, "x"])
    agree({"$schema": DRAFT7, "dependentRequired": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 2}])
    agree({"dependencies": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 2}])
    agree({"$schema": DRAFT7, "dependencies": {"a": ["b"]}}, [{"a": 1}, {"a": 1, "b": 2}, {"b": 1}])
    agree({"$schema": DRAFT4, "type": "array", "contains": {"type": "string"}}, [[], [1], ["x"]])


# ---------------------------------------------------------------------- defect 8: lone surrogates


@pytest.mark.parametrize(("schema", "value"), [
    ({"const": "\ud83d"}, "\ud83d"),
    ({"enum": ["a\udc00b", 1]}, "a\udc00b"),
    ({"type": "object", "required": ["\ud83d"], "properties": {"\ud83d": {"type": "integer"}},
      "additionalProperties": False}, {"\ud83d": 1}),
])
def test_lone_surrogates_are_written_escaped(schema: dict, value: Any) -> None:
    compiled = constrain.compile_json_schema(schema, BYTES)
    escaped = json.dumps(value, separators=(",", ":")).encode()  # ASCII: every surrogate as \uXXXX
    raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert accepts(compiled, escaped) and not accepts(compiled, raw)
    assert random_walks(compiled, schema)


def test_a_lone_surrogate_excluded_by_not_stays_excluded() -> None:
    agree({"enum": ["\ud83d", "x"], "not": {"const": "\ud83d"}}, [b'"\\ud83d"', b'"\\uD83D"', "x"])


# ---------------------------------------------------------------------- defect 9: idn-hostname

IDN_HOSTNAMES = ["ab--cd.com", "xn--abc", "xn--a.com", "xn--bcher-kva.de", "example.com", "Example.COM", "a-b.c",
                 "bücher.de", "straße.de", "日本.jp", "é.fr", "ÀB.com", "-a.com", "a.b-", "a--b.org", "ab-c.d-e.fg",
                 "bü--cher.de", "ü.ü.ü", "a" * 64 + ".com", "a" * 63 + ".com", ".com", "a..b", "中文中文中文中.cn"]


def test_idn_hostname_agrees_with_idna_or_admits_less() -> None:
    schema = {"type": "string", "format": "idn-hostname"}
    compiled = constrain.compile_json_schema(schema, BYTES)
    check = oracle(schema)
    accepted = {h for h in IDN_HOSTNAMES if accepts(compiled, dump(h))}
    assert accepted <= {h for h in IDN_HOSTNAMES if check.is_valid(h)}  # never unsound
    assert {"ab--cd.com", "xn--abc", "xn--a.com", "bü--cher.de"}.isdisjoint(accepted)
    assert {"example.com", "Example.COM", "a-b.c", "a--b.org", "bücher.de", "straße.de", "日本.jp", "é.fr",
            "a" * 63 + ".com"} <= accepted
    assert random_walks(compiled, schema, walks=6, steps=60)


# ---------------------------------------------------------------------- defect 6: repeated keys


@pytest.mark.parametrize(("schema", "repeated"), [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"maxProperties": 1}},
     [b'{"x":-4,"x":1}', b'{"a":1,"a":2}']),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "patternProperties": {"^x": {"type": "integer"}},
      "additionalProperties": False, "minProperties": 3},
     [b'{"a":1,"x":-4,"x":1}', b'{"a":1,"x1":1,"x1":2}', b'{"x1":1,"x1":2,"x2":3}']),
])
def test_repeated_undeclared_keys_do_not_count_twice(schema: dict, repeated: list[bytes]) -> None:
    compiled = agree(schema, [{"a": 1, "b": 2}, {"x": 1}, {"a": 1}, {"a": 2, "x": 1}, {"a": 1, "b": 2, "x": 3},
                              {"a": 1, "b": 1, "x1": 1, "x2": 2}])
    for text in repeated:
        assert not oracle(schema).is_valid(json.loads(text)) and not accepts(compiled, text), text
    random_walks(compiled, schema, walks=6, steps=40)


@pytest.mark.parametrize("schema", [
    {"type": "object", "patternProperties": {"^x$": {"type": "integer"}}, "additionalProperties": False,
     "minProperties": 2},
    {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False,
     "minProperties": 2},
    {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
    {"type": "object", "properties": {"a": {}}, "not": {"maxProperties": 2}},
])
def test_min_properties_met_only_by_repeatable_keys_is_refused(schema: dict) -> None:
    with pytest.raises(SchemaError, match=r"cannot enforce minProperties \d: .* their keys may repeat .* at #"):
        json_schema_to_grammar(schema)


def test_one_additional_member_still_counts_toward_min_properties() -> None:
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": {"type": "integer"},
              "minProperties": 2}
    notes = agree(schema, [{"a": 1, "b": 2}, {"a": 1, "x": 2}, {"b": 1, "x": 2}, {"x": 1}, {"a": 1}]).notes
    assert any("additional members count once toward minProperties" in n for n in notes), notes


# ---------------------------------------------------------------------- issue 10: typed errors


def test_too_many_alternatives_is_a_typed_schema_error() -> None:
    from constrain.grammars.json_schema.normalize import MAX_ALTERNATIVES, TooManyAlternatives

    branches = [{"anyOf": [{"const": f"{i}-{j}"} for j in range(2)]} for i in range(10)]
    with pytest.raises(TooManyAlternatives, match=f"more than {MAX_ALTERNATIVES} alternatives") as info:
        json_schema_to_grammar({"allOf": branches})
    assert isinstance(info.value, SchemaError)


# ---------------------------------------------------------------- the long fuzz run (schema seed 572)


@pytest.mark.parametrize("text, integer", [
    (b"6392170690045133614395.2", False), (b"6392170690045133614395", True),
    (b"6392170690045133614395.0", True), (b"1.5", False), (b"2.000000000000000001", False), (b"1e2", True),
])
def test_integer_is_the_decimal_written_not_its_float64(text: bytes, integer: bool) -> None:
    """JSON Schema judges the number's mathematical value: ``6392170690045133614395.2`` has a
    fraction, so it is no ``integer`` (float64, which rounds it to an integer, would say it is)."""
    is_integer = constrain.compile_json_schema({"type": "integer"}, BYTES)
    no_integer = constrain.compile_json_schema(
        {"$schema": "https://json-schema.org/draft/2020-12/schema",
         "not": {"anyOf": [{"type": "integer", "maxProperties": 2}, {"type": "string"}]}}, BYTES)
    assert not accepts(is_integer, text) or integer  # it may write integers plainly only (1e2, 1.0)
    assert accepts(no_integer, text) == (not integer)
