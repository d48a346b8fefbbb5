"""regex_to_ir against Python's own ``re``: full match, search, Unicode classes, errors.

The IR is run with ``constrain.derivatives.matches``; the oracle is ``re.fullmatch``/``re.search``.
Strings come from hypothesis: random text over a small alphabet (mostly non-matches) and
strings generated from the pattern itself (matches), so both directions are exercised.
"""

from __future__ import annotations

import re
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.derivatives import matches
from constrain.grammars.errors import RegexError
from constrain.grammars.ir import Node, Repeat, alt, literal
from constrain.grammars.regex import regex_to_ir
from constrain.grammars.regex_parser import Chars, parse
from constrain.grammars.unicode import char_class, normalize, subtract

ALPHABET = "ab c0_-\n.αβ\u212aKk\u00e9\u0661"
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

PYTHON_PATTERNS = [
    "", "a", "abc", "a|b", "ab|", "|a", "a*", "a+", "a?", "a*?", "a+?", "a??", "(ab)*c",
    "a{2}", "a{2,}", "a{,2}", "a{1,3}", "a{0}", "(a|bc){2,3}", "(?:a|b)+c?", "((a)|b)*",
    "(?P<x>a|b)(?P<y>c)", "[abc]+", "[^abc]*", "[a-c0]", "[]a]", "[^]a]+", "[a-]", "[-a]",
    "[\\]]", "\\d+", "\\D+", "\\w+", "\\W", "\\s*", "\\S+", "[\\d\\s]+", "[^\\w\\n]", "[\\W]",
    ".", ".*", "(?s).*", "a.b", "[α-ω]+", "[^α-ω]", "(?i)k", "(?i)[a-c]+", "(?i)[^k]",
    "(?i)é", "(?ai)k", "(?a)\\w+", "(?a)\\d", "(?i:a)b", "(?x) a b # comment", "x{}", "a{,}",
    "\\x61\\u03b1", "\\N{GREEK SMALL LETTER ALPHA}", "\\141",
    "\\0", "[\\b]", "\\.\\*\\+\\?", "^ab$", "^a|b$", "\\Aab\\Z", "(a*)*", "(a?){3}", "(?#note)a",
    "(?m)^a$", "[\\u0660-\\u0669]+", "\\u212a|k",
]

ECMA_SEARCH_PATTERNS = [
    "a", "^a", "a$", "^a$", "^a|b$", "^(a|b)$", "(^a$)|(^b$)", "^$", "", "[0-9]{2}", "^[a-c]+$",
    "b+c?", "^\\d", "(?:ab)+$", "^(?<n>a)b", "[^a]$", "\\u00e9", "\\u{3b1}+", "^-?[0-9]+$",
    "^\\d{4}-\\d{2}-\\d{2}$", "^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}$",
    "^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$",
]


@cache
def ir(pattern: str, dialect: str = "python", search: bool = False) -> Node:
    return regex_to_ir(pattern, dialect=dialect, search=search)  # type: ignore[arg-type]


def ir_matches(pattern: str, text: str, **kwargs: object) -> bool:
    return matches(ir(pattern, **kwargs), text.encode("utf-8"))  # type: ignore[arg-type]


def samples(pattern: str) -> st.SearchStrategy[str]:
    """Random text plus text the pattern is known to match (where hypothesis can generate it)."""
    random_text = st.text(ALPHABET, max_size=8)
    try:
        generated = st.from_regex(pattern, fullmatch=True)
        generated.validate()
    except Exception:
        return random_text
    safe = generated.filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s))
    return st.one_of(random_text, safe)


@pytest.mark.parametrize("pattern", PYTHON_PATTERNS)
def test_fullmatch_agrees_with_re(pattern: str) -> None:
    @SETTINGS
    @given(samples(pattern))
    def check(text: str) -> None:
        assert ir_matches(pattern, text) == bool(re.fullmatch(pattern, text)), text

    check()


@pytest.mark.parametrize("pattern", ["a$", "^a", "(?m)^a", "(?m)a$", "\\Aa\\Z", "a|^b$", "^$", "b"])
def test_python_search_agrees_with_re_search(pattern: str) -> None:
    """Python ``$`` also matches before a final newline, and ``(?m)`` anchors at any newline."""
    @SETTINGS
    @given(st.text("ab\n", max_size=6))
    def check(text: str) -> None:
        assert ir_matches(pattern, text, search=True) == bool(re.search(pattern, text)), text

    check()


