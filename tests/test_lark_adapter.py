"""grammars/lark_adapter.py against the installed lark: the one module that uses lark's internals.

If lark is upgraded past the supported range, or an internal the adapter relies on changes, these
tests say which one, before the front end fails somewhere less obvious.
"""

from __future__ import annotations

import ast
import tomllib
from importlib import metadata
from pathlib import Path

import lark
import pytest
from lark import Token, Tree
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from constrain.grammars import lark_adapter
from constrain.grammars.lark_frontend import BUILTIN_DIR

ROOT = Path(__file__).resolve().parents[1]

#: The lark releases the adapter is written for, by name (what pyproject pins and CI installs).
SUPPORTED = SpecifierSet(">=1.2,<1.4")


def test_supported_range_is_the_pinned_one_and_holds_the_installed_lark() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "lark"]
    assert [p.specifier for p in pins] == [SUPPORTED] == [SpecifierSet(lark_adapter.SUPPORTED_LARK)]
    installed = metadata.version("lark")
    assert installed == lark.__version__
    assert installed in SUPPORTED, f"lark {installed} is outside the adapter's range {SUPPORTED}"


def test_no_other_module_uses_lark_internals() -> None:
    """Only the adapter imports ``lark.load_grammar`` or touches ``_``-prefixed lark names."""
    offenders = []
    for path in sorted(ROOT.glob("grammars/**/*.py")) + sorted(ROOT.glob("constrain/**/*.py")):
        if path.name == "lark_adapter.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lark"):
                names = [a.name for a in node.names]
                if node.module in ("lark.load_grammar", "lark.lexer", "lark.grammar") or "load_grammar" in names \
                        or any(n.startswith("_") for n in names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


GRAMMAR = r"""
start: greeting+ ("!" | sep{WORD, ","})? "a".."c" x~2..3 [y] -> aliased
greeting: "hi"i /h[ae]llo/s
x: "x"
y: "y"
sep{item, delim}: item (delim item)*
WORD: /[a-z]+/
%import common.WS
%ignore WS
"""


def test_load_gives_rules_terminals_and_ignores() -> None:
    loaded = lark_adapter.load(GRAMMAR, [str(BUILTIN_DIR)])
    rules = {name: (params, tree) for name, params, tree in loaded.rules}
    assert set(rules) == {"start", "greeting", "x", "y", "sep"}
    assert rules["sep"][0] == ("item", "delim")
    assert all(isinstance(tree, Tree) for _, tree in rules.values())
    terminals = dict(loaded.terminals)
    assert {"WORD", "WS"} <= set(terminals) and all(isinstance(t, Tree) for t in terminals.values())
    assert [terminals[name] is not None for name in loaded.ignore] == [True]


def test_ebnf_trees_use_only_the_labels_the_front_end_knows() -> None:
    loaded = lark_adapter.load(GRAMMAR, [str(BUILTIN_DIR)])
    labels: set[str] = set()
    symbols: set[type] = set()
    for tree in [t for _, _, t in loaded.rules] + [t for _, t in loaded.terminals]:
        assert tree is not None
        for sub in tree.iter_subtrees():
            labels.add(str(sub.data))
            symbols |= {type(c) for c in sub.children if not isinstance(c, Tree)}
    assert labels <= lark_adapter.EBNF_LABELS
    assert {"expansions", "expansion", "value", "expr", "literal", "range", "template_usage", "maybe",
            "alias"} <= labels
    assert {lark_adapter.NonTerminal, lark_adapter.Terminal, Token} <= symbols


@pytest.mark.parametrize("source, expected", [
    ('"hi"i', ("hi", "i", False)),
    ('"a\\"b"', ('a"b', "", False)),
    ("/h[ae]llo/s", ("h[ae]llo", "s", True)),
    ("/x/mi", ("x", "im", True)),
])
def test_literal_pattern(source: str, expected: tuple[str, str, bool]) -> None:
    kind = "REGEXP" if source.startswith("/") else "STRING"
    assert lark_adapter.literal_pattern(Token(kind, source)) == expected


@pytest.mark.parametrize("source, kind, message", [
    ('""', "STRING", "Empty terminals are not allowed"),
    ('"\\x"', "STRING", "truncated"),
])
def test_malformed_literal_is_lark_s_grammar_error(source: str, kind: str, message: str) -> None:
    with pytest.raises(lark.exceptions.GrammarError, match=message):
        lark_adapter.literal_pattern(Token(kind, source))


def test_unescape_and_parse_grammar_text() -> None:
    assert lark_adapter.unescape('a\\nb\\"') == 'a\nb"'
    tree = lark_adapter.parse_grammar_text('start: A\nA: "a"')
    kinds = [stmt.data for stmt in tree.children if isinstance(stmt, Tree)]
    assert kinds == ["rule", "term"]
    heads = [tok for tok in tree.scan_values(lambda v: isinstance(v, Token) and v.type in ("RULE", "TERMINAL"))]
    assert [(t.value, t.line) for t in heads] == [("start", 1), ("A", 1), ("A", 2)]
