"""The Lark front end against lark's own Earley parser, on every short string over small alphabets.

Our language is lark's with ``lexer="dynamic_complete"`` (every string of a terminal's language
is a possible token); where terminals cannot run into each other it equals ``lexer="dynamic"``'s,
and those grammars are checked against both.
"""

from __future__ import annotations

import itertools

import lark
import pytest

import constrain
from constrain.derivatives import NOTHING, ExprTable
from constrain.grammars.errors import LarkGrammarError
from constrain.grammars.lark_frontend import lark_to_grammar


def accepts_ours(grammar, strings):
    table = ExprTable(grammar)
    out = {}
    for s in strings:
        state = table.start
        for b in s.encode():
            state = table.derive(state, b)
            if state == NOTHING:
                break
        out[s] = state != NOTHING and table.nullable(state)
    return out


def accepts_lark(text, strings, lexer):
    parser = lark.Lark(text, parser="earley", lexer=lexer)
    out = {}
    for s in strings:
        try:
            parser.parse(s)
            out[s] = True
        except lark.exceptions.LarkError:
            out[s] = False
    return out


def all_strings(alphabet, max_len):
    return ["".join(p) for n in range(max_len + 1) for p in itertools.product(alphabet, repeat=n)]


CASES = {
    # name: (grammar, alphabet, max length, also equal to lexer="dynamic")
    "direct left recursion": ("""
        start: start "+" term | term
        term: "a" | "(" start ")"
        """, "a+()", 6, True),
    "left recursion with ? inlining and aliases": ("""
        ?start: sum
        ?sum: sum "+" prod -> add | sum "-" prod -> sub | prod
        ?prod: prod "*" atom | atom
        ?atom: "x" | "-" atom | "(" sum ")"
        """, "x+-*()", 4, True),
    "indirect left recursion": ("""
        start: b "x" | "y"
        b: start "z" | "w" | c
        c: b "v"
        """, "xyzwv", 5, True),
    "left recursion behind a nullable prefix": ("""
        start: p start "x" | "y"
        p: "b"?
        """, "bxy", 6, True),
    "left recursion through [maybe]": ("""
        start: [start ","] "a"
        """, "a,", 6, True),
    "cycles without input": ("""
        start: start | a
        a: b | "x" | "(" a ")"
        b: a
        """, "x()", 5, True),
    "ebnf operators": ("""
        start: "a"+ ["b"] ("c" | "d"i)* "e" ~ 2..3 "f"~1
        """, "abDef", 5, True),
    "templates": ("""
        start: sep{"a", ","} ";" sep{x, "."}
        x: "b" | "c"
        sep{item, delim}: item (delim item)*
        """, "ab,.;", 5, True),
    "ignore": ("""
        start: "a" b "a"
        b: "b"*
        %ignore " "
        """, "ab ", 6, True),
    "ignore with two terminals and a nullable start": ("""
        start: WORD*
        WORD: "x" "y"?
        %ignore " "
        %ignore /#[^\\n]*\\n/
        """, "xy #\n", 5, False),
    "regex flags and ranges": ("""
        start: /ab+/i "c" | R+
        R: "0".."2"
        """, "aAbBc02", 5, False),
    "terminal composition": ("""
        start: NUM ("," NUM)*
        NUM: DIGIT+ ("." DIGIT+)?
        DIGIT: "0".."1"
        """, "01.,", 6, False),
    "imports from common.lark": ("""
        start: INT ("+" INT)*
        %import common (INT, WS_INLINE)
        %ignore WS_INLINE
        """, "12+ ", 5, True),
    "common.ESCAPED_STRING (its lookbehind replaced by escape pairs)": ("""
        start: ESCAPED_STRING ("," ESCAPED_STRING)*
        %import common.ESCAPED_STRING
        """, '"\\a,', 6, True),
    "lazy quantifier: lark takes the shortest match": ("""
        start: (C_COMMENT | "a")+
        %import common.C_COMMENT
        %ignore " "
        """, "/*a ", 6, True),
    "extend and override": ("""
        start: "a" | "b"
        %extend start: "c"
        other: "d"
        %override other: "e"
        """, "abcde", 2, True),
}


@pytest.mark.parametrize("name", CASES)
def test_language_matches_lark(name):
    text, alphabet, max_len, dynamic_too = CASES[name]
    strings = all_strings(alphabet, max_len)
    ours = accepts_ours(lark_to_grammar(text), strings)
    complete = accepts_lark(text, strings, "dynamic_complete")
    diff = [s for s in strings if ours[s] != complete[s]]
    assert not diff, f"{len(diff)} differences, e.g. {[(s, ours[s]) for s in diff[:5]]}"
    assert any(ours.values())
    if dynamic_too:
        dynamic = accepts_lark(text, strings, "dynamic")
        diff = [s for s in strings if ours[s] != dynamic[s]]
        assert not diff, f"differs from lexer=dynamic on {diff[:5]}"


def test_greedy_terminal_difference_is_the_documented_one():
    text = 'start: A "ab"\nA: /a+/\n'
    ours = accepts_ours(lark_to_grammar(text), ["aab", "aaab"])
    assert ours == {"aab": True, "aaab": True}
    assert accepts_lark(text, ["aab"], "dynamic") == {"aab": False}  # lark's A ate every "a"
    assert accepts_lark(text, ["aab"], "dynamic_complete") == {"aab": True}


