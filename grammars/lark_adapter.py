"""The one place constrain uses lark's internals.

The Lark front end reads grammar text with lark's own loader, so that the syntax, ``%import``,
``%override``/``%extend``, templates and name checks are exactly lark's. What that loader returns
(``lark.load_grammar.Grammar``'s ``rule_defs``/``term_defs``/``ignore``, its EBNF trees, the
grammar-text parser and the literal helpers) is not lark's public API, so every use of it is here
and ``tests/test_lark_adapter.py`` checks each against the installed lark. A lark release that
changes them fails there, not somewhere inside the front end.

Supported: lark ``SUPPORTED_LARK`` (the range ``pyproject.toml`` pins, tested with 1.2 and 1.3).

The EBNF trees (``Tree``) carry these ``data`` labels, which the front end dispatches on:
``EBNF_LABELS``. Their leaves are ``NonTerminal``/``Terminal`` symbols and lark ``Token``s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lark import Token, Tree
from lark import load_grammar as _lg
from lark.grammar import NonTerminal, Terminal
from lark.lexer import PatternStr

__all__ = ["SUPPORTED_LARK", "EBNF_LABELS", "LoadedGrammar", "load", "parse_grammar_text", "literal_pattern",
           "unescape", "NonTerminal", "Terminal"]

#: The lark versions this adapter is written and tested for (pip requirement syntax).
SUPPORTED_LARK = ">=1.2,<1.4"

#: ``Tree.data`` of the EBNF nodes in rule and terminal bodies.
EBNF_LABELS = frozenset({"expansions", "expansion", "alias", "maybe", "value", "expr", "literal", "range",
                         "template_usage"})


@dataclass(frozen=True)
class LoadedGrammar:
    """A grammar as lark's loader leaves it: ``%import``, ``%override`` and ``%extend`` resolved.

    ``rules``: (name, template parameters, body) with body None for a ``%declare``d rule;
    ``terminals``: (name, body), None likewise; ``ignore``: the ``%ignore``d terminal names.
    """

    rules: list[tuple[str, tuple[str, ...], Tree | None]]
    terminals: list[tuple[str, Tree | None]]
    ignore: list[str]


def load(text: str, import_paths: Sequence[str]) -> LoadedGrammar:
    """Run lark's grammar loader on ``text``; raises lark's own errors (``UnexpectedInput``,
    ``lark.exceptions.GrammarError``, ``OSError`` for an ``%import`` it cannot find)."""
    builder = _lg.GrammarBuilder(import_paths=list(import_paths))
    builder.load_grammar(text, "<string>")
    grammar = builder.build()
    rules: list[tuple[str, tuple[str, ...], Tree | None]] = [
        (str(name), tuple(str(p) for p in params), tree) for name, params, tree, _options in grammar.rule_defs]
    terminals: list[tuple[str, Tree | None]] = [(str(name), tree) for name, (tree, _priority) in grammar.term_defs]
    return LoadedGrammar(rules, terminals, [str(name) for name in grammar.ignore])


def parse_grammar_text(text: str) -> Tree:
    """lark's parse tree of grammar text, statement by statement (for locating names by line)."""
    tree: Tree = _lg._get_parser().parse(text + "\n", "start")
    return tree


def literal_pattern(token: Token) -> tuple[str, str, bool]:
    """A ``"..."flags`` or ``/.../flags`` literal as (text or regex source, sorted flag letters,
    whether it is a regex); raises ``lark.exceptions.GrammarError`` for a malformed one."""
    pattern = _lg._literal_to_pattern(token)
    return pattern.value, "".join(sorted(pattern.flags)), not isinstance(pattern, PatternStr)


def unescape(text: str) -> str:
    """The characters a string literal's body (quotes removed) spells, as lark reads them."""
    value: str = _lg.eval_escaping(text)
    return value
