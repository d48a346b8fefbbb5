"""The regex and Lark front ends' defects from the fuzzing issue, each against its oracle
(``re`` for regexes, lark's own parser for grammars).

Deep inputs run in a fresh interpreter, so that no earlier test's recursion limit helps them.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import lark
import pytest

import constrain
from constrain import Vocabulary
from constrain.derivatives import matches
from constrain.grammars.errors import LarkGrammarError, RegexError
from constrain.grammars.lark_frontend import MAX_NESTING as LARK_NESTING
from constrain.grammars.lark_frontend import lark_to_grammar
from constrain.grammars.regex import regex_to_ir
from constrain.grammars.regex_parser import MAX_NESTING as REGEX_NESTING


def fresh_process(code: str) -> str:
    """Run ``code`` in a new interpreter with the default recursion limit; its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def lark_accepts(text: str, s: str) -> bool:
    try:
        lark.Lark(text, parser="earley", lexer="dynamic").parse(s)
        return True
    except lark.exceptions.LarkError:
        return False


# ------------------------------------------------------------------ defect 2: deep inputs

def test_deep_regex_groups_name_the_depth_in_a_fresh_process() -> None:
    out = fresh_process("""
        import sys
        from constrain.grammars.errors import RegexError
        from constrain.grammars.regex import regex_to_ir
        limit = sys.getrecursionlimit()
        for pattern in ["(" * 1000 + "a" + ")" * 1000, "(?:a|" * 1000 + ")" * 1000, "(?=a" * 1000 + ")" * 1000]:
            try:
                regex_to_ir(pattern)
            except RegexError as e:
                print(e.position, str(e).split(" at position")[0])
        assert sys.getrecursionlimit() == limit
    """)
    lines = out.splitlines()
    assert len(lines) == 3
    for line, step in zip(lines, (1, 5, 4)):
        assert line == f"{REGEX_NESTING * step} groups nested more than {REGEX_NESTING} deep"


def test_regex_at_the_nesting_limit_agrees_with_re() -> None:
    pattern = "(a|b" * REGEX_NESTING + ")" * REGEX_NESTING
    node = regex_to_ir(pattern)
    for text in ["a", "b", "ab", "aab", "b" * REGEX_NESTING, "a" * REGEX_NESTING + "c", ""]:
        assert matches(node, text.encode()) == bool(re.fullmatch(pattern, text)), text


def test_long_patterns_are_quoted_short_in_messages() -> None:
    pattern = "(" * 1000 + "a" + ")" * 1000
    with pytest.raises(RegexError) as info:
        regex_to_ir(pattern)
    assert len(str(info.value)) < 400 and "(2001 characters)" in str(info.value)
    assert info.value.pattern == pattern


CHAIN_CODE = """
    import sys
    limit = sys.getrecursionlimit()
    from constrain.derivatives import matches
    from constrain.grammars.lark_frontend import lark_to_grammar
    for n in (500, 5000):
        head = "start: r0\\n" + "".join(f'r{i}: r{i + 1} "a" | "b"\\n' for i in range(n)) + f'r{n}: "c"\\n'
        tail = "start: r0\\n" + "".join(f'r{i}: "a" r{i + 1} | "b"\\n' for i in range(n)) + f'r{n}: "c"\\n'
        print(len(lark_to_grammar(head).rules), len(lark_to_grammar(tail).rules))
    print(sys.getrecursionlimit() == limit)
"""


def test_lark_rule_chains_convert_in_a_fresh_process() -> None:
    """Chains of 500 and 5,000 rules, leftmost or not, become IR without any recursion per rule."""
    assert fresh_process(CHAIN_CODE).split() == ["502", "502", "5002", "5002", "True"]


