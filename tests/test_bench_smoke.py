"""bench/compare.py end to end on two schemas with one engine (llguidance: the quickest to build),
run as a user runs it: a subprocess whose report and raw records are read back."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from constrain.testing.corpus import DEFAULT_DATA

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llguidance") is None or not (DEFAULT_DATA / "jsonschemabench").is_dir(),
    reason="needs llguidance and ../shared/data",
)


def test_compare_two_schemas(tmp_path):
    out = tmp_path / "raw.jsonl"
    proc = subprocess.run(
        [sys.executable, "bench/compare.py", "--subsets", "Github_trivial,ts/const", "--limit", "1",
         "--engines", "llguidance", "--walks", "2", "--max-tokens", "60", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["Github_trivial/o10018", "ts/const#0"]
    for r in recs:
        assert r["compile"]["status"] == "ok"
        assert r["test_status"] == "ok"
        assert all(w["status"] != "unsound" for w in r["walks"])
    const = recs[1]["instances"]  # {"const": 2}: 2 accepted; 5 and "a" rejected
    assert [(i["valid"], i["accepted"]) for i in const] == [(True, True), (False, False), (False, False)]
    report = proc.stdout
    assert "### JSONSchemaBench" in report and "### JSON Schema Test Suite" in report
    assert "**pass %**" in report
