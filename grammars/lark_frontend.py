"""Lark grammar text -> the grammar IR.

The split mirrors lark's own: lark's grammar loader (through ``grammars.lark_adapter``, the one
module that uses lark's internals) parses the text, resolves ``%import`` (lark's bundled
``common.lark`` and our built-ins in this folder), ``%override``/``%extend``, and validates names;
this module only turns the resulting EBNF trees into IR. Nothing here parses grammar text itself.
Rules are converted from a work queue, never by recursing from one rule into another, so chains
of thousands of rules cost no stack; parentheses inside one rule nest at most ``MAX_NESTING`` deep.
A terminal, named or inline, that matches the empty string is refused, as lark refuses it.

What is accepted: rules and terminals, ``?rule``/``_rule``/``!rule`` (tree shaping only: same
language), aliases and priorities (ignored: they shape trees, not languages), ``|``, ``*``, ``+``,
``?``, ``[...]`` (optional), ``x ~ n`` and ``x ~ n..m``, string literals (``"..."i`` folds case
the way Python's ``re`` does), regex literals ``/.../flags`` (through ``grammars.regex`` in the
Python dialect; lookaround and backreferences are errors), ``"a".."z"`` ranges, ``%import``,
``%ignore``, templates. ``%declare`` is rejected: a declared terminal has no definition we could
enforce.

Semantics. Lark's Earley parser with ``lexer="dynamic"`` matches each expected terminal with
Python's ``re.match`` at the current position and uses that single (greedy, first-alternative)
match. A byte-level CFG cannot see terminal boundaries, so here every string in a terminal's
language is a possible token: our language is the one lark accepts with
``lexer="dynamic_complete"``, a superset of ``lexer="dynamic"``'s. The two coincide whenever a
terminal's greedy match never runs into the next token, e.g. when word-like tokens are separated
by required whitespace or punctuation; the built-in grammars are written that way and the tests
check them against ``lexer="dynamic"``.

A terminal whose regular expressions use lazy quantifiers (``/(.|\\n)*?/`` in
``common.C_COMMENT``) is matched shortest-first by Python's ``re``; such a terminal becomes the
strings of its language with no proper prefix in it (an intersection with a complement), which
is exactly that match. Lazy and greedy quantifiers mixed in one terminal are an error (Python's
pick would depend on backtracking order). ``common.ESCAPED_STRING``'s lookbehind idiom is
recognised and replaced by the equivalent escape-pair form.

``%ignore X``: lark lets ignored terminals occur, any number of times, before the first token,
between tokens and after the last. Here every terminal occurrence in a rule is followed by
``(X)*`` and the start rule is preceded by it, so each gap has exactly one place for ignored text
(no ambiguity that could multiply derivative states).

Transformations that keep the language (all that masking needs): left recursion, which the
derivative engine cannot run, is rewritten (``a: a x | y`` becomes ``a: y x*``; indirect left
recursion by substituting rules of a left-recursive cycle into each other first; a nullable
prefix such as ``a: b? a x`` is handled by splitting off its empty string). Rules that can never
finish (``a: "x" a``) are removed, so the masks never lead into a dead end; a grammar whose start
rule can never finish has the empty language and ``constrain`` reports it as unsatisfiable.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

from lark import Token, Tree
from lark.exceptions import GrammarError as _LarkError
from lark.exceptions import UnexpectedInput

from constrain.grammars import ir
from constrain.grammars.analysis import INFINITE, MinLength, RefMapper, cyclic_components, reachable_rules, refs
from constrain.grammars.errors import LarkGrammarError, RegexError
from constrain.grammars.ir import EMPTY, NOTHING, Node, alt, nullable, optional, ref, repeat, seq
from constrain.grammars.lark_adapter import (
    LoadedGrammar,
    NonTerminal,
    Terminal,
    literal_pattern,
    parse_grammar_text,
    unescape,
)
from constrain.grammars.lark_adapter import load as lark_load
from constrain.grammars.regex import regex_to_ir
from constrain.grammars.regex_classes import fold_python
from constrain.grammars.unicode import char_class, normalize

__all__ = ["lark_to_grammar", "BUILTIN_DIR"]

#: Folder of the built-in ``.lark`` grammars; also on the ``%import`` path (``%import json.value``).
BUILTIN_DIR = Path(__file__).resolve().parent

_IGNORE_RULE = "__ignore"
_START_RULE = "__start"
_NONEMPTY = "!nonempty"  # suffix of the rules made by removing the empty string from a rule
_MAX_TEMPLATE_INSTANCES = 10_000
_MAX_REWRITE_ROUNDS = 8
#: Deepest nesting of parenthesised alternatives in one rule: the conversion recurses once per
#: level (and a regex literal inside may add its own), so the bound keeps a deep grammar a
#: ``LarkGrammarError`` without touching the recursion limit.
MAX_NESTING = 50


def lark_to_grammar(text: str, start: str = "start", *, import_paths: Sequence[str | Path] = ()) -> ir.Grammar:
    """The IR for the language of the Lark grammar ``text`` from rule ``start``.

    ``import_paths`` are searched by ``%import`` before the built-in grammars and lark's own
    ``common.lark``. Raises ``LarkGrammarError`` naming the grammar line for malformed or
    unsupported input.
    """
    loaded = _load(text, [str(p) for p in import_paths] + [str(BUILTIN_DIR)])
    return _Converter(text, loaded, start).run()


# ------------------------------------------------------------------------------------ loading

def _load(text: str, import_paths: list[str]) -> LoadedGrammar:
    try:
        return lark_load(text, import_paths)
    except UnexpectedInput as e:
        raise LarkGrammarError(f"syntax error: {str(e).strip().splitlines()[0]}", line=e.line) from None
    except _LarkError as e:
        message = str(e).strip().split("\n\n")[0]
        at = re.search(r",? at line (\d+) column \d+", message)
        if at:
            return _raise(message[: at.start()] + message[at.end():], int(at.group(1)))
        return _raise(message, _Lines(text).for_message(message))
    except RecursionError:  # lark's loader recurses along the text's nesting
        raise LarkGrammarError(f"the grammar nests too deeply for lark's grammar loader (rules may nest "
                               f"parentheses at most {MAX_NESTING} deep)") from None
    except OSError as e:  # an %import that lark could not find
        stmt = re.search(r"^\s*%import\b.*$", text, re.M)
        where = text.count("\n", 0, stmt.start()) + 1 if stmt else None
        raise LarkGrammarError(f"%import failed: {e}", line=where) from None


def _raise(message: str, line: int | None):
    raise LarkGrammarError(message, line=line)


class _Lines:
    """Where names are defined and used, from lark's own parse of the grammar text."""

    def __init__(self, text: str) -> None:
        self.defs: dict[str, list[int]] = {}
        self.uses: dict[str, list[int]] = {}
        self.declares: dict[str, int] = {}
        self.imports: dict[str, int] = {}  # name (or dotted path part) -> line of its %import
        try:
            tree = parse_grammar_text(text)
        except Exception:  # the text did not parse: nothing to locate
            return
        for stmt in tree.children:
            if not isinstance(stmt, Tree):
                continue
            body = stmt.children[0] if stmt.data in ("override", "extend") else stmt
            head = None
            if body.data == "rule":
                head = body.children[1]
            elif body.data == "term":
                head = body.children[0]
            names = stmt.scan_values(lambda v: isinstance(v, Token) and v.type in ("RULE", "TERMINAL"))
            for tok in cast("list[Token]", list(names)):
                line = tok.line or 0  # set on every token lark's parser makes
                if tok is head:
                    self.defs.setdefault(tok.value, []).append(line)
                elif stmt.data == "declare":
                    self.declares.setdefault(tok.value, line)
                elif stmt.data == "import":
                    self.imports.setdefault(tok.value, line)
                else:
                    self.uses.setdefault(tok.value, []).append(line)

    def definition(self, name: str) -> int | None:
        lines = self.defs.get(name)
        return lines[0] if lines else None

    def imported(self, name: str) -> int | None:
        """The line of the ``%import`` that brought ``name`` (mangled ``grammar__name`` too)."""
        for part in (name, *reversed(name.split("__"))):
            if part in self.imports:
                return self.imports[part]
        return min(self.imports.values(), default=None)

    def for_message(self, message: str) -> int | None:
        """The line a lark error message is about (best effort)."""
        names = re.findall(r"'([^']+)'", message) or re.findall(r"\b(?:for|:) (\w+)", message)
        if not names:
            return None
        name = names[0]
        lines: list[int] | None
        if "more than once" in message:
            lines = self.defs.get(name)
            return lines[-1] if lines else None
        if "not defined" in message or "arguments" in message:
            lines = self.uses.get(name) or self.defs.get(name)
        else:
            lines = self.defs.get(name) or self.uses.get(name)
        return lines[0] if lines else None