@pytest.mark.parametrize("pattern", ECMA_SEARCH_PATTERNS)
def test_ecma_search_agrees_with_re_search(pattern: str) -> None:
    """ECMA ``$`` is the end of input only: the oracle uses Python's ``\\Z`` for it."""
    oracle = re.compile(pattern.replace("$", "\\Z").replace("(?<", "(?P<")
                        .replace("\\u{3b1}", "\\u03b1"), re.ASCII)  # ECMA \d is ASCII

    @SETTINGS
    @given(st.one_of(st.text("abc0-\n\u00e9\u03b1", max_size=6), st.from_regex(oracle)))
    def check(text: str) -> None:
        got = ir_matches(pattern, text, dialect="ecma", search=True)
        assert got == bool(oracle.search(text)), text

    check()


# --- character classes over all of Unicode ----------------------------------------------------

ALL_CHARS = "".join(map(chr, range(0x110000)))


def re_ranges(pattern: str) -> list[tuple[int, int]]:
    """Code points (surrogates aside) a one-character Python pattern matches, as ranges."""
    flags, body = re.fullmatch(r"(\(\?[a-z]+\))?(.*)", pattern, re.S).groups()
    runs = [(m.start(), m.end() - 1) for m in re.finditer(f"{flags or ''}(?:{body})+", ALL_CHARS)]
    return normalize(subtract(runs, [(0xD800, 0xDFFF)]))


def parsed_ranges(pattern: str, dialect: str = "python") -> list[tuple[int, int]]:
    tree = parse(pattern, dialect)  # type: ignore[arg-type]
    assert isinstance(tree, Chars)
    return normalize(subtract(list(tree.ranges), [(0xD800, 0xDFFF)]))


@pytest.mark.parametrize("pattern", [
    "\\w", "\\W", "\\d", "\\s", "\\S", ".", "(?s).", "[α-ω]", "[^\\w\\d]",
    "(?i)k", "(?i)s", "(?i)[a-z]", "(?i)[^k-s]", "(?i)\u0130", "(?i)[\\wA]", "(?i)σ",
    "(?i)[\u00c0-\u024f]", "(?i)[\u1f00-\u1fff]", "(?ai)[a-z]", "(?a)\\w", "(?a)\\s",
])
def test_python_classes_match_re_on_every_code_point(pattern: str) -> None:
    """Python's \\w, \\d, \\s are Unicode-aware and (?i) folds Unicode: we match it exactly."""
    assert parsed_ranges(pattern) == re_ranges(pattern)


ECMA_CLASSES = {
    "\\d": "[0-9]", "\\w": "[A-Za-z0-9_]", "\\W": "[^A-Za-z0-9_]",
    "\\s": "[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]",
    ".": "[^\n\r\u2028\u2029]", "[^]": "(?s:.)", "[\\d-z]": "[0-9z-]", "[]": "[^\\s\\S]",
    "\\p{Lu}": "[A-Z\u00c0-\u00d6\u00d8-\u00de]",
}


@pytest.mark.parametrize("pattern", sorted(ECMA_CLASSES))
def test_ecma_classes(pattern: str) -> None:
    """ECMA \\d and \\w are ASCII, \\s is its own Unicode list, . excludes four line terminators."""
    if pattern == "\\p{Lu}":  # Python has no \p: compare on Latin-1 with a written-out set
        latin1 = [(0x100, 0x10FFFF)]
        assert subtract(parsed_ranges(pattern, "ecma"), latin1) == subtract(re_ranges(ECMA_CLASSES[pattern]), latin1)
        return
    assert parsed_ranges(pattern, "ecma") == re_ranges(ECMA_CLASSES[pattern])


@SETTINGS
@given(st.characters(exclude_categories=("Cs",)))
def test_class_ir_matches_utf8_of_each_character(ch: str) -> None:
    for pattern in ("\\w", ".", "[α-ω]", "(?i)[k-s]", "[^a]"):
        assert ir_matches(pattern, ch) == bool(re.fullmatch(pattern, ch)), (pattern, ch)


# --- anchors, hooks, size ---------------------------------------------------------------------

def test_full_match_anchors_are_no_ops() -> None:
    assert ir("^ab$") == ir("ab") == ir("\\Aab\\Z")
    assert ir("^a|b$") == ir("a|b")
    assert ir("(^a$)|(^b$)") == ir("a|b")