def test_lark_chain_language_agrees_with_lark() -> None:
    n = 30
    text = "start: r0\n" + "".join(f'r{i}: r{i + 1} "a" | "b"\n' for i in range(n)) + f'r{n}: "c"\n'
    grammar = lark_to_grammar(text)
    for s in ["b", "c", "ba", "c" + "a" * n, "c" + "a" * (n + 1), "baa", "ab"]:
        assert matches(grammar, s.encode()) == lark_accepts(text, s), s


@pytest.mark.parametrize("depth, fragment", [
    (LARK_NESTING + 1, f"start nests parentheses more than {LARK_NESTING} deep"),
    (5000, "nests too deeply for lark's grammar loader"),
])
def test_deeply_nested_lark_rules_name_the_depth(depth: int, fragment: str) -> None:
    with pytest.raises(LarkGrammarError, match=fragment):
        lark_to_grammar("start: " + "(" * depth + '"a"' + ")" * depth)


def test_lark_rule_at_the_nesting_limit_agrees_with_lark() -> None:
    text = "start: " + '("a" ' * LARK_NESTING + '"b"' + ")" * LARK_NESTING
    grammar = lark_to_grammar(text)
    for s in ["a" * LARK_NESTING + "b", "a" * (LARK_NESTING - 1) + "b", "b"]:
        assert matches(grammar, s.encode()) == lark_accepts(text, s), s


# -------------------------------------------------- defect 11: indirect left recursion

def left_cycle(n: int) -> str:
    """``r_i: r_{i+1} "a<i>" | "b<i>"`` around a cycle of n rules."""
    return "start: r0\n" + "".join(f'r{i}: r{(i + 1) % n} "a{i}" | "b{i}"\n' for i in range(n))


def test_indirect_left_recursion_through_300_rules_is_rewritten() -> None:
    """Took over 180 s when the cycle's whole bodies were substituted into each other."""
    grammar = lark_to_grammar(left_cycle(300))
    assert set(grammar.rules) == {"start", *(f"r{i}" for i in range(300))}
    grammar = lark_to_grammar(left_cycle(40))
    loop = "".join(f"a{i}" for i in range(39, -1, -1))
    for s in ["b0", "b1a0", "b2a0", "b39" + loop[3:], "b0" + loop, "b0" + loop + loop, "b0" + loop[:-2], "a0"]:
        assert matches(grammar, s.encode()) == _in_cycle_language(s, 40), s


def _in_cycle_language(s: str, n: int) -> bool:
    """Whether ``s`` is ``b<k> a<k-1> ... a<0>`` (indices mod n): the language of ``left_cycle(n)``."""
    words = re.findall(r"[ab]\d+", s)
    if "".join(words) != s or not words or words[0][0] != "b":
        return False
    k, m = int(words[0][1:]), len(words) - 1
    return words[1:] == [f"a{(k - 1 - j) % n}" for j in range(m)] and (k - m) % n == 0


def test_indirect_left_recursion_agrees_with_lark() -> None:
    text = left_cycle(4)
    grammar = lark_to_grammar(text)
    words = ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    for n in range(1, 5):
        for parts in itertools.product(words, repeat=n):
            s = "".join(parts)
            assert matches(grammar, s.encode()) == lark_accepts(text, s), s


# ------------------------------------------------------ defect 14: inline zero-width regexes

@pytest.mark.parametrize("text", ['start: "x" /a*/ "y"', "start: /a?/", 'start: "/*" /(.|\\n)*?/ "*/"',
                                  "start: A\nA: /a*/"])
def test_zero_width_regexes_are_refused_as_lark_refuses_them(text: str) -> None:
    with pytest.raises(lark.exceptions.GrammarError, match="zero-width"):
        lark.Lark(text)
    with pytest.raises(LarkGrammarError, match="matches the empty string") as info:
        lark_to_grammar(text)
    assert info.value.line == text.count("\n") + 1


def test_a_regex_that_is_not_zero_width_still_compiles() -> None:
    text = 'start: "x" /a+/? "y"'
    grammar = lark_to_grammar(text)
    for s in ["xy", "xay", "xaay", "xa"]:
        assert matches(grammar, s.encode()) == lark_accepts(text, s), s