# --------------------------------------------------------------------------------- conversion

class _Converter:
    def __init__(self, text: str, loaded: LoadedGrammar, start: str) -> None:
        self.text = text
        self._lines: _Lines | None = None
        self.templates: dict[str, tuple[tuple[str, ...], Tree]] = {}
        self.rule_trees: dict[str, Tree] = {}
        for name, params, tree in loaded.rules:
            if tree is None:
                self._declared(name)
            if params:
                self.templates[name] = (params, tree)
            else:
                self.rule_trees[name] = tree
        self.term_trees: dict[str, Tree] = {}
        for name, body in loaded.terminals:
            if body is None:
                self._declared(name)
            self.term_trees[name] = body
        if start not in self.rule_trees:
            raise LarkGrammarError(f"start rule {start!r} is not defined"
                                   + (" (it is a template)" if start in self.templates else ""))
        self.start = start
        self.ignore = list(loaded.ignore)
        self.gap = repeat(ref(_IGNORE_RULE), 0, None) if self.ignore else EMPTY
        self.rules: dict[str, Node] = {}
        self.order: dict[str, int] = {}  # definition order, for stable rewriting and messages
        self.pending: deque[Callable[[], None]] = deque()
        self.instances: dict[tuple[str, tuple[Node, ...]], str] = {}
        self.notes: list[str] = []
        self.quantifiers: set[str] = set()  # quantifier kinds seen while converting a terminal
        # Literals already converted (by lark token type and text): a grammar spells the same
        # keywords again and again, and "..."i goes through the regex front end.
        self._literals: dict[tuple[str, str], tuple[Node, frozenset[str]]] = {}
        self._classes: dict[tuple[tuple[int, int], ...], Node] = {}
        self.nesting = 0  # alternatives open in the tree being converted

    @property
    def lines(self) -> _Lines:
        """Built only when an error needs a line number (it parses the text once more)."""
        if self._lines is None:
            self._lines = _Lines(self.text)
        return self._lines

    def _declared(self, name: str) -> NoReturn:
        raise LarkGrammarError(
            f"%declare {name}: declared symbols come from a custom lexer, which constrain cannot "
            "enforce; define it instead", line=self.lines.declares.get(name))

    def _line(self, name: str, tok: object = None) -> int | None:
        """The user's grammar line for an error in ``name`` (at ``tok`` when given): for a
        definition that came through ``%import``, the line of that ``%import``."""
        base = name.split("{", 1)[0].split(_NONEMPTY, 1)[0]
        line = self.lines.definition(base)
        if line is None:
            return self.lines.imported(base)
        return getattr(tok, "line", None) or line

    # ------------------------------------------------------------------ rules and terminals

    def run(self) -> ir.Grammar:
        self._rule(self.start)
        if self.ignore:
            self._define(_IGNORE_RULE, lambda: alt(*(self._terminal(t) for t in self.ignore)))
        while self.pending:
            self.pending.popleft()()
        rules = self.rules
        nullable_rules = _fixpoint(rules, nullable)
        self._prune_unproductive()
        _LeftRecursion(self, nullable_rules).eliminate()
        start = self.start
        if self.ignore:
            rules[_START_RULE] = seq(self.gap, ref(start))
            start = _START_RULE
        reachable = reachable_rules(rules, start)
        kept = {name: body for name, body in rules.items() if name in reachable}
        return ir.Grammar(kept, start, notes=tuple(self.notes))

    def _define(self, name: str, build: Callable[[], Node]) -> None:
        if name in self.order:
            return
        self.order[name] = len(self.order)
        self.rules[name] = NOTHING  # placeholder until built

        def task() -> None:
            self.rules[name] = build()

        self.pending.append(task)

    def _rule(self, name: str) -> Node:
        self._define(name, lambda: self._expr(self.rule_trees[name], {}, name))
        return ref(name)

    def _terminal(self, name: str) -> Node:
        def build() -> Node:
            self.quantifiers = set()
            body = self._expr(self.term_trees[name], {}, name, terminal=True)
            body = self._lazy(body, self.quantifiers, name, None)
            if nullable(body):
                self._zero_width(f"terminal {name}", self._line(name))
            return body

        self._define(name, build)
        return ref(name)

    @staticmethod
    def _zero_width(what: str, line: int | None) -> NoReturn:
        raise LarkGrammarError(f"{what} matches the empty string (lark's Earley parser does not allow "
                               "zero-width terminals; make it non-empty, and optional where it is used)",
                               line=line)

    def _template(self, name: str, args: tuple[Node, ...], line: int | None) -> Node:
        params, tree = self.templates[name]
        if len(args) != len(params):
            raise LarkGrammarError(f"template {name} takes {len(params)} arguments, got {len(args)}", line=line)
        key = (name, args)
        inst = self.instances.get(key)
        if inst is None:
            if len(self.instances) >= _MAX_TEMPLATE_INSTANCES:
                raise LarkGrammarError(f"template {name} expands without end", line=line)
            inst = self.instances[key] = f"{name}{{{len(self.instances)}}}"
            env = dict(zip(params, args))
            self._define(inst, lambda: self._expr(tree, env, name))
        return ref(inst)

    # ------------------------------------------------------------------ EBNF trees -> IR

    def _expr(self, t, env: dict[str, Node], owner: str, terminal: bool = False) -> Node:
        if not isinstance(t, Tree):
            return self._symbol(t, env, owner, terminal)
        d, kids = t.data, cast("list[Any]", t.children)  # lark trees are untyped
        if d == "expansions":
            if self.nesting > MAX_NESTING:
                raise LarkGrammarError(f"{owner} nests parentheses more than {MAX_NESTING} deep",
                                       line=self._line(owner))
            self.nesting += 1
            try:
                return alt(*(self._expr(k, env, owner, terminal) for k in kids))
            finally:
                self.nesting -= 1
        if d == "expansion":
            char = _escaped_string_quote(kids) if terminal else None
            if char is not None:
                quote = re.escape(char)
                return seq(ir.literal(char), regex_to_ir(fr"([^{quote}\\\n]|\\[^\n])*"), ir.literal(char))
            return seq(*(self._expr(k, env, owner, terminal) for k in kids))
        if d == "alias":
            return self._expr(kids[0], env, owner, terminal)
        if d == "maybe":
            return optional(self._expr(kids[0], env, owner, terminal))
        if d == "value":
            return self._expr(kids[0], env, owner, terminal)
        if d == "expr":
            return self._repeat(kids, env, owner, terminal)
        if d == "literal":
            if terminal:
                return self._literal(kids[0], owner)
            self.quantifiers = set()
            node = self._literal(kids[0], owner)
            if nullable(node):  # an anonymous terminal: lark refuses it as it does a named one
                self._zero_width(f"{kids[0]} in {owner}", self._line(owner, kids[0]))
            return seq(self._lazy(node, self.quantifiers, owner, kids[0]), self.gap)
        if d == "range":
            node = self._range(kids[0], kids[1], owner)
            return node if terminal else seq(node, self.gap)
        if d == "template_usage":
            name = kids[0].name
            args = tuple(self._expr(k, env, owner, terminal) for k in kids[1:])
            return self._template(name, args, self._line(owner))
        raise LarkGrammarError(f"unsupported grammar construct {d!r} in {owner}", line=self._line(owner))

    def _symbol(self, sym, env: dict[str, Node], owner: str, terminal: bool) -> Node:
        if isinstance(sym, NonTerminal):
            if sym.name in env:
                return env[sym.name]
            if sym.name in self.templates:
                raise LarkGrammarError(f"template {sym.name} used without arguments (in {owner})",
                                       line=self._line(owner))
            return self._rule(sym.name)
        if isinstance(sym, Terminal):
            return seq(self._terminal(sym.name), self.gap)
        raise LarkGrammarError(f"unexpected symbol {sym!r} in {owner}", line=self._line(owner))

    def _repeat(self, kids: list, env: dict[str, Node], owner: str, terminal: bool) -> Node:
        inner = self._expr(kids[0], env, owner, terminal)
        op = str(kids[1])
        if terminal and (op in "*+?" or len(kids) > 3 and kids[2] != kids[3]):
            self.quantifiers.add("greedy")
        if op == "*":
            return repeat(inner, 0, None)
        if op == "+":
            return repeat(inner, 1, None)
        if op == "?":
            return optional(inner)
        if op == "~":
            lo = int(kids[2])
            hi = int(kids[3]) if len(kids) > 3 else lo
            if hi < lo or lo < 0:
                raise LarkGrammarError(f"bad repetition range {lo}..{hi} in {owner}",
                                       line=self._line(owner, kids[2]))
            return repeat(inner, lo, hi)
        raise LarkGrammarError(f"unknown operator {op!r} in {owner}", line=self._line(owner))

    def _literal(self, tok: Token, owner: str) -> Node:
        key = (tok.type, tok.value)
        got = self._literals.get(key)
        if got is None:
            got = self._literals[key] = self._convert_literal(tok, owner)
        self.quantifiers |= got[1]
        return got[0]

    def _convert_literal(self, tok: Token, owner: str) -> tuple[Node, frozenset[str]]:
        """A literal's IR and the kinds of the quantifiers in it (``_quantifier_kinds``)."""
        try:
            value, flags, is_regex = literal_pattern(tok)
        except _LarkError as e:
            raise LarkGrammarError(f"{e} (in {owner})", line=self._line(owner, tok)) from None
        if not is_regex:
            if not flags:
                return ir.literal(value), frozenset()
            if flags == "i":  # what regex_to_ir makes of (?i:<value>): each character's case folds
                return seq(*(self._char_class(list(normalize(fold_python([(ord(c), ord(c))])))) for c in value)), \
                    frozenset()
            source = f"(?{flags}:{re.escape(value)})"  # escaped text: no quantifier in it
        else:
            source = f"(?{flags}){value}" if flags else value
        try:
            node = regex_to_ir(source, dialect="python", encode_class=self._char_class)
        except RegexError as e:
            raise LarkGrammarError(f"{owner}: {tok.value}: {e}", line=self._line(owner, tok)) from None
        return node, frozenset(_quantifier_kinds(source)) if is_regex else frozenset()

    def _char_class(self, ranges: list[tuple[int, int]]) -> Node:
        """``char_class``, once per set of ranges in this grammar (``"SELECT"i``, ``"SET"i``... share
        their letters' classes)."""
        key = tuple(ranges)
        got = self._classes.get(key)
        if got is None:
            got = self._classes[key] = char_class(ranges)
        return got

    def _lazy(self, node: Node, kinds: set[str], owner: str, tok: object) -> Node:
        """Lark's token for a regex with lazy quantifiers is Python's (shortest) match."""
        if "lazy" not in kinds:
            return node
        if "greedy" in kinds:
            raise LarkGrammarError(
                f"{owner} mixes lazy and greedy quantifiers: constrain cannot reproduce the "
                "match Python's re would pick; use only one kind", line=self._line(owner, tok))
        return _shortest(node)

    def _range(self, lo_tok: Token, hi_tok: Token, owner: str) -> Node:
        lo, hi = (unescape(t.value[1:-1]) for t in (lo_tok, hi_tok))
        if len(lo) != 1 or len(hi) != 1 or ord(lo) > ord(hi):
            raise LarkGrammarError(f"bad range {lo_tok.value}..{hi_tok.value}", line=self._line(owner, lo_tok))
        return char_class([(ord(lo), ord(hi))])

    # ------------------------------------------------------------------ cleaning up

    def _prune_unproductive(self) -> None:
        productive = _fixpoint(self.rules, lambda node, known: _Productive(known)(node) < INFINITE)
        dead = [name for name in self.rules if name not in productive]
        if not dead:
            return
        for name in dead:
            if name != _IGNORE_RULE:
                self.notes.append(f"rule {name!r} can never finish (it always recurses): removed")
        if self.start in dead:
            self.notes.append("the grammar's language is empty: its start rule can never finish")
        mapper = RefMapper(lambda n: NOTHING if n not in productive else None)
        for name in list(self.rules):
            self.rules[name] = NOTHING if name in dead else mapper(self.rules[name])
        for name in dead:
            if name != self.start:
                del self.rules[name]
        if _IGNORE_RULE in dead:
            self.gap = EMPTY