def test_encode_class_is_the_only_source_of_characters() -> None:
    """A JSON-style encoder may accept a character raw or as \\uXXXX; the IR must use it."""
    seen: list[list[tuple[int, int]]] = []

    def json_escaped(ranges: list[tuple[int, int]]) -> Node:
        seen.append(ranges)
        escaped = [literal(f"\\u{cp:04x}") for lo, hi in ranges for cp in range(lo, min(hi, lo + 300) + 1)]
        return alt(char_class(ranges), *escaped)

    node = regex_to_ir("a[bc]+\\d", encode_class=json_escaped)
    assert matches(node, b"\\u0061b\\u0063c5")
    assert not matches(node, b"\\u0061")
    assert [(0x61, 0x61)] in seen and [(0x62, 0x63)] in seen
    search = regex_to_ir("x", dialect="ecma", search=True, encode_class=json_escaped)
    assert [(0, 0x10FFFF)] in seen and matches(search, b"\\u0078")


def test_large_counts_stay_one_node() -> None:
    node = regex_to_ir("a{0,100000}")
    assert isinstance(node, Repeat) and node.max == 100000
    assert matches(node, b"a" * 1000)
    nested = regex_to_ir("(a{1000}){1000}")
    assert isinstance(nested, Repeat) and isinstance(nested.item, Repeat)


# --- errors -----------------------------------------------------------------------------------

ERRORS = [
    # (pattern, dialect, message fragment, position)
    ("(a", "python", "missing )", 0),
    ("a)", "python", "unbalanced parenthesis", 1),
    ("[z-a]", "python", "bad character range z-a", 1),
    ("x[abc", "ecma", "unterminated character set", 1),
    ("*a", "python", "nothing to repeat", 0),
    ("a|+", "ecma", "nothing to repeat", 2),
    ("a**", "python", "multiple repeat", 2),
    ("a{3,2}", "python", "min repeat greater than max repeat", 2),
    ("a{100001}", "python", "exceeds the limit of 100000", 2),
    ("a{0,200000}", "ecma", "exceeds the limit", 2),
    ("a*+", "python", "possessive", 1),
    ("(?>a)", "python", "atomic", 0),
    ("(a(?=b))+", "ecma", "lookahead", 2),
    ("(a(?!b))*", "python", "negative lookahead", 2),
    ("(?<=a)b", "ecma", "lookbehind", 0),
    ("(?<!a)b", "python", "negative lookbehind", 0),
    ("(a)\\1", "python", "backreferences", 3),
    ("(?<n>a)\\k<n>", "ecma", "backreferences", 7),
    ("(?P<n>a)(?P=n)", "python", "backreferences", 8),
    ("a\\bc", "python", "word boundary \\b", 1),
    ("a\\B", "ecma", "word boundary \\B", 1),
    ("(?(1)a|b)", "python", "conditional", 0),
    ("(a^b)*", "python", "anchor ^", 2),
    ("(a$)+", "ecma", "anchor $", 2),
    ("(^a|b)+c", "ecma", "anchor ^", 1),
    ("a(?i)b", "python", "global flags not at the start", 1),
    ("\\q", "python", "bad escape \\q", 0),
    ("\\e", "ecma", "unknown escape \\e", 0),
    ("\\x4", "python", "incomplete escape", 0),
    ("\\p{Script=Greek}", "ecma", "Unicode property 'Script'", 0),
    ("\\p{Nope}", "ecma", "unsupported Unicode property 'Nope'", 0),
    ("\\p{L}", "python", "bad escape \\p", 0),
    ("(?<n>a)", "python", "unknown extension", 0),
    ("(?P<1>a)", "python", "bad character in group name", 4),
    ("(?P<n>a)(?P<n>b)", "python", "redefinition of group name", 12),
    ("(?L)a", "python", "locale", 0),
    ("[\\d-z]", "python", "bad character range", 1),
    ("\\400", "python", "octal escape", 0),
]


@pytest.mark.parametrize(("pattern", "dialect", "fragment", "position"), ERRORS)
def test_errors_name_the_problem_and_position(pattern: str, dialect: str, fragment: str, position: int) -> None:
    with pytest.raises(RegexError) as info:
        regex_to_ir(pattern, dialect=dialect)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert info.value.position == position
    assert info.value.pattern == pattern
    assert isinstance(info.value, ValueError)


