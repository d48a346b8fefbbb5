"""JSON Schema front end on real schemas: JSONSchemaBench and the JSON Schema Test Suite (samples).

Soundness is absolute: an instance ``jsonschema`` rejects is never matched. Valid instances
(serialized compactly, keys in declaration order) must be matched. Schemas we refuse to compile
must be refused with a ``SchemaError``; the coverage rate itself is measured by
``bench/schema_coverage.py``, not asserted here beyond a floor.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.schema_coverage import BENCH, SUITE, bench_cases, check, suite_cases, suite_remote  # noqa: E402

OPTIONS: dict = {}  # the defaults
SUITE_OPTIONS = {"remote_schemas": suite_remote}


def _sample(cases, every: int):
    return [c for i, c in enumerate(cases) if i % every == 0]


@pytest.mark.skipif(not BENCH.exists(), reason="JSONSchemaBench data not present")
def test_jsonschemabench_sample_is_sound_and_mostly_covered():
    cases = _sample(bench_cases(None, None), 60)
    outcomes = {}
    for _subset, name, schema, tests in cases:
        outcome, detail = check(schema, tests, OPTIONS, timeout=20)
        assert outcome != "accept_invalid", f"{name}: accepted an invalid instance {detail}"
        assert outcome != "crash", f"{name}: {detail}"
        outcomes[name] = (outcome, detail)
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
    for subset, name, schema, tests in suite_cases():
        if subset != keyword:
            continue
        outcome, detail = check(schema, tests, SUITE_OPTIONS, timeout=20)
        assert outcome not in ("accept_invalid", "crash"), f"{name}: {outcome} {detail}"
        if name not in KNOWN_INCOMPLETE:
            assert outcome != "reject_valid", f"{name}: rejected a valid instance {detail}"