# ------------------------------------------------------------------------ terminal idioms

# common.lark's ESCAPED_STRING is  "\"" /.*?/ /(?<!\\)(\\\\)*?/ "\"": the shortest text up to a
# quote not escaped by a backslash. The lookbehind is not regular-expression syntax we support,
# but the language is the plain escape-pair form, which replaces it.
_STRING_INNER = ("/.*?/", "/(?<!\\\\)(\\\\\\\\)*?/")


def _literal_text(tree) -> str | None:
    """The literal's source if ``tree`` is a chain of one-child wrappers around one literal."""
    while isinstance(tree, Tree) and tree.data in ("value", "expansions", "expansion") and len(tree.children) == 1:
        tree = tree.children[0]
    if isinstance(tree, Tree) and tree.data == "literal":
        return str(tree.children[0])
    return None


def _escaped_string_quote(kids: list[Any]) -> str | None:
    """The quote character if ``kids`` spell common.lark's ESCAPED_STRING idiom."""
    if len(kids) != 3:
        return None
    quote = _literal_text(kids[0])
    if quote is None or quote != _literal_text(kids[2]) or not quote.startswith('"'):
        return None
    char = unescape(quote[1:-1])
    if len(char) != 1:
        return None
    middle = kids[1]
    while isinstance(middle, Tree) and middle.data != "expansion" and len(middle.children) == 1:
        middle = middle.children[0]
    if isinstance(middle, Tree) and middle.data == "expansion" \
            and tuple(_literal_text(k) for k in middle.children) == _STRING_INNER:
        return char
    return None


