"""Behaviour the front end's speed relies on: shared nodes, what is (not) hashed, and the length
analysis giving the same answers however nodes are shared between rules."""

from __future__ import annotations

import gc

from constrain.grammars import ir
from constrain.grammars.analysis import measure_rules, refs, rule_min_lengths
from constrain.grammars.json_schema import json_schema_to_grammar
from constrain.grammars.json_schema.translate import Options, Translator


def test_literals_share_their_byte_nodes() -> None:
    a, ab = ir.literal("a"), ir.literal(b"ab")
    assert isinstance(ab, ir.Seq) and ab.items[0] is a and ab.items[1] is ir.literal("b")


def test_a_key_is_spelled_once_per_translation() -> None:
    t = Translator({"type": "object"}, Options())
    assert t.key_literal("k") is t.key_literal("k") and t.key_body_literal("k") is t.key_body_literal("k")
    assert t.key_body_literal("k") == ir.literal("k") and t.key_body_literal("ke") == ir.literal("ke")
    assert t.key_body_literal("") == ir.EMPTY


def test_translations_keep_no_nodes_alive_after_them() -> None:
    """Every full collection walks what the process keeps: process-wide tables of key spellings
    held thousands of nodes (~40% of a bench worker's tracked objects) for little reuse."""
    json_schema_to_grammar({"type": "object", "properties": {"warm": {"const": "up"}}})
    gc.collect()
    before = len(gc.get_objects())
    for i in range(40):
        json_schema_to_grammar({"type": "object", "properties": {f"key{i}-{j}": {"const": f"v{i}-{j}"} for j in range(20)},
                                "additionalProperties": False})
    gc.collect()
    assert len(gc.get_objects()) - before < 40


def test_a_lone_alternative_is_not_hashed() -> None:
    body = ir.Seq((ir.literal("x"), ir.Ref("r")))
    assert ir.alt(body) is body and body._hash is None
    other = ir.Seq((ir.literal("x"), ir.Ref("r")))  # equal, not identical: still de-duplicated
    assert ir.alt(body, other, ir.literal("y")) == ir.Alt((ir.literal("y"), body))


def test_refs_sees_through_every_node_kind_and_shared_subtrees() -> None:
    shared = ir.seq(ir.literal("ab"), ir.ref("a"))
    node = ir.alt(shared, ir.seq(ir.literal("c"), shared),
                  ir.unordered([(ir.seq(ir.literal("k"), ir.ref("b")), True)], ir.ref("c"), sep=ir.ref("d")),
                  ir.intersect(ir.repeat(ir.ref("e")), ir.complement(ir.ref("f"))))
    assert refs(node) == {"a", "b", "c", "d", "e", "f"}
    assert refs(ir.literal("abc")) == set()


def test_refs_still_finds_a_reference_under_a_measured_optional_repeat() -> None:
    """``x*`` measures 0 without looking at ``x``: it must not pass for rule-free (``refs`` skips
    subtrees whose length is cached)."""
    star = ir.repeat(ir.seq(ir.ref("r"), ir.literal("x")))
    rules = {"start": ir.seq(star, ir.literal("y")), "r": ir.literal("a")}
    assert rule_min_lengths(rules) == {"start": 1, "r": 1}
    assert refs(rules["start"]) == {"r"}


def test_a_subtree_shared_inside_a_cycle_is_measured_afresh_each_round() -> None:
    """``X`` depends on rule ``s``, still falling while the cycle ``r``/``s`` settles: its second
    user must not keep the length it had in the first round (``r`` is ``b c z``: 3)."""
    for order in (1, -1):
        x = ir.alt(ir.seq(ir.literal("c"), ir.ref("s")), ir.literal("dddddddd"))
        rules = {"r": ir.alt(ir.seq(x, ir.ref("u")), ir.seq(ir.literal("b"), x)),
                 "s": ir.alt(ir.literal("z"), ir.ref("r")),
                 "u": ir.seq(ir.literal("u"), ir.ref("u"))}
        assert rule_min_lengths(dict(list(rules.items())[::order])) == {"r": 3, "s": 1}


def test_a_lower_bound_shared_by_two_rules_bounds_both() -> None:
    """Without ``exact`` an intersection's length is a lower bound; every rule using it is then
    measured again by the compiler's exact pass, including one that meets it second."""
    both = ir.intersect(ir.literal("ab"), ir.repeat(ir.ANY_BYTE, 3))
    lengths = measure_rules({"a": ir.seq(ir.literal("x"), both), "b": ir.alt(both, ir.literal("yyyyyy"))})
    assert lengths.bounded == {"a", "b"}


def test_objects_with_many_shared_keys_compile_to_one_rule_each() -> None:
    """Objects repeating one key set (spelled once, shared by every copy): each position still
    gets a rule of its own, and the grammar measures."""
    fields = {f"k{i}": {"type": "string"} for i in range(40)}
    schema = {"type": "object", "properties": {f"p{j}": {"type": "object", "properties": fields} for j in range(20)}}
    grammar = json_schema_to_grammar(schema)
    assert len([n for n in grammar.rules if "/properties/p" in n and "/properties/k" not in n]) == 20
    assert grammar.min_lengths["start"] == 2


def test_a_translation_leaves_no_cycles_for_the_collector() -> None:
    """Its objects go as the grammar is returned, not at Python's next full collection, which
    lands on whichever request runs then (20-100 ms on a heap of compiled grammars)."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#",
              "definitions": {"item": {"type": "object", "properties": {"n": {"type": "integer"}, "next": {"$ref": "#/definitions/item"}}}},
              "type": "object", "properties": {"head": {"$ref": "#/definitions/item"}, "when": {"type": "string", "format": "no-such"},
                                               "tag": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}},
              "required": ["head"], "dependentRequired": {"tag": ["when"]}}
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        grammar = json_schema_to_grammar(schema)
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()
    assert [n.split()[0] for n in grammar.notes] == ["'dependentRequired'", "ignored"]  # the normalizer's and its own


def test_grammars_share_the_body_of_any_value() -> None:
    """Built once per whitespace option, not per compile (building it and walking a fresh copy in
    the length analysis cost ~13% of a small schema's front end)."""
    one, two = json_schema_to_grammar({"type": "object"}), json_schema_to_grammar({"items": {"x-note": 1}})
    assert one.rules["any"] is two.rules["any"]
    flexible = json_schema_to_grammar({"type": "object"}, whitespace="flexible")
    assert flexible.rules["any"] is not one.rules["any"]
    assert flexible.rules["any"] is json_schema_to_grammar({}, whitespace="flexible").rules["any"]