def test_no_left_recursion_left_for_the_engine():
    grammar = lark_to_grammar("""
        start: expr
        expr: expr "+" term | term
        term: term "*" factor | factor
        factor: "x" | "(" expr ")"
    """)
    vocab = constrain.Vocabulary.from_token_bytes([b"x", b"+", b"*", b"(", b")", None], eos_token_ids=[5])
    m = constrain.compile_grammar(grammar, vocab).matcher()
    for tok in [3, 0, 1, 0, 4, 2, 0, 5]:  # (x+x)*x EOS
        assert m.accept_token(tok)
    assert m.is_terminated()


def test_shortest_match_terminal_on_a_real_tokenizer():
    from constrain import tokenizers

    vocab, tok = tokenizers.gpt2(), tokenizers.gpt2_tokenizer()
    grammar = constrain.compile_lark('start: C_COMMENT\n%import common.C_COMMENT\n', vocab)
    for text, ok in [("/* a * b */", True), ("/* a */ b */", False), ("/**/", True)]:
        m = grammar.matcher()
        got = all(m.accept_token(t) for t in tok.encode(text)) and m.accept_token(vocab.eos_token_ids[0])
        assert got == ok, text


def test_start_rule_choice():
    g = lark_to_grammar('start: "a" other\nother: "b"\n', start="other")
    assert accepts_ours(g, ["b", "ab"]) == {"b": True, "ab": False}


def test_builtin_import():
    g = lark_to_grammar('start: "x=" value\n%import json.value\n')
    assert accepts_ours(g, ['x=[1, {"a": null}]', "x=[1,]"]) == {'x=[1, {"a": null}]': True, "x=[1,]": False}


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("text, words, line", [
    ('start: a\n', ["'a'", "not defined"], 1),
    ('start: "x" b\n\nb: "y" c\n', ["'c'", "not defined"], 3),
    ('start: "x" (\n', ["parenthesis"], 1),
    ('start: "x"\nstart: "y"\n', ["more than once"], 2),
    ('start: "x" FOO\n%declare FOO\n', ["%declare", "FOO"], 2),
    ('start: A\nA: ""\n', ["empty"], None),
    ('start: "a"\n  | /(a)\\1/\n', ["backreference"], 2),
    ('start: A\nA: /a*/\n', ["empty string"], 2),
    ('start: "a" ~ 3..2\n', ["3..2"], 1),
    ('start: t{"a"}\nt{x, y}: x y\n', ["arguments"], 1),
    ('start: "a" )\n', ["syntax", ")"], 1),
    ('start: /a+?b*/\n', ["lazy and greedy"], 1),
    ('start: X\n%import common._STRING_ESC_INNER -> X\n', ["lookbehind"], 2),
    ('start: X\n%import common._STRING_INNER -> X\n', ["empty string"], 2),
])
def test_bad_grammar(text, words, line):
    with pytest.raises(LarkGrammarError) as info:
        lark_to_grammar(text)
    message = str(info.value)
    for word in words:
        assert word.lower() in message.lower(), message
    if line is not None:
        assert info.value.line == line, message
        assert f"line {line}" in message


def test_missing_start_rule():
    with pytest.raises(LarkGrammarError, match="start rule 'begin'"):
        lark_to_grammar('start: "a"\n', start="begin")


def test_empty_language_is_unsatisfiable_at_compile():
    vocab = constrain.Vocabulary.from_token_bytes([b"x", b"y", None], eos_token_ids=[2])
    grammar = lark_to_grammar('start: a\na: "x" a\n')
    assert any("empty" in note for note in grammar.notes)
    with pytest.raises(constrain.UnsatisfiableError, match="unsatisfiable"):
        constrain.compile_lark('start: a\na: "x" a\n', vocab)


def test_dead_branches_are_removed():
    vocab = constrain.Vocabulary.from_token_bytes([b"a", b"b", b"c", None], eos_token_ids=[3])
    m = constrain.compile_lark('start: "a" | "b" loop\nloop: "c" loop\n', vocab).matcher()
    assert list(m.allowed_token_ids()) == [0]  # "b" would lead into a dead end


N_RULES = 10_000
N_CHAIN = 2_000  # deep enough for Python's recursion limit
CHAIN = "start: r0\n" + "".join(f'r{i}: "a" r{i + 1} | "b"\n' for i in range(N_CHAIN)) + f'r{N_CHAIN}: "c"\n'
WIDE = "start: " + " | ".join(f"k{i}" for i in range(N_RULES)) + "\n" + "".join(
    f'k{i}: "w{i}" ";"\n' for i in range(N_RULES))


@pytest.mark.parametrize("text, tokens", [
    pytest.param(CHAIN, [0, 0, 0, 1], id="chain"),
    pytest.param(WIDE, [3, 6, 7, 8, 4], id="wide"),  # w123;
])
def test_ten_thousand_rules_compile(text, tokens):
    """Size is not a failure (no timing here: shared machines are noisy; bench/ measures speed)."""
    vocab = constrain.Vocabulary.from_token_bytes(
        [b"a", b"b", b"c", b"w", b";"] + [str(d).encode() for d in range(10)] + [None], eos_token_ids=[15])
    m = constrain.compile_grammar(lark_to_grammar(text), vocab).matcher()
    for tok in tokens:
        assert m.accept_token(tok)
    assert m.accept_token(15)
