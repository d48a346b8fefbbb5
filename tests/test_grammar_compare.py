"""bench/grammar_compare.py end to end, tiny: llguidance vs constrain on llama3, a few short walks."""

import importlib.util
import json

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llguidance") is None or importlib.util.find_spec("lark") is None,
    reason="needs llguidance and lark",
)


def test_grammar_compare_smoke(tmp_path, capsys):
    from bench.grammar_compare import main

    raw = tmp_path / "raw.json"
    assert main(["--tokenizers", "llama3", "--engines", "constrain,llguidance", "--walks", "2",
                 "--max-tokens", "40", "--reps", "1", "--depths", "3", "--raw", str(raw)]) == 0
    res = json.loads(raw.read_text())["llama3"]
    for engine in ("constrain", "llguidance"):
        for g in ("json", "sql_select"):
            rec = res[engine]["grammars"][g]
            assert "error" not in rec and len(rec["compile_s"]) == 1 and len(rec["walks"]) == 2
        assert res[engine]["grammars"]["json"]["deep"]["3"]["status"] == "ok"
    report = capsys.readouterr().out
    assert "| llama3 | json | constrain |" in report and "**UNSOUND**" not in report
    assert "Against the target" in report


def test_sql_structural_tokens_cannot_continue_a_name():
    from bench.grammar_compare import structural_set

    toks = [b" FROM", b"FROM", b")", b"'", b"abc", None, b" where"]
    assert structural_set("sql_select", toks) == [True, False, True, True, False, False, True]
    assert structural_set("json", [b"{", b'":', b"a", None]) == [True, True, False, False]