# --------------------------------------------------- defect 13: a true message for (?m)^a$\n^b$

@pytest.mark.parametrize("pattern", ["(?m)^a$\n^b$", "a$\n^b", "(?m)^a$\n^b$\n^c", "(?m)x(?=.)\n^b", "(?m)a$\\n^b"])
def test_start_anchor_after_an_end_anchor_agrees_with_re(pattern: str) -> None:
    node = regex_to_ir(pattern)
    for text in ["a\nb", "a\nb\n", "ab", "x\nb", "a", "a\nb\nc", "\nb"]:
        assert matches(node, text.encode()) == bool(re.fullmatch(pattern, text)), (pattern, text)


@pytest.mark.parametrize("pattern, message, position", [
    ("(?m)a$^b", "anchor ^ after the end anchor $ is supported only where text that cannot be empty", 6),
    ("(?m)(?=a)^a", "anchor ^ after a lookahead is supported only where", 9),
])
def test_start_anchor_with_nothing_before_it_names_what_it_follows(pattern: str, message: str,
                                                                   position: int) -> None:
    with pytest.raises(RegexError, match=re.escape(message)) as info:
        regex_to_ir(pattern)
    assert info.value.position == position


# ----------------------------------------------- what the README promises about regexes

def test_lookaheads_compile_and_follow_re_on_a_real_tokenizer(vocab_by_name: Callable[[str], Vocabulary]) -> None:
    vocab = vocab_by_name("llama3")
    grammar = constrain.compile_regex("foo(?!bar)[a-z]{3}", vocab)
    for text in ["foobaz", "foobar", "fooqux", "foo"]:
        matcher = grammar.matcher()
        ok = matcher.accept_bytes(text.encode()) and matcher.accept_token(vocab.eos_token_ids[0])
        assert ok == bool(re.fullmatch("foo(?!bar)[a-z]{3}", text)), text


@pytest.mark.parametrize("pattern, feature, position", [
    ("ab(?<=b)c", "lookbehind (?<=...)", 2),
    ("a(?<!x)", "negative lookbehind (?<!...)", 1),
    ("(a)b\\1", "backreferences (\\1)", 4),
    ("(?P<x>a)(?P=x)", "backreferences (?P=name)", 8),
])
def test_lookbehind_and_backreferences_are_refused_with_the_position(pattern: str, feature: str,
                                                                     position: int) -> None:
    with pytest.raises(RegexError) as info:
        constrain.compile_regex(pattern, Vocabulary.from_token_bytes([b"a", None], eos_token_ids=[1]))
    assert str(info.value).startswith(feature) and f"supported at position {position} in pattern" in str(info.value)
    assert info.value.position == position


@pytest.mark.parametrize("text", [
    'start: r0\nr0: r0*\n',
    'start: "ab" | r0? (r0 "b" | "b"?) | ("ab" r0 r0? | "b" T)\nr0: r0*\nT: /a{1,2}/\n',
    'start: (r0 "x")*\nr0: r0? "a" | "b"?\n',
])
def test_left_recursion_through_a_repeat_of_a_nullable_rule_agrees_with_lark(text: str) -> None:
    """Found by the fuzzer: unrolling ``X*`` with a nullable ``X`` met ``X*`` again forever."""
    vocab = Vocabulary.from_token_bytes([bytes([i]) for i in range(256)] + [None], eos_token_ids=[256])
    compiled = constrain.compile_lark(text, vocab)
    oracle = lark.Lark(text, lexer="dynamic_complete")
    for n in range(5):
        for chars in itertools.product("abx", repeat=n):
            doc = "".join(chars)
            try:
                oracle.parse(doc)
                expected = True
            except lark.exceptions.LarkError:
                expected = False
            m = compiled.matcher()
            assert (m.accept_bytes(doc.encode()) and m.is_accepting()) == expected, doc
