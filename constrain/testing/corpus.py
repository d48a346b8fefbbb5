"""JSONSchemaBench subsets and the JSON Schema Test Suite (draft2020-12), read in place.

A case is one schema with its labelled instances. The dev half of a subset is every case whose
0-based position in its file is even (for the test suite: each file's each schema group); the test
half is the odd positions. Data is read in place from `../shared/data`, never copied.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

# The checkout's sibling folder ../shared/data (constrain/testing/ -> constrain/ -> the repository).
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

JSB_SUBSETS = (
    "Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra",
    "Glaiveai2K", "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost",
)
TS_PREFIX = "ts/"
TS_REMOTE = "http://localhost:1234/"
VALIDATOR_ERROR = "validator error: "


@dataclass
class Case:
    id: str                 # "Github_easy/o1234" or "ts/allOf#3"
    subset: str             # "Github_easy" or "ts/allOf"
    index: int              # position in its file
    schema: Any
    tests: list[dict] = field(default_factory=list)   # {"data", "valid", "description"}
    description: str = ""   # the suite's schema-group description ("" for JSONSchemaBench)

    @property
    def is_suite(self) -> bool:
        return self.subset.startswith(TS_PREFIX)

    def to_json(self) -> dict:
        return {"id": self.id, "subset": self.subset, "index": self.index, "schema": self.schema, "tests": self.tests}


def suite_files(data_dir: Path, optional: bool = False) -> list[str]:
    """Subset names of the test-suite files, e.g. "ts/allOf", "ts/optional/format/date"."""
    root = data_dir / "json-schema-test-suite" / "draft2020-12"
    paths = sorted(root.glob("**/*.json" if optional else "*.json"))
    return [TS_PREFIX + str(p.relative_to(root).with_suffix("")) for p in paths]


def expand_subsets(spec: str | None, data_dir: Path, ts_optional: bool = False) -> list[str]:
    """`--subsets` value -> subset names. "jsb" = all JSONSchemaBench, "ts" = all suite files."""
    if not spec or spec == "all":
        return list(JSB_SUBSETS) + suite_files(data_dir, ts_optional)
    out: list[str] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name == "jsb":
            out += JSB_SUBSETS
        elif name == "ts":
            out += suite_files(data_dir, ts_optional)
        elif name in JSB_SUBSETS or name.startswith(TS_PREFIX):
            out.append(name)
        else:
            raise SystemExit(f"unknown subset {name!r}; known: jsb, ts, ts/<file>, {', '.join(JSB_SUBSETS)}")
    return out


def _read_subset(data_dir: Path, subset: str) -> list[Case]:
    if subset.startswith(TS_PREFIX):
        path = data_dir / "json-schema-test-suite" / "draft2020-12" / (subset[len(TS_PREFIX):] + ".json")
        groups = json.loads(path.read_text(encoding="utf-8"))
        return [Case(f"{subset}#{i}", subset, i, g["schema"],
                     [{"data": t["data"], "valid": bool(t["valid"]), "description": t.get("description", "")}
                      for t in g["tests"]], g.get("description", ""))
                for i, g in enumerate(groups)]
    path = data_dir / "jsonschemabench" / f"{subset}.jsonl.gz"
    cases = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            rec = json.loads(line)
            cases.append(Case(rec["id"], subset, i, rec["schema"],
                              [{"data": t["data"], "valid": bool(t["valid"]), "description": t.get("description", "")}
                               for t in rec.get("tests", [])]))
    return cases


def load_cases(data_dir: Path, subsets: list[str], split: str = "dev", limit: int | None = None) -> list[Case]:
    """Cases of the given subsets in the given half (dev = even positions, test = odd, all)."""
    out: list[Case] = []
    for subset in subsets:
        cases = _read_subset(data_dir, subset)
        if split == "dev":
            cases = [c for c in cases if c.index % 2 == 0]
        elif split == "test":
            cases = [c for c in cases if c.index % 2 == 1]
        if limit is not None:
            cases = cases[:limit]
        out += cases
    return out


# ------------------------------------------------------------------------------- validation

def suite_remote(uri: str, data_dir: Path = DEFAULT_DATA) -> Any:
    """The test suite's remote documents: http://localhost:1234/<path> -> remotes/<path> (never fetched)."""
    path = data_dir / "json-schema-test-suite" / "remotes" / uri[len(TS_REMOTE):]
    if not uri.startswith(TS_REMOTE) or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@cache
def remote_registry(data_dir: Path = DEFAULT_DATA) -> Any:
    """A `referencing.Registry` that serves http://localhost:1234/ from the suite's remotes/ folder."""
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import DRAFT202012

    def retrieve(uri: str) -> Resource:
        contents = suite_remote(uri, data_dir)
        if contents is None:
            raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class mypy reads without its fields
        return Resource.from_contents(contents, default_specification=DRAFT202012)

    return Registry(retrieve=retrieve)  # type: ignore[call-arg]  # likewise


def validator_class(schema: Any, suite: bool) -> Any:
    """The jsonschema validator class for a schema: its `$schema`, else 2020-12 for the suite; for
    JSONSchemaBench (mostly draft-04 style without `$schema`) the newest draft whose metaschema accepts it."""
    import jsonschema
    from jsonschema.validators import validator_for

    if suite or (isinstance(schema, dict) and "$schema" in schema):
        return validator_for(schema, default=jsonschema.Draft202012Validator)
    for cls in (jsonschema.Draft202012Validator, jsonschema.Draft7Validator, jsonschema.Draft4Validator):
        try:
            cls.check_schema(schema)
            return cls
        except Exception:
            continue
    return jsonschema.Draft4Validator


def make_checker(schema: Any, suite: bool, data_dir: Path) -> Callable[[Any], tuple[bool, bool, str]]:
    """instance -> (valid ignoring `format`, valid with `format` asserted, first error message)."""
    cls = validator_class(schema, suite)
    kwargs: dict[str, Any] = {"registry": remote_registry(data_dir)}
    plain = cls(schema, **kwargs)
    strict = cls(schema, format_checker=cls.FORMAT_CHECKER, **kwargs)

    def check(instance: Any) -> tuple[bool, bool, str]:
        try:
            err = next(iter(plain.iter_errors(instance)), None)
            if err is not None:
                return False, False, err.message[:300]
            ferr = next(iter(strict.iter_errors(instance)), None)
            return True, ferr is None, "" if ferr is None else "format: " + ferr.message[:300]
        except Exception as e:  # an unresolvable $ref, a recursion limit...
            return False, False, f"{VALIDATOR_ERROR}{type(e).__name__}: {str(e)[:200]}"

    return check
