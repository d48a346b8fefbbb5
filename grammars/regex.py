"""Regular expressions (Python ``re`` or ECMA-262 syntax) -> the byte-level grammar IR.

``regex_to_ir`` parses with ``grammars.regex_parser`` and maps the tree onto ``grammars.ir``:
every character set goes through ``encode_class`` (raw UTF-8 by default; the JSON front end
passes an encoder that also admits JSON escapes), repeats stay single ``Repeat`` nodes.

Anchors at the edges: ``^``/``\\A`` leading and ``$``/``\\Z`` trailing a top-level alternative
(or an alternative of a group that is a whole top-level alternative, as in ``(^a$)|(^b$)``).
With ``search=False`` (full match) they are no-ops; with ``search=True`` (``re.search`` / JSON
Schema ``pattern``) an unanchored side is padded with "any text". Anchors elsewhere in a
top-level sequence constrain the text before them (``^``: nothing, or a line under ``(?m)``) or
after them (``$``: the end), by intersection; a start anchor after an end anchor or a lookahead
(``(?m)^a$\n^b$``) needs text that cannot be empty between them (then that text alone decides
it); anchors inside repeats raise ``RegexError``.

Lookaheads ``(?=X)``/``(?!X)`` are supported where what follows them is a plain suffix of the
match: in a top-level sequence (groups that are not repeated are opened up, alternatives of
such a group distributed over what follows). There ``P (?=X) S`` is ``P`` followed by the
strings of ``S`` (plus what may follow the match) that also match ``X`` then anything, an IR
intersection; ``(?!X)`` intersects with the complement. ``$`` at the end of ``X`` pins it to the
end of the text. Lookaheads anywhere else (inside a repeat, another lookahead's start...) raise
``RegexError`` with their position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from constrain.grammars.errors import RegexError
from constrain.grammars.ir import EMPTY, Node, alt, complement, intersect, nullable, optional, repeat, seq
from constrain.grammars.regex_parser import Alternation, Anchor, Ast, Chars, Concat, Group, Look, Quant, parse
from constrain.grammars.unicode import MAX_CODE_POINT, char_class

__all__ = ["regex_to_ir"]

EncodeClass = Callable[[list[tuple[int, int]]], Node]

# A top-level alternative: (start anchor mode or None, body, end anchor mode or None).
_Branch = tuple[str | None, Ast, str | None]

# Anchor strength: combining two anchors at one edge keeps the stricter (earlier) one.
_MODES = ("strict", "final_newline", "multiline")
# How many copies of a suffix distributing a group's alternatives over it may make.
_MAX_DISTRIBUTED = 64


def regex_to_ir(
    pattern: str,
    *,
    dialect: Literal["python", "ecma"] = "python",
    search: bool = False,
    encode_class: EncodeClass = char_class,
) -> Node:
    """The IR for the strings ``pattern`` matches: in full (``search=False``, like
    ``re.fullmatch``) or anywhere in them (``search=True``, like ``re.search`` / ECMA ``test``)."""
    tree = parse(pattern, dialect)
    return _Builder(pattern, encode_class).top(tree, search)



class _Builder:
    def __init__(self, pattern: str, encode_class: EncodeClass) -> None:
        self.pattern = pattern
        self.encode_class = encode_class
        self.cache: dict[tuple[tuple[int, int], ...], Node] = {}

    def chars(self, ranges: tuple[tuple[int, int], ...]) -> Node:
        node = self.cache.get(ranges)
        if node is None:
            node = self.cache[ranges] = self.encode_class(list(ranges))
        return node

    def top(self, tree: Ast, search: bool) -> Node:
        parts = []
        for left, middle, right in self.alternatives(tree, None, None):
            if search:
                body = self.sequence(_items(middle), self.right_pad(right), head=self.left_pad(left))
            else:
                body = self.sequence(_items(middle), EMPTY, head=EMPTY)
            parts.append(body)
        return alt(*parts)

    def sequence(self, items: list[Ast], tail: Node, budget: list[int] | None = None,
                 head: Node | None = None, after: str = "") -> Node:
        """``head`` (the text before, None: unknown, since the items come ``after`` an end anchor or a
        lookahead), ``items``, then ``tail`` (the rest of the text), with lookaheads and anchors
        among the items enforced."""
        budget = [_MAX_DISTRIBUTED] if budget is None else budget
        items = _open_groups(items)
        done: list[Node] = [] if head is None else [head]
        for k, item in enumerate(items):
            if isinstance(item, Anchor) and item.side == "start":
                if head is None and nullable(seq(*done)):
                    raise RegexError(f"anchor {item.text} {after} is supported only where text that cannot be "
                                     "empty comes between them", self.pattern, item.pos)
                # With text of its own before it, what came earlier does not matter to the anchor.
                done = [intersect(seq(*done), self.before_start(item.mode))]
                continue
            if isinstance(item, (Look, Anchor)):
                what = f"after the end anchor {item.text}" if isinstance(item, Anchor) else "after a lookahead"
                rest = self.sequence(items[k + 1:], tail, budget, after=what)
                if isinstance(item, Anchor):  # an end anchor: only what it allows may follow
                    rest = intersect(rest, self.right_pad(item.mode))
                else:
                    ahead = self.lookahead(item, budget)
                    rest = intersect(rest, complement(ahead) if item.negative else ahead)
                return seq(*done, rest)
            if isinstance(item, Group) and isinstance(item.item, Alternation) and _has_look(item.item):
                budget[0] -= len(item.item.items)
                if budget[0] < 0:
                    look = _first_look(item.item)
                    raise RegexError("lookahead or anchor inside alternatives: too many combinations to expand",
                                     self.pattern, None if look is None else look.pos)
                later = items[k + 1:]
                now = None if head is None else seq(*done)
                branches = [self.sequence([b, *later], tail, budget, now, after) for b in item.item.items]
                return seq(*([] if head is not None else done), alt(*branches))
            done.append(self.build(item))
        return seq(*done, tail)

    def before_start(self, mode: str) -> Node:
        """What may precede a start anchor: nothing, or (multiline) text ending with a newline."""
        if mode == "multiline":
            return optional(seq(self.any_text(), self.chars(((10, 10),))))
        return EMPTY

    def lookahead(self, look: Look, budget: list[int]) -> Node:
        """The texts (from the lookahead's position to the end) that the lookahead accepts."""
        parts = []
        for left, middle, right in self.alternatives(look.item, None, None):
            if left is not None:
                raise RegexError("a start anchor inside a lookahead is not supported", self.pattern, look.pos)
            parts.append(self.sequence(_items(middle), self.right_pad(right), budget, after="inside a lookahead"))
        return alt(*parts)

    def alternatives(self, tree: Ast, left: str | None, right: str | None) -> list[_Branch]:
        """Split into top-level alternatives with their edge anchors removed and recorded."""
        out: list[_Branch] = []
        for branch in tree.items if isinstance(tree, Alternation) else (tree,):
            items = list(branch.items) if isinstance(branch, Concat) else [branch]
            lo, hi = left, right
            while items and isinstance(first := items[0], Anchor) and first.side == "start":
                lo = _stricter(lo, first.mode)
                items.pop(0)
            while items and isinstance(last := items[-1], Anchor) and last.side == "end":
                hi = _stricter(hi, last.mode)
                items.pop()
            if len(items) == 1 and isinstance(items[0], Group):
                out += self.alternatives(items[0].item, lo, hi)
            else:
                out.append((lo, Concat(tuple(items)), hi))
        return out

    def any_text(self) -> Node:
        return repeat(self.chars(((0, MAX_CODE_POINT),)), 0, None)

    def left_pad(self, mode: str | None) -> Node:
        if mode is None:
            return self.any_text()
        if mode == "multiline":  # ^ under (?m): at the start or just after any newline
            return optional(seq(self.any_text(), self.chars(((10, 10),))))
        return EMPTY

    def right_pad(self, mode: str | None) -> Node:
        if mode is None:
            return self.any_text()
        if mode == "multiline":  # $ under (?m): at the end or just before any newline
            return optional(seq(self.chars(((10, 10),)), self.any_text()))
        if mode == "final_newline":  # Python's $: at the end or before a final newline
            return optional(self.chars(((10, 10),)))
        return EMPTY

    def build(self, node: Ast) -> Node:
        if isinstance(node, Chars):
            return self.chars(node.ranges)
        if isinstance(node, Concat):
            return seq(*(self.build(item) for item in node.items))
        if isinstance(node, Alternation):
            return alt(*(self.build(item) for item in node.items))
        if isinstance(node, Group):
            return self.build(node.item)
        if isinstance(node, Quant):
            return repeat(self.build(node.item), node.min, node.max)
        if isinstance(node, Look):
            kind = "negative lookahead (?!...)" if node.negative else "lookahead (?=...)"
            raise RegexError(
                f"{kind} is only supported where the rest of the pattern follows it directly "
                "(not inside a repeat or an alternative that is repeated)", self.pattern, node.pos)
        if isinstance(node, Anchor):
            raise RegexError(f"anchor {node.text} inside a repeat is not supported (only in the pattern's "
                             "top-level sequence)", self.pattern, node.pos)
        raise TypeError(f"unexpected regex node {node!r}")


def _items(node: Ast) -> list[Ast]:
    return list(node.items) if isinstance(node, Concat) else [node]


def _open_groups(items: list[Ast]) -> list[Ast]:
    """Items with unrepeated groups of one sequence spliced in (so their lookaheads are reachable)."""
    out: list[Ast] = []
    stack = list(reversed(items))
    while stack:
        item = stack.pop()
        if isinstance(item, Concat):
            stack.extend(reversed(item.items))
        elif isinstance(item, Group) and not isinstance(item.item, Alternation) and _has_look(item.item):
            stack.extend(reversed(_items(item.item)))
        else:
            out.append(item)
    return out


def _has_look(node: Ast) -> bool:
    return _first_look(node) is not None


def _first_look(node: Ast) -> Look | Anchor | None:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (Look, Anchor)):
            return n
        if isinstance(n, (Concat, Alternation)):
            stack.extend(reversed(n.items))
        elif isinstance(n, (Group, Quant)):
            stack.append(n.item)
    return None


def _stricter(a: str | None, b: str) -> str:
    """Two anchors at the same edge must both hold: keep the stricter."""
    return b if a is None else _MODES[min(_MODES.index(a), _MODES.index(b))]
