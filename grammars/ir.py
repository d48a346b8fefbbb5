"""The grammar IR every front end produces: a CFG whose terminals are byte-level regular expressions.

Front ends (JSON Schema, regex, Lark) build trees of the nodes below; the compiler in
``constrain/`` turns them into a lazily explored token automaton. The IR works on *bytes*, so
Unicode is the front end's business (see ``grammars.unicode``), and it knows nothing of tokens.

Besides the usual regular operators the IR has intersection (``And``) and complement (``Not``):
JSON Schema needs them for ``not``, for keys that must differ from the declared ones, and for
strings that must satisfy a pattern, a length and a format at once. ``Repeat`` keeps its bounds
symbolic, so ``x{0,100000}`` costs one node, not a hundred thousand.

Nodes are immutable and hashable; build them with the helper functions at the bottom, which
simplify as they go (an ``Alt`` of one item is that item, a ``Seq`` containing ``NOTHING`` is
``NOTHING``...), rather than with the classes directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = [
    "Node", "Bytes", "Seq", "Alt", "And", "Not", "Repeat", "Ref", "Grammar",
    "NOTHING", "EMPTY", "ANY_BYTE",
    "byte_set", "literal", "seq", "alt", "intersect", "complement", "repeat", "optional", "ref",
]


class Node:
    """Base of all IR nodes.

    Hashes are cached: the compiler memoises by node, and a frozen dataclass would otherwise
    rehash the whole subtree on every lookup (quadratic on big schemas).
    """

    __slots__ = ()

    @property
    def cached_min_length(self) -> float | None:
        """Shortest match length of this rule-free subtree, once computed (see ``constrain.derivatives``)."""
        return self._min_length

    def cache_min_length(self, value: float) -> None:
        object.__setattr__(self, "_min_length", value)

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((type(self).__name__, *(getattr(self, f) for f in self.__match_args__)))
            object.__setattr__(self, "_hash", h)
        return h


@dataclass(frozen=True, slots=True)
class Bytes(Node):
    """One byte from a set; ``mask`` has bit ``b`` set when byte ``b`` is allowed (0 = the empty language)."""

    mask: int
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True, slots=True)
class Seq(Node):
    """Concatenation; ``Seq(())`` is the language holding only the empty string."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True, slots=True)
class Alt(Node):
    """Union."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True, slots=True)
class And(Node):
    """Intersection: a string must match every item."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True, slots=True)
class Not(Node):
    """Complement with respect to all byte strings."""

    item: Node
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True, slots=True)
class Repeat(Node):
    """``item`` repeated ``min`` to ``max`` times; ``max=None`` means unbounded."""

    item: Node
    min: int
    max: int | None
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True, slots=True)
class Ref(Node):
    """A reference to a rule of the enclosing ``Grammar`` (this is what makes the IR context-free)."""

    name: str
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@dataclass(frozen=True)
class Grammar:
    """Named rules plus a start rule. A grammar without ``Ref`` nodes is a plain regular expression."""

    rules: Mapping[str, Node]
    start: str = "start"
    # Human-readable notes from the front end (e.g. what a lenient compile relaxed).
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.start not in self.rules:
            raise ValueError(f"grammar has no start rule {self.start!r}")

    @staticmethod
    def of(node: Node) -> "Grammar":
        """A grammar whose language is that of one rule-free expression."""
        return Grammar({"start": node}, "start")


NOTHING: Node = Bytes(0)
EMPTY: Node = Seq(())
ANY_BYTE: Node = Bytes((1 << 256) - 1)


def byte_set(values: Iterable[int] | bytes | range) -> Node:
    """One byte out of ``values``."""
    mask = 0
    for b in values:
        if not 0 <= b <= 255:
            raise ValueError(f"byte out of range: {b}")
        mask |= 1 << b
    return Bytes(mask)


def literal(text: bytes | str) -> Node:
    """Exactly ``text`` (a ``str`` is encoded as UTF-8)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if len(data) == 1:
        return Bytes(1 << data[0])
    return Seq(tuple(Bytes(1 << b) for b in data))


def seq(*items: Node) -> Node:
    """Concatenation, flattened; ``NOTHING`` anywhere makes it ``NOTHING``."""
    out: list[Node] = []
    for item in items:
        if item == NOTHING:
            return NOTHING
        if isinstance(item, Seq):
            out.extend(item.items)
        else:
            out.append(item)
    return out[0] if len(out) == 1 else Seq(tuple(out))


def alt(*items: Node) -> Node:
    """Union, flattened and de-duplicated (order kept); byte sets are merged."""
    out: list[Node] = []
    seen: set[Node] = set()
    mask = 0
    for item in items:
        parts = item.items if isinstance(item, Alt) else (item,)
        for part in parts:
            if isinstance(part, Bytes):
                mask |= part.mask
            elif part not in seen:
                seen.add(part)
                out.append(part)
    if mask:
        out.insert(0, Bytes(mask))
    if not out:
        return NOTHING
    return out[0] if len(out) == 1 else Alt(tuple(out))


def intersect(*items: Node) -> Node:
    """Intersection; ``NOTHING`` anywhere makes it ``NOTHING``."""
    out: list[Node] = []
    for item in items:
        if item == NOTHING:
            return NOTHING
        parts = item.items if isinstance(item, And) else (item,)
        out.extend(p for p in parts if p not in out)
    if not out:
        raise ValueError("intersection of nothing")
    return out[0] if len(out) == 1 else And(tuple(out))


def complement(item: Node) -> Node:
    """Every byte string not in ``item``."""
    return item.item if isinstance(item, Not) else Not(item)


def repeat(item: Node, min: int = 0, max: int | None = None) -> Node:
    """``item{min,max}``; ``max=None`` is unbounded."""
    if min < 0 or (max is not None and max < min):
        raise ValueError(f"bad repetition bounds {{{min},{max}}}")
    if max == 0 or item == EMPTY:
        return EMPTY
    if item == NOTHING:
        return EMPTY if min == 0 else NOTHING
    if min == max == 1:
        return item
    return Repeat(item, min, max)


def optional(item: Node) -> Node:
    """``item?``"""
    return alt(EMPTY, item) if item != NOTHING else EMPTY


def ref(name: str) -> Node:
    """A reference to rule ``name``."""
    return Ref(name)