def _quantifier_kinds(source: str) -> set[str]:
    """``"lazy"`` / ``"greedy"`` for the variable-count quantifiers in a Python regex."""
    import re._constants as sre_c
    import re._parser as sre_p

    try:
        tree = sre_p.parse(source)
    except re.error:
        return set()
    repeats = (sre_c.MIN_REPEAT, sre_c.MAX_REPEAT, sre_c.POSSESSIVE_REPEAT)
    out: set[str] = set()
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple, sre_p.SubPattern)):
            for x in item:
                if isinstance(x, tuple) and len(x) == 2 and any(x[0] is op for op in repeats):
                    lo, hi, _ = x[1]
                    if lo != hi:
                        out.add("lazy" if x[0] is sre_c.MIN_REPEAT else "greedy")
                stack.append(x)
    return out


def _shortest(node: Node) -> Node:
    """The strings of ``node`` that have no proper prefix in ``node`` (shortest matches)."""
    longer = seq(node, repeat(ir.ANY_BYTE, 1, None))
    return ir.intersect(node, ir.complement(longer))


# ------------------------------------------------------------------------ IR analyses

class _Productive(MinLength):
    """Finite for the nodes that derive some string, given the rules known to (0 stands in for
    their lengths): a productivity test that never enters another rule, so chains of any length
    cost no recursion."""

    def __init__(self, known: set[str]) -> None:
        super().__init__({})
        self.known = known

    def rule(self, name: str) -> float:
        return 0 if name in self.known else INFINITE


