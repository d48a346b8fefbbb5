"""Regular expressions (Python ``re`` or ECMA-262 syntax) -> the byte-level grammar IR.

``regex_to_ir`` parses with ``grammars.regex_parser`` and maps the tree onto ``grammars.ir``:
every character set goes through ``encode_class`` (raw UTF-8 by default; the JSON front end
passes an encoder that also admits JSON escapes), repeats stay single ``Repeat`` nodes.

Anchors are only meaningful at the edges: ``^``/``\\A`` leading and ``$``/``\\Z`` trailing a
top-level alternative (or an alternative of a group that is a whole top-level alternative, as in
``(^a$)|(^b$)``). With ``search=False`` (full match) they are no-ops; with ``search=True``
(``re.search`` / JSON Schema ``pattern``) an unanchored side is padded with "any text".
Anchors anywhere else raise ``RegexError``.
"""

from __future__ import annotations

from typing import Callable, Literal

from grammars.errors import RegexError
from grammars.ir import EMPTY, Node, alt, optional, repeat, seq
from grammars.regex_parser import Anchor, Ast, Chars, Concat, Group, Quant, Alternation, parse
from grammars.unicode import MAX_CODE_POINT, char_class

__all__ = ["regex_to_ir"]

EncodeClass = Callable[[list[tuple[int, int]]], Node]

# A top-level alternative: (start anchor mode or None, body, end anchor mode or None).
_Branch = tuple[str | None, Ast, str | None]

# Anchor strength: combining two anchors at one edge keeps the stricter (earlier) one.
_MODES = ("strict", "final_newline", "multiline")


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
            body = self.build(middle)
            if search:
                body = seq(self.left_pad(left), body, self.right_pad(right))
            parts.append(body)
        return alt(*parts)

    def alternatives(self, tree: Ast, left: str | None, right: str | None) -> list[_Branch]:
        """Split into top-level alternatives with their edge anchors removed and recorded."""
        out: list[_Branch] = []
        for branch in tree.items if isinstance(tree, Alternation) else (tree,):
            items = list(branch.items) if isinstance(branch, Concat) else [branch]
            lo, hi = left, right
            while items and isinstance(items[0], Anchor) and items[0].side == "start":
                lo = _stricter(lo, items.pop(0).mode)
            while items and isinstance(items[-1], Anchor) and items[-1].side == "end":
                hi = _stricter(hi, items.pop().mode)
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
        if isinstance(node, Anchor):
            where = "start" if node.side == "start" else "end"
            raise RegexError(
                f"anchor {node.text} is only supported at the {where} of the pattern "
                f"(or of a top-level alternative)", self.pattern, node.pos)
        raise TypeError(f"unexpected regex node {node!r}")


def _stricter(a: str | None, b: str) -> str:
    """Two anchors at the same edge must both hold: keep the stricter."""
    return b if a is None else _MODES[min(_MODES.index(a), _MODES.index(b))]
