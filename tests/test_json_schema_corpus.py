"""JSON Schema front end on real schemas: JSONSchemaBench and the JSON Schema Test Suite (samples).

Soundness is absolute: an instance ``jsonschema`` rejects is never matched. Valid instances
(serialized compactly, keys in declaration order) must be matched. Schemas we refuse to compile
must be refused with a ``SchemaError``; the coverage rate itself is measured by
``bench/schema_coverage.py``, not asserted here beyond a floor.
"""

from __future__ import annotations

import pytest

from constrain.testing.corpus import DEFAULT_DATA, JSB_SUBSETS, load_cases, suite_remote
from constrain.testing.schema_check import check

BENCH = DEFAULT_DATA / "jsonschemabench"
SUITE = DEFAULT_DATA / "json-schema-test-suite" / "draft2020-12"

OPTIONS: dict = {}  # the defaults
SUITE_OPTIONS = {"remote_schemas": suite_remote}


def _sample(cases, every: int):
    return [c for i, c in enumerate(cases) if i % every == 0]


def _labelled(case) -> list[tuple]:
    return [(t["data"], t["valid"]) for t in case.tests]


@pytest.mark.skipif(not BENCH.exists(), reason="JSONSchemaBench data not present")
def test_jsonschemabench_sample_is_sound_and_mostly_covered():
    cases = _sample(load_cases(DEFAULT_DATA, sorted(JSB_SUBSETS), "all"), 60)
    outcomes = {}
    for case in cases:
        outcome, detail = check(case.schema, _labelled(case), OPTIONS, timeout=20)
        assert outcome != "accept_invalid", f"{case.id}: accepted an invalid instance {detail}"
        assert outcome != "crash", f"{case.id}: {detail}"
        outcomes[case.id] = (outcome, detail)
    passed = sum(o == "pass" for o, _ in outcomes.values())
    assert passed >= 0.8 * len(outcomes), {k: v for k, v in outcomes.items() if v[0] != "pass"}


# Valid instances we do not generate, by design: object constants in another key order than
# written, integers spelled with a fraction, anyOf annotations from several branches at once.
KNOWN_INCOMPLETE = {
    "const: const with object",
    "type: integer type matches integers",
}

SUITE_FILES = ["allOf", "anyOf", "oneOf", "not", "if-then-else", "enum", "const", "ref", "properties",
               "additionalProperties", "patternProperties", "required", "items", "prefixItems", "contains",
               "minimum", "maximum", "exclusiveMinimum", "multipleOf", "minLength", "maxLength", "pattern",
               "uniqueItems", "dependentRequired", "propertyNames", "minProperties", "maxProperties", "type",
               "boolean_schema", "defs", "anchor", "refRemote"]


@pytest.mark.skipif(not SUITE.exists(), reason="JSON Schema Test Suite not present")
@pytest.mark.parametrize("keyword", SUITE_FILES)
def test_suite_keyword_is_sound(keyword):
    for case in load_cases(DEFAULT_DATA, [f"ts/{keyword}"], "all"):
        name = f"{keyword}: {case.description}"
        outcome, detail = check(case.schema, _labelled(case), SUITE_OPTIONS, timeout=20)
        assert outcome not in ("accept_invalid", "crash"), f"{name}: {outcome} {detail}"
        if name not in KNOWN_INCOMPLETE:
            assert outcome != "reject_valid", f"{name}: rejected a valid instance {detail}"
