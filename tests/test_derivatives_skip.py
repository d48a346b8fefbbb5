"""A union's derivative skips the members whose first bytes lack the byte: checked against the
same table deriving every member, state pair by state pair (a product walk: any string that the
two languages disagree on is found, within the walk's budget, as a pair that differs in
nullability or in deadness)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain.derivatives import ALL_BYTES, NOTHING, ExprTable
from constrain.grammars import ir
from constrain.grammars.json_schema import json_schema_to_grammar
from constrain.grammars.lark_frontend import lark_to_grammar
from constrain.grammars.regex import regex_to_ir


class Unskipped(ExprTable):
    """The oracle: every byte may start every member, so no member is ever skipped."""

    def first_bytes(self, e: int) -> int:
        return ALL_BYTES


def assert_same_language(grammar: ir.Grammar, alphabet: bytes, max_pairs: int = 1500) -> None:
    """Walk both tables over ``alphabet`` in step; every pair must agree on NOTHING and nullable."""
    fast, slow = ExprTable(grammar), Unskipped(grammar)
    start = (fast.start, slow.start)
    seen, frontier = {start: b""}, [start]
    while frontier and len(seen) < max_pairs:
        nxt = []
        for f, s in frontier:
            assert fast.nullable(f) == slow.nullable(s), seen[f, s]
            for b in alphabet:
                pair = (fast.derive(f, b), slow.derive(s, b))
                text = seen[f, s] + bytes([b])
                assert (pair[0] == NOTHING) == (pair[1] == NOTHING), text
                assert fast.is_live(pair[0]) == slow.is_live(pair[1]), text
                if pair[0] != NOTHING and pair not in seen:
                    seen[pair] = text
                    nxt.append(pair)
        frontier = nxt


LARK = [
    # nullable rules ahead of a union's members, and rules that reach themselves through them
    'start: a b | b "z" | c\na: "x"* | "q"\nb: a "y" | "w"\nc: "(" start ")" c | ',
    'start: item+\nitem: key | key "=" value\nkey: /[a-c]+/\nvalue: "[" start "]" | /[0-9]+/ | ',
]
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "string"}, "b": {"type": "boolean"}},
     "additionalProperties": {"type": "string", "maxLength": 2}},
    {"anyOf": [{"type": "array", "items": {"$ref": "#"}}, {"type": "string", "pattern": "^a*b?$"},
               {"enum": ["ab", "abc", 12, None]}]},
    {"type": "object", "properties": {"x": {"type": "string", "format": "date"}}, "required": ["x"],
     "additionalProperties": False},
]


@pytest.mark.parametrize("text", LARK)
def test_skipping_keeps_lark_languages(text: str) -> None:
    assert_same_language(lark_to_grammar(text), b"xyzqw()=[]abc01")


@pytest.mark.parametrize("schema", SCHEMAS)
def test_skipping_keeps_json_schema_languages(schema: dict) -> None:
    assert_same_language(json_schema_to_grammar(schema), b'{}[]",:abcxz012-tn ')


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "ab", "a*", "(b|c)+", "[^a]", "a?b", "", "c{2,3}"]),
                min_size=2, max_size=6),
       st.sampled_from(["|", ""]), st.booleans())
def test_skipping_keeps_regex_languages(parts: list[str], join: str, negate: bool) -> None:
    node = regex_to_ir("(" + ")|(".join(parts) + ")" if join else "".join(f"({p})" for p in parts))
    if negate:
        node = ir.intersect(node, ir.complement(regex_to_ir("(a|b)*c")))
    assert_same_language(ir.Grammar.of(node), b"abcd")


def test_the_oracle_sees_a_wrongly_skipped_member(monkeypatch: pytest.MonkeyPatch) -> None:
    """First bytes that miss one a member may start with must fail the comparison."""
    real = ExprTable.first_bytes

    def under(self: ExprTable, e: int) -> int:
        return real(self, e) & ~(1 << ord("b"))

    monkeypatch.setattr(ExprTable, "first_bytes", under)
    with pytest.raises(AssertionError):
        assert_same_language(ir.Grammar.of(regex_to_ir("a|bc")), b"abc")
