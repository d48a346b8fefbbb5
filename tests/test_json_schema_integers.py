"""Integral enum values: ``2.0`` is generated only where it validates (found unsound by bench/)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from constrain.derivatives import matches
from constrain.grammars.json_schema import json_schema_to_grammar

DRAFT4 = "http://json-schema.org/draft-04/schema#"


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": DRAFT4, "properties": {"v": {"type": "integer", "enum": [30, 1440]}}},
        {"$schema": DRAFT4, "properties": {"v": {"enum": [2]}}},
        {"$schema": DRAFT4, "properties": {"v": {"enum": [[2], {"k": 2}]}}},
        {"properties": {"v": {"type": "integer", "enum": [2]}}},
        {"properties": {"v": {"enum": [[2]]}}},
    ],
)
def test_integral_spellings_follow_the_validator(schema) -> None:
    grammar = json_schema_to_grammar(schema)
    validator = jsonschema.validators.validator_for(schema)(schema)
    for value in (30, 30.0, 1440, 1440.0, 2, 2.0, [2], [2.0], {"k": 2}, {"k": 2.0}):
        doc = json.dumps({"v": value}, separators=(",", ":"))
        if matches(grammar, doc.encode()):
            assert validator.is_valid(json.loads(doc)), doc  # soundness: never accept an invalid one
    valid_canonical = [v for v in (30, 1440, 2, [2], {"k": 2}) if validator.is_valid({"v": v})]
    for value in valid_canonical:
        assert matches(grammar, json.dumps({"v": value}, separators=(",", ":")).encode())
