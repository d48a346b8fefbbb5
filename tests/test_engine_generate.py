"""Engine generation on the real demo model (CPU, tiny budgets): outputs satisfy their
constraints, a mixed continuous batch equals each request run alone, budgets are honest."""

from __future__ import annotations

import pytest
from support.engine import GREETING_LARK, PERSON_SCHEMA, checker, engine

from constrain.engine.api import ExtractionError, LengthError, Request

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

KEYS_SCHEMA = {  # a long fixed key: the constraint forces it, no forward pass per token
    "type": "object",
    "properties": {"international_standard_book_number": {"type": "string", "pattern": "^[0-9]{3}$"}},
    "required": ["international_standard_book_number"],
    "additionalProperties": False,
}


def _mixed_requests(max_tokens: int = 12) -> list[Request]:
    """16 requests, 16 different constraints (two unconstrained)."""
    q = "Answer briefly."
    return [
        Request("When did the Berlin wall fall?", regex=r"\d{4}-\d{2}-\d{2}", max_tokens=max_tokens),
        Request("Is the sky blue?", choices=["yes", "no"], max_tokens=max_tokens),
        Request("Name a color.", choices=["red", "green", "blue", "light (pale) blue"], max_tokens=max_tokens),
        Request("Greet Anna.", grammar=GREETING_LARK, max_tokens=max_tokens),
        Request("Describe Bob, 42 years old, as JSON.", json_schema=PERSON_SCHEMA, max_tokens=24),
        Request("Give the ISBN suffix.", json_schema=KEYS_SCHEMA, max_tokens=24),
        Request("A phone number?", regex=r"\+?[0-9]{2,3}-[0-9]{3}", max_tokens=max_tokens),
        Request("Write a word.", regex=r"[a-z]{2,6}", max_tokens=max_tokens),
        Request("Count to three.", regex=r"(one|two|three)(, (one|two|three)){0,2}", max_tokens=max_tokens),
        Request("Pick a number.", json_schema={"type": "integer", "minimum": 0, "maximum": 999}, max_tokens=8),
        Request("True or false?", json_schema={"type": "boolean"}, max_tokens=6),
        Request("List two fruits.", json_schema={"type": "array", "items": {"type": "string", "maxLength": 8},
                                                 "maxItems": 2}, max_tokens=24),
        Request("Status?", json_schema={"enum": ["ok", "failed", 3]}, max_tokens=8),
        Request("Say hi.", max_tokens=6),
        Request(q + " What is 2+2?", max_tokens=5),
        Request("Hex byte?", regex=r"0x[0-9a-f]{2}", max_tokens=max_tokens),
    ]


def _kind(r: Request) -> tuple[str, object]:
    c = r.constraint()
    return ("none", None) if c is None else (c.kind, c.source)


def test_every_output_satisfies_its_constraint() -> None:
    reqs = _mixed_requests()
    results = engine().run(reqs)
    assert len(results) == len(reqs)
    for req, res in zip(reqs, results):
        kind, source = _kind(req)
        assert res.finish_reason in ("stop", "length")
        assert len(res.token_ids) <= req.max_tokens
        if kind == "none":
            continue
        assert res.finish_reason == "stop", (req.prompt, res)
        assert checker(kind, source)(res.text), (kind, source, res.text)


def test_mixed_batch_equals_each_request_alone() -> None:
    """Greedy: a continuous batch (6 slots for 16 requests: joins, leaves, slot compaction)
    gives every request the tokens it gets alone."""
    eng = engine()
    reqs = _mixed_requests()
    saved = eng.max_batch
    eng.max_batch = 6
    try:
        batched = eng.run(reqs)
    finally:
        eng.max_batch = saved
    for req, res in zip(reqs, batched):
        alone = eng.run([req])[0]
        assert alone.token_ids == res.token_ids, (req.prompt, alone.text, res.text)
        assert alone.finish_reason == res.finish_reason


def test_seeded_sampling_is_reproducible_and_batch_invariant() -> None:
    eng = engine()
    req = Request("Write a word.", regex=r"[a-z]{2,8}", temperature=1.0, top_p=0.9, top_k=50, seed=7, max_tokens=8)
    other = Request("Say hi.", temperature=0.8, seed=1, max_tokens=6)
    a = eng.run([req])[0]
    b = eng.run([other, req])[1]
    assert a.token_ids == b.token_ids
    assert checker("regex", r"[a-z]{2,8}")(a.text)


def test_forced_text_is_appended_without_sampling() -> None:
    res = engine().run([Request("Give the ISBN suffix.", json_schema=KEYS_SCHEMA, max_tokens=24)])[0]
    assert res.forced_tokens > 0
    assert res.finish_reason == "stop" and checker("json_schema", KEYS_SCHEMA)(res.text)


def test_length_result_is_never_presented_as_valid() -> None:
    eng = engine()
    res = eng.generate("Describe Bob as JSON.", json_schema=PERSON_SCHEMA, max_tokens=3)
    assert res.finish_reason == "length" and not res.valid
    with pytest.raises(LengthError):
        eng.generate("Describe Bob as JSON.", json_schema=PERSON_SCHEMA, max_tokens=3, on_length="raise")
    with pytest.raises(ExtractionError, match="max_tokens"):
        eng.extract("Bob is 42.", PERSON_SCHEMA, max_tokens=3)


def test_extract_returns_a_validated_pydantic_instance() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=12)
        age: int = pydantic.Field(ge=0, le=120)

    got = engine().extract("Bob Smith is a 42 year old carpenter.", Person, max_tokens=30)
    assert isinstance(got, Person)
    as_dict = engine().extract("Bob Smith is a 42 year old carpenter.", PERSON_SCHEMA, max_tokens=30)
    assert as_dict == got.model_dump()


def test_conflicting_constraints_are_rejected() -> None:
    with pytest.raises(ValueError, match="at most one constraint"):
        engine().generate("x", regex="a", choices=["a"])


def _accepts(cg, text: str) -> bool:
    m = cg.matcher()
    return m.accept_bytes(text.encode()) and m.is_accepting()


def test_json_generation_defaults_are_strict_unless_the_schema_is_open() -> None:
    """Declared order, no undeclared keys under the open-object default; an explicit
    ``additionalProperties: true`` stays open; JSON_SCHEMA_SEMANTICS gives the validator's view."""
    from constrain.engine.constraints import JSON_SCHEMA_SEMANTICS, Constraint

    vocab = engine().vocab
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
              "required": ["b", "a"]}
    strict = Constraint.from_args(json_schema=schema).compile(vocab)
    assert _accepts(strict, '{"b":1,"a":2}')
    assert not _accepts(strict, '{"a":2,"b":1}') and not _accepts(strict, '{"b":1,"a":2,"z":3}')
    opened = Constraint.from_args(json_schema={**schema, "additionalProperties": True}).compile(vocab)
    assert _accepts(opened, '{"b":1,"a":2,"z":3}')
    full = Constraint.from_args(json_schema=schema, json_options=JSON_SCHEMA_SEMANTICS).compile(vocab)
    assert _accepts(full, '{"a":2,"b":1}') and _accepts(full, '{"b":1,"a":2,"z":3}')


def test_generate_with_requests_points_to_run() -> None:
    with pytest.raises(TypeError, match=r"prompts\[0\] is a Request: pass Request objects to Engine.run"):
        engine().generate([Request("Hi", max_tokens=2)])