def test_python_errors_are_errors_in_re_too() -> None:
    """Malformed (not merely unsupported) python-dialect patterns are rejected by ``re`` as well."""
    for pattern, dialect, fragment, position in ERRORS:
        if dialect == "python" and any(f in fragment for f in ("missing", "unbalanced", "range", "repeat",
                                                               "bad escape", "incomplete", "octal")):
            with pytest.raises(re.error) as info:
                re.compile(pattern)
            assert info.value.pos == position or pattern == "[\\d-z]", pattern


def test_unknown_dialect() -> None:
    with pytest.raises(ValueError, match="dialect"):
        regex_to_ir("a", dialect="perl")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ lookahead

_ATOMS = ["a", "b", "c", ".", "[ab]", "(a|bc)", "a*", "b+", "(ab)?", "[^a]"]


@st.composite
def _lookahead_patterns(draw: st.DrawFn, depth: int = 0) -> str:
    def plain_seq() -> str:
        return "".join(draw(st.lists(st.sampled_from(_ATOMS), max_size=3)))

    def look() -> str:
        inner = "|".join(plain_seq() + draw(st.sampled_from(["", "", "$"])) for _ in range(draw(st.integers(1, 2))))
        if depth < 1 and draw(st.booleans()):
            inner = draw(_lookahead_patterns(depth + 1)).lstrip("^")
        return draw(st.sampled_from(["(?=", "(?!"])) + inner + ")"

    items = draw(st.lists(st.one_of(st.sampled_from(_ATOMS), st.builds(look)), max_size=4))
    if draw(st.booleans()):  # a group of alternatives holding a lookahead, then more
        items.append("(" + plain_seq() + look() + "|" + plain_seq() + ")" + plain_seq())
    return draw(st.sampled_from(["", "^"])) + "".join(items) + draw(st.sampled_from(["", "$"]))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_lookahead_patterns(), st.lists(st.text("abc\n", max_size=6), min_size=6, max_size=6))
def test_lookahead_agrees_with_re(pattern: str, texts: list[str]) -> None:
    compiled = re.compile(pattern)
    for text in texts:
        assert ir_matches(pattern, text) == bool(compiled.fullmatch(text)), (pattern, text)
        assert ir_matches(pattern, text, search=True) == bool(compiled.search(text)), (pattern, text, "search")


def test_lookahead_in_real_patterns() -> None:
    host = r"^(?!.*://)(?=.{1,255}$)((.{1,63}\.){1,127}(?![0-9]*$)[a-z0-9-]+\.?)$"
    for text in ["example.com", "a.123", "http://x.com", "x" * 300 + ".com", "a.b1", "a..b"]:
        assert ir_matches(host, text, dialect="ecma", search=True) == bool(re.search(host, text)), text
    no_reserved = r"^(?!(?:con|nul)$)[a-z]+$"
    for text in ["con", "cons", "nul", "x", "co"]:
        assert ir_matches(no_reserved, text, dialect="ecma", search=True) == bool(re.search(no_reserved, text)), text


@pytest.mark.parametrize(("pattern", "position"), [("(a(?=b))*", 2), ("(?=^a)a", 0), ("a|(b(?!c))+", 4)])
def test_lookahead_where_it_cannot_be_placed(pattern: str, position: int) -> None:
    with pytest.raises(RegexError, match="lookahead") as info:
        regex_to_ir(pattern)
    assert info.value.position == position


@pytest.mark.parametrize("pattern", ["a$b", "a^b", "/^[0-9]{2}$/", "(^a|b)c", "a(?m:^)b", "(?m)a\n^b", "a$\n", "x(a$|b)",
                                     "(?m)a$\nb", "\\Aa|b\\Z", "(a|^b)(?=c)c"])
def test_anchors_inside_the_sequence_agree_with_re(pattern: str) -> None:
    compiled = re.compile(pattern)
    for text in ["", "a", "ab", "a\nb", "a\n", "b", "/12/", "12", "xa", "xb", "bc", "c", "a\nc", "xa\n", "abc"]:
        assert ir_matches(pattern, text) == bool(compiled.fullmatch(text)), (pattern, text)
        assert ir_matches(pattern, text, search=True) == bool(compiled.search(text)), (pattern, text, "search")
