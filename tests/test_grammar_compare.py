"""bench/grammar_compare.py end to end, tiny: llguidance vs constrain on llama3, a few short walks,
run as a subprocess whose report and raw results are read back."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llguidance") is None or importlib.util.find_spec("lark") is None,
    reason="needs llguidance and lark",
)


def test_grammar_compare_smoke(tmp_path):
    raw = tmp_path / "raw.json"
    proc = subprocess.run(
        [sys.executable, "bench/grammar_compare.py", "--tokenizers", "llama3", "--engines", "constrain,llguidance",
         "--walks", "2", "--max-tokens", "40", "--reps", "1", "--depths", "3", "--raw", str(raw)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(raw.read_text())["llama3"]
    for engine in ("constrain", "llguidance"):
        for g in ("json", "sql_select"):
            rec = res[engine]["grammars"][g]
            assert "error" not in rec and len(rec["compile_s"]) == 1 and len(rec["walks"]) == 2
        assert res[engine]["grammars"]["json"]["deep"]["3"]["status"] == "ok"
    report = proc.stdout
    assert "| llama3 | json | constrain |" in report and "**UNSOUND**" not in report
    assert "Against the target" in report
