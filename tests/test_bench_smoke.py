"""bench/compare.py end to end on two schemas with one engine (llguidance: the quickest to build)."""

import importlib.util
import json

import pytest

from bench.data import DEFAULT_DATA

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llguidance") is None or not (DEFAULT_DATA / "jsonschemabench").is_dir(),
    reason="needs llguidance and ../shared/data",
)


def test_compare_two_schemas(tmp_path, capsys):
    from bench.compare import main

    out = tmp_path / "raw.jsonl"
    assert main(["--subsets", "Github_trivial,ts/const", "--limit", "1", "--engines", "llguidance",
                 "--walks", "2", "--max-tokens", "60", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["Github_trivial/o10018", "ts/const#0"]
    for r in recs:
        assert r["compile"]["status"] == "ok"
        assert r["test_status"] == "ok"
        assert all(w["status"] != "unsound" for w in r["walks"])
    const = recs[1]["instances"]  # {"const": 2}: 2 accepted; 5 and "a" rejected
    assert [(i["valid"], i["accepted"]) for i in const] == [(True, True), (False, False), (False, False)]
    report = capsys.readouterr().out
    assert "### JSONSchemaBench" in report and "### JSON Schema Test Suite" in report
    assert "**pass %**" in report
