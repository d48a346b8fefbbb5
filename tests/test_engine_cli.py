"""The ``constrain`` CLI: bad input fails fast with a clear message, a non-zero exit and no
output file; good input writes valid JSONL atomically."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from constrain.engine.cli import EXIT_BAD_INPUT, main

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], message: str, out: Path | None = None) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert re.search(message, err), err
    if out is not None:
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))


def test_missing_schema_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    _fails(capsys, ["generate", "--json-schema", str(tmp_path / "nope.json"), "--prompt", "x", "--output", str(out)],
           "JSON Schema file not found", out)


def test_missing_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["generate", "--regex", "a", "--input", str(tmp_path / "in.jsonl")], "input file not found")


def test_schema_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{'type': 'object'}")
    _fails(capsys, ["compile", "--json-schema", str(bad)], "not valid JSON")


def test_invalid_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "objekt"}))
    _fails(capsys, ["compile", "--json-schema", str(bad)], "does not compile.*objekt")


def test_unsatisfiable_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "never.json"
    bad.write_text(json.dumps({"type": "integer", "minimum": 10, "maximum": 1}))
    out = tmp_path / "out.jsonl"
    _fails(capsys, ["generate", "--json-schema", str(bad), "--prompt", "x", "--output", str(out)],
           "does not compile", out)


def test_unknown_model_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    _fails(capsys, ["generate", "--model", str(tmp_path / "no-model"), "--regex", "a", "--prompt", "x",
                    "--output", str(out)], "model path does not exist", out)


def test_model_folder_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["compile", "--model", str(tmp_path), "--regex", "a"], "no config.json")


@pytest.mark.parametrize("argv", [
    ["generate", "--regex", "a", "--choice", "b", "--prompt", "x"],
    ["generate", "--regex", "a", "--prompt", "x", "--input", "in.jsonl"],
    ["generate", "--regex", "a"],
])
def test_conflicting_or_missing_flags(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_bad_jsonl_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    _fails(capsys, ["generate", "--regex", "a", "--input", str(src)], r"in.jsonl:2")


def test_bad_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["generate", "--regex", "a", "--prompt", "x", "--max-tokens", "0"], "max-tokens")


def test_compile_reports_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--json-schema", "examples/invoice.schema.json"]) == 0
    assert capsys.readouterr().out.startswith("ok: json schema compiled")


def test_generate_jsonl_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "When did the Berlin wall fall?", "id": 1}) + "\n"
                   + json.dumps("When was the Eiffel tower finished?") + "\n")
    out = tmp_path / "out.jsonl"
    pattern = r"\d{4}-\d{2}-\d{2}"
    assert main(["generate", "--regex", pattern, "--input", str(src), "--output", str(out), "--max-tokens", "12",
                 "--progress"]) == 0
    err = capsys.readouterr().err
    assert "loading model" in err and "2/2" in err, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("id") for r in rows] == [1, None]
    for row in rows:
        assert row["finish_reason"] == "stop" and row["valid"] is True
        assert re.fullmatch(pattern, row["text"])


def test_json_options_need_a_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["generate", "--regex", "a", "--prompt", "x", "--property-order", "declared"], "need --json-schema")
    _fails(capsys, ["compile", "--regex", "a", "--lenient"], "need --json-schema")


def test_inline_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--json-schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}']) == 0
    assert capsys.readouterr().out.startswith("ok: json schema compiled")
    _fails(capsys, ["compile", "--json-schema", '{"type": "object",'], "inline JSON Schema is not valid JSON")


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 256)" in out and "(default: 0.0)" in out and "(default: cpu)" in out


def test_lenient_flag_relaxes_what_the_error_names(capsys: pytest.CaptureFixture[str]) -> None:
    schema = json.dumps({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
    _fails(capsys, ["compile", "--json-schema", schema], r"uniqueItems(.|\n)*--lenient")
    assert main(["compile", "--json-schema", schema, "--lenient"]) == 0
    assert "note: relaxed uniqueItems" in capsys.readouterr().out


def test_remote_schemas_folder(capsys: pytest.CaptureFixture[str]) -> None:
    remotes = Path(__file__).resolve().parents[2] / "shared" / "data" / "json-schema-test-suite" / "remotes"
    if not remotes.is_dir():
        pytest.skip("the JSON Schema Test Suite is not in ../shared/data")
    schema = json.dumps({"$ref": "http://localhost:1234/draft2020-12/integer.json"})
    _fails(capsys, ["compile", "--json-schema", schema], r"remote schema(.|\n)*--remote-schemas")
    assert main(["compile", "--json-schema", schema, "--remote-schemas", str(remotes)]) == 0
    assert capsys.readouterr().out.startswith("ok: json schema compiled")
    _fails(capsys, ["compile", "--json-schema", schema, "--remote-schemas", str(remotes / "nope")],
           "--remote-schemas folder not found")


def test_declared_property_order_reaches_the_compiler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
                                  "required": ["zeta", "alpha"], "additionalProperties": False}))
    assert main(["generate", "--json-schema", str(schema), "--property-order", "declared", "--max-tokens", "24",
                 "--prompt", "Give alpha=1 and zeta=2 as JSON."]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["valid"] and list(row["json"]) == ["zeta", "alpha"], row
