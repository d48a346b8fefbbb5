"""Bad input gets a clear error or a bounded compile: never a hang, a crash or an unsound mask."""

from __future__ import annotations

import json
import threading
import time

import pytest

import constrain
from constrain.grammars.errors import GrammarError, RegexError, SchemaError
from constrain.grammars.json_schema import json_schema_to_grammar
from constrain.tokenizers import llama3


@pytest.fixture(scope="module")
def vocab() -> constrain.Vocabulary:
    return llama3()


def accepts(compiled: constrain.CompiledGrammar, text: str) -> bool:
    """Feed ``text`` byte by byte (forced-bytes path) and ask for completion."""
    m = compiled.matcher()
    return m.accept_bytes(text.encode()) and m.is_accepting()


def test_malformed_json_text(vocab) -> None:
    with pytest.raises(SchemaError, match="not valid JSON"):
        constrain.compile_json_schema('{"type": "object",', vocab)


def test_unknown_ref_names_the_pointer(vocab) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
    with pytest.raises(SchemaError) as err:
        constrain.compile_json_schema(schema, vocab)
    assert "#/definitions/missing" in str(err.value)
    assert "/properties/a" in str(err.value)


@pytest.mark.parametrize(
    "pattern, fragment",
    [("(ab", "position"), ("a{3,1}", "position"), ("(?:(?=a)b)*", "lookahead"), (r"(a)\1", "backreference")],
)
def test_invalid_or_unsupported_regex(vocab, pattern: str, fragment: str) -> None:
    with pytest.raises(RegexError) as err:
        constrain.compile_regex(pattern, vocab)
    assert fragment in str(err.value).lower()


def test_unsupported_pattern_in_schema_names_keyword_and_pointer(vocab) -> None:
    schema = {"properties": {"p": {"type": "string", "pattern": "(?<=a)b"}}}
    with pytest.raises(GrammarError) as err:
        constrain.compile_json_schema(schema, vocab)
    assert "pattern" in str(err.value) and "/properties/p" in str(err.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 5, "maximum": 3},
        {"type": []},
        {"type": "object", "required": ["a"], "properties": {"b": {}}, "additionalProperties": False},
        {"allOf": [{"type": "string"}, {"type": "number"}]},
        {"enum": []},
    ],
)
def test_unsatisfiable_schema(vocab, schema) -> None:
    with pytest.raises(constrain.UnsatisfiableError, match="(?i)unsatisfiable"):  # callers tell it by type
        constrain.compile_json_schema(schema, vocab)


def test_large_enum_compiles_fast_and_exactly(vocab) -> None:
    members = [f"member-{i:05d}" for i in range(10_000)]
    start = time.perf_counter()
    compiled = constrain.compile_json_schema({"enum": members}, vocab)
    m = compiled.matcher()
    m.allowed_token_ids()
    assert time.perf_counter() - start < 30  # bounded, not a speed claim
    assert accepts(compiled, '"member-04242"')
    assert not accepts(compiled, '"member-10000"')


def test_deep_nesting_200_levels(vocab) -> None:
    schema: dict = {"type": "integer"}
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    compiled = constrain.compile_json_schema(schema, vocab)
    doc = '{"a":' * 200 + "7" + "}" * 200
    assert accepts(compiled, doc)
    assert not accepts(compiled, '{"a":' * 200 + '"x"' + "}" * 200)


def test_five_megabyte_schema_is_bounded(vocab) -> None:
    props = {
        f"field_{i:06d}": {"type": "string", "description": "x" * 1000, "maxLength": 40}
        for i in range(5_000)
    }
    schema = {"type": "object", "properties": props}
    assert len(json.dumps(schema)) > 5_000_000
    start = time.perf_counter()
    compiled = constrain.compile_json_schema(schema, vocab)
    compiled.matcher().allowed_token_ids()
    assert time.perf_counter() - start < 120  # bounded, not a speed claim
    assert accepts(compiled, '{"field_000007":"ok"}')


def test_a_schema_whose_translation_outlasts_the_budget_stops_there(vocab) -> None:
    """The front end keeps to the budget's ``seconds`` too: a compile past it raises the budget's
    error naming the translation, not a result some seconds later (a limit no schema can meet)."""
    props = {f"p{i}": {"type": "object", "properties": {"q": {"type": "integer"}}} for i in range(50)}
    with pytest.raises(constrain.BudgetExceededError, match="translating the schema took more than") as got:
        constrain.compile_json_schema({"type": "object", "properties": props}, vocab,
                                      budget=constrain.CompileBudget(seconds=1e-9))
    assert got.value.budget == "seconds"
    assert constrain.compile_json_schema({"type": "object", "properties": props}, vocab)  # the default budget


def test_vocabulary_without_eos(vocab) -> None:
    no_eos = constrain.Vocabulary.from_token_bytes([b"a", b"{", b"}"], eos_token_ids=[])
    with pytest.raises(GrammarError, match="EOS"):
        constrain.compile_json_schema({"type": "object"}, no_eos)


def test_matchers_share_a_grammar_across_threads(vocab) -> None:
    """Concurrent matchers on one compiled grammar see exactly the single-threaded masks."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    }
    docs = ['{"name":"ab","n":12,"tags":["x","y"]}', '{"n":-3}', '{"tags":[]}', '{"name":"\\u00e9"}']

    def trace(compiled) -> list[list[int]]:
        out = []
        for doc in docs:
            m = compiled.matcher()
            for byte in doc.encode():
                out.append(m.allowed_token_ids()[:50].tolist())
                assert m.accept_bytes(bytes([byte]))
        return out

    expected = trace(constrain.compile_grammar(json_schema_to_grammar(schema), vocab))
    shared = constrain.compile_grammar(json_schema_to_grammar(schema), vocab)
    results: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, trace(shared))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


def test_compile_options_with_mappings_are_cached_by_content(vocab) -> None:
    remote = {"http://example.com/a.json": {"type": "integer"}}
    schema = {"$ref": "http://example.com/a.json"}
    first = constrain.compile_json_schema(schema, vocab, remote_schemas=remote)
    again = constrain.compile_json_schema(schema, vocab, remote_schemas=dict(remote))
    assert first is again
    assert accepts(first, "42") and not accepts(first, '"x"')
