"""What the shape builders (``objects.py``, ``arrays.py``) receive from the translator.

A ``Layout`` (the separators of one nesting depth, an immutable value), a ``RuleSink`` (the only
place rules are named and defined) and ``Values`` (building the rules of nested values). The
builders hold no state of their caller's and write rules only through the sink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from constrain.grammars.ir import (
    ANY_BYTE,
    EMPTY,
    Alt,
    Bytes,
    Node,
    Ref,
    Repeat,
    Seq,
    alt,
    intersect,
    literal,
    ref,
    repeat,
    seq,
)

if TYPE_CHECKING:
    from constrain.grammars.json_schema.document import Document, Sub
    from constrain.grammars.json_schema.normalize import Normalizer
    from constrain.grammars.json_schema.shapes import Shape

__all__ = ["Layout", "RuleSink", "Values"]


@dataclass(frozen=True)
class Layout:
    """The structural tokens of a value nested ``depth`` containers deep.

    Compact/flexible JSON: the same everywhere. With ``indent``, as ``json.dumps(indent=n)``:
    members on their own lines, indented one level more than their container.
    """

    ws: Node
    indent: int | None
    depth: int
    comma: Node
    colon: Node
    first: Node  # before the first member of a container
    last: Node  # after its last member

    @classmethod
    @lru_cache(maxsize=64)
    def at(cls, ws: Node, indent: int | None, depth: int) -> Layout:
        """The layout at ``depth`` (made once per process: a few whitespace options and depths)."""
        if indent is None:
            return cls(ws, None, depth, seq(ws, literal(","), ws), seq(ws, literal(":"), ws), EMPTY, EMPTY)
        inner = "\n" + " " * (indent * (depth + 1))
        return cls(ws, indent, depth, literal("," + inner), literal(": "), literal(inner),
                   literal("\n" + " " * (indent * depth)))

    def braces(self, body: Node) -> Node:
        """``{ body }`` where ``body`` writes the line breaks around its members itself (with indent)."""
        if self.indent is not None:
            return seq(literal("{"), body, literal("}"))
        return seq(literal("{"), self.ws, body, self.ws, literal("}"))

    def container(self, open_: str, body: Node, close: str, surely_nonempty: Callable[[Node], bool]) -> Node:
        """``open_ body close`` where ``body`` holds the members with their separators.

        With ``indent`` the members start on a new line and the closing bracket gets its own line,
        unless there are none (``[]``, ``{}``); ``body`` must then not contain ``first``/``last``.
        """
        if self.indent is None:
            return seq(literal(open_), self.ws, body, self.ws, literal(close))
        empty = literal(open_ + close)
        if body == EMPTY:
            return empty
        parts = []
        items = body.items if isinstance(body, Alt) else (body,)
        rest = [x for x in items if x != EMPTY]
        if len(rest) < len(items):
            parts.append(empty)
            body = alt(*rest)
        elif not surely_nonempty(body):
            parts.append(seq(literal(open_), intersect(body, EMPTY), literal(close)))
        if not surely_nonempty(body):
            body = intersect(body, seq(ANY_BYTE, repeat(ANY_BYTE)))
        parts.append(seq(literal(open_), self.first, body, self.last, literal(close)))
        return alt(*parts)


class RuleSink:
    """The rules of one grammar being built: fresh names, definitions, and which rules are values
    (a value rule never matches the empty string, which the indented layout relies on)."""

    def __init__(self) -> None:
        self.rules: dict[str, Node] = {}
        self._taken: set[str] = {"start", "any"}
        self._suffix: dict[str, int] = {}
        self._values: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.rules

    def fresh_name(self, base: str) -> str:
        """An unused rule name starting with ``base``."""
        name, i = base, self._suffix.get(base, 1)
        while name in self._taken:
            i += 1
            name = f"{base}~{i}"
        self._suffix[base] = i
        self._taken.add(name)
        return name

    def define(self, name: str, node: Node, *, value: bool = False) -> Node:
        """Rule ``name`` is ``node`` (redefining a placeholder is how cyclic rules are built)."""
        self.rules[name] = node
        self._taken.add(name)
        if value:
            self._values.add(name)
        return ref(name)

    def mark_value(self, name: str) -> None:
        self._values.add(name)

    def shared(self, name: str, node: Node) -> Node:
        """A reference to a rule holding a big constant node (hashing and walking it once, not per use)."""
        return ref(name) if name in self.rules else self.define(name, node)

    def surely_nonempty(self, node: Node) -> bool:
        """Whether ``node`` never matches the empty string (False: cannot tell cheaply)."""
        if isinstance(node, Bytes):
            return node.mask != 0
        if isinstance(node, Seq):
            return any(self.surely_nonempty(i) for i in node.items)
        if isinstance(node, Alt):
            return all(self.surely_nonempty(i) for i in node.items)
        if isinstance(node, Repeat):
            return node.min > 0 and self.surely_nonempty(node.item)
        if isinstance(node, Ref):
            return node.name in self._values
        return False


class Values(Protocol):
    """The translator's services for the values inside a container (``translate.Translator``)."""

    options: Any  # translate.Options
    doc: Document
    norm: Normalizer

    def value_rule(self, subs: list[Sub], pointer: str, depth: int | None = None) -> Node: ...
    def shapes_of(self, subs: list[Sub]) -> list[Shape]: ...
    def value_literal(self, v: Any, sh: Shape | None = None, depth: int | None = None) -> Node: ...
    def any_value(self, depth: int | None = None) -> Node: ...
    def any_list(self) -> Node: ...
    def pattern_ir(self, pattern: str, where: str, canonical: bool = False) -> Node: ...
    def key_literal(self, key: str) -> Node: ...
    def key_body_literal(self, key: str) -> Node: ...
    def property_names_ir(self, sub: Sub) -> Node: ...
    def note(self, text: str) -> None: ...
    def unsat(self, reason: str, pointer: str) -> None: ...