def _union(forms: list[_Form]) -> _Form:
    """The form of the union of ``forms``' languages."""
    heads: dict[str, list[Node]] = {}
    for part, _ in forms:
        for k, r in part.items():
            heads.setdefault(k, []).append(r)
    return {k: alt(*rs) for k, rs in heads.items()}, alt(*(base for _, base in forms))


def _fixpoint(rules: dict[str, Node], holds: Callable[[Node, set[str]], bool]) -> set[str]:
    """The least set of rules for which the monotone property ``holds`` (worklist, linear-ish)."""
    users: dict[str, list[str]] = {}
    for name, body in rules.items():
        for r in refs(body):
            users.setdefault(r, []).append(name)
    known: set[str] = set()
    work = deque(rules)
    while work:
        name = work.popleft()
        if name in known:
            continue
        if holds(rules[name], known):
            known.add(name)
            work.extend(u for u in users.get(name, ()) if u not in known)
    return known


# ------------------------------------------------------------------------ left recursion

#: A rule's body as ``Σ ref(k) heads[k] | base`` over the rules ``k`` of one left-recursive cycle.
_Form = tuple[dict[str, Node], Node]


class _LeftRecursion:
    """Rewrites left recursion away, keeping every rule's language.

    ``a = a r | b`` has the least solution ``a = b r*``. The rules of a left-recursive cycle are
    first written in left-linear form, ``a = Σ k r_k | b`` over the cycle's rules ``k``; then, in
    definition order, the forms of the earlier rules are substituted for their leftmost uses and
    the rule's own loop is solved as above (Paull's algorithm on the forms: a substitution only
    extends the heads' rests, so a cycle through n rules costs O(n) flat substitutions, where
    substituting whole bodies nested them n deep). A nullable prefix ``p`` in ``p a x`` is split
    into ``p``'s non-empty part (a new rule ``p!nonempty`` where ``p`` is a rule) and the empty
    string.
    """

    def __init__(self, conv: _Converter, nullable: set[str]) -> None:
        self.conv = conv
        self.rules = conv.rules
        self.nullable_rules = nullable
        self.nonempty_todo: deque[str] = deque()
        # Both analyses depend on a node's structure and the (fixed) nullable rules only; by
        # identity, with the node kept alive beside its answer.
        self.left_memo: dict[int, tuple[Node, frozenset[str]]] = {}
        self.nullable_memo: dict[int, tuple[Node, bool]] = {}

    def nullable(self, node: Node) -> bool:
        got = self.nullable_memo.get(id(node))
        if got is None:
            got = self.nullable_memo[id(node)] = (node, nullable(node, self.nullable_rules))
        return got[1]

    def left(self, node: Node) -> frozenset[str]:
        """Rules that can start ``node`` (after a nullable prefix)."""
        got = self.left_memo.get(id(node))
        if got is None:
            got = self.left_memo[id(node)] = (node, self._left(node))
        return got[1]

    def _left(self, node: Node) -> frozenset[str]:
        if isinstance(node, ir.Ref):
            return frozenset((node.name,))
        if isinstance(node, ir.Seq):
            out: set[str] = set()
            for item in node.items:
                out |= self.left(item)
                if not self.nullable(item):
                    break
            return frozenset(out)
        if isinstance(node, ir.Alt):
            return frozenset().union(*(self.left(i) for i in node.items))
        if isinstance(node, ir.Repeat):
            return self.left(node.item)
        return frozenset()

    def graph(self) -> dict[str, set[str]]:
        return {name: set(self.left(body)) for name, body in self.rules.items()}

    def eliminate(self) -> None:
        order = self.conv.order
        for _ in range(_MAX_REWRITE_ROUNDS):
            cycles = cyclic_components(self.graph(), list(self.rules))
            if not cycles:
                return
            for comp in cycles:
                self.solve(sorted(comp, key=lambda n: order.get(n, len(order))))
            self.build_nonempty()
        cycles = cyclic_components(self.graph(), list(self.rules))
        if cycles:
            name = min(cycles[0], key=lambda n: order.get(n, len(order)))
            path = " -> ".join(sorted(cycles[0], key=lambda n: order.get(n, len(order))))
            raise LarkGrammarError(
                f"rule {name!r} is left-recursive ({path}) in a way that could not be rewritten",
                line=self.conv._line(name))

    def solve(self, cycle: list[str]) -> None:
        """Paull's elimination over the cycle's rules, in the order given."""
        members = frozenset(cycle)
        forms: dict[str, _Form] = {}
        for a in cycle:
            heads, base = self.form(self.rules[a], members)
            for b in cycle[:cycle.index(a)]:  # b's form brings only heads later than b
                rest = heads.pop(b, None)
                if rest is None:
                    continue
                b_heads, b_base = forms[b]
                for k, r in b_heads.items():
                    heads[k] = alt(heads.get(k, NOTHING), seq(r, rest))
                base = alt(base, seq(b_base, rest))
            loop = heads.pop(a, None)
            if loop is not None:
                star = repeat(loop, 0, None)
                heads = {k: seq(r, star) for k, r in heads.items()}
                base = seq(base, star)
            forms[a] = heads, base
            self.rules[a] = alt(base, *(seq(ref(k), r) for k, r in heads.items()))

    def form(self, node: Node, members: frozenset[str]) -> _Form:
        """``node`` as ``Σ ref(k) heads[k] | base``, no member leftmost in ``base`` (where possible)."""
        if not self.left(node) & members:
            return {}, node
        if isinstance(node, ir.Ref):
            return {node.name: EMPTY}, NOTHING
        if isinstance(node, ir.Alt):
            return _union([self.form(i, members) for i in node.items])
        if isinstance(node, ir.Seq):
            head, rest = node.items[0], seq(*node.items[1:])
            head_heads, head_base = self.form(head, members)
            heads = {k: seq(r, rest) for k, r in head_heads.items()}
            if self.nullable(head_base) and self.left(rest) & members:
                return _union([(heads, seq(self.nonempty(head_base), rest)), self.form(rest, members)])
            return heads, seq(head_base, rest)
        if isinstance(node, ir.Repeat):
            if self.nullable(node.item):
                # X{m,n} with a nullable X is nonempty(X){0,n}: empty copies pad any count up to m.
                # Unrolling X itself would find X* again behind every nullable head, forever.
                return self.form(repeat(self.nonempty(node.item), 0, node.max), members)
            hi = None if node.max is None else node.max - 1
            first = seq(node.item, repeat(node.item, max(node.min - 1, 0), hi))
            return self.form(first if node.min else alt(EMPTY, first), members)
        return {}, node

    def nonempty(self, node: Node) -> Node:
        """The non-empty strings of ``node``."""
        if isinstance(node, ir.Bytes):
            return node
        if isinstance(node, ir.Ref):
            if node.name not in self.nullable_rules:
                return node
            name = node.name + _NONEMPTY
            if name not in self.rules:
                self.rules[name] = NOTHING
                self.conv.order[name] = self.conv.order.get(node.name, len(self.conv.order))
                self.nonempty_todo.append(node.name)
            return ref(name)
        if isinstance(node, ir.Seq):
            if not node.items:
                return NOTHING
            head, rest = node.items[0], seq(*node.items[1:])
            out = seq(self.nonempty(head), rest)
            return alt(out, self.nonempty(rest)) if self.nullable(head) else out
        if isinstance(node, ir.Alt):
            return alt(*(self.nonempty(i) for i in node.items))
        if isinstance(node, ir.Repeat):
            hi = None if node.max is None else node.max - 1
            return seq(self.nonempty(node.item), repeat(node.item, max(node.min - 1, 0), hi))
        return ir.intersect(node, ir.complement(EMPTY))

    def build_nonempty(self) -> None:
        while self.nonempty_todo:
            base = self.nonempty_todo.popleft()
            self.rules[base + _NONEMPTY] = self.nonempty(self.rules[base])
