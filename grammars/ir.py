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

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar, TypeVar

from constrain.grammars.errors import UnsatisfiableError

if TYPE_CHECKING:
    from constrain.grammars.analysis import RuleLengths

__all__ = [
    "Node", "Bytes", "Seq", "Alt", "And", "Not", "Repeat", "Ref", "Unordered", "Grammar",
    "NOTHING", "EMPTY", "ANY_BYTE",
    "byte_set", "literal", "seq", "alt", "intersect", "complement", "repeat", "optional", "ref", "unordered",
    "unordered_min_length", "nullable",
]


class Node:
    """Base of all IR nodes.

    Hashes are cached: the compiler memoises by node, and a frozen dataclass would otherwise
    rehash the whole subtree on every lookup (quadratic on big schemas).
    """

    __slots__ = ()
    # Declared for the type checker; each node class defines them (dataclass fields and match args).
    _hash: int | None
    _min_length: float | None
    __match_args__: ClassVar[tuple[str, ...]]

    @property
    def cached_min_length(self) -> float | None:
        """Shortest match length of this rule-free subtree, once computed (see ``constrain.derivatives``)."""
        return self._min_length

    def cache_min_length(self, value: float) -> None:
        """Only for a subtree without ``Ref``: ``analysis.refs`` does not look inside a node that has one."""
        object.__setattr__(self, "_min_length", value)

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((type(self).__name__, *(getattr(self, f) for f in self.__match_args__)))
            object.__setattr__(self, "_hash", h)
        return h


_N = TypeVar("_N", bound=Node)


def _quick_init(cls: type[_N]) -> type[_N]:
    """Give a frozen slotted node class an ``__init__`` that sets its slots through their own
    descriptors: the dataclass one calls ``object.__setattr__`` per field, 2.4x slower, and the
    front ends make a node every microsecond or so."""
    names = [f.name for f in fields(cls) if f.init]  # type: ignore[arg-type]
    env = {f"_set{n}": cls.__dict__[n].__set__ for n in (*names, "_hash", "_min_length")}
    body = [f"    _set{n}(self, {n})" for n in names] + ["    _set_hash(self, None)", "    _set_min_length(self, None)"]
    exec(f"def __init__(self, {', '.join(names)}):\n" + "\n".join(body), env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@_quick_init
@dataclass(frozen=True, slots=True)
class Bytes(Node):
    """One byte from a set; ``mask`` has bit ``b`` set when byte ``b`` is allowed (0 = the empty language)."""

    mask: int
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class Seq(Node):
    """Concatenation; ``Seq(())`` is the language holding only the empty string."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class Alt(Node):
    """Union."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class And(Node):
    """Intersection: a string must match every item."""

    items: tuple[Node, ...]
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class Not(Node):
    """Complement with respect to all byte strings."""

    item: Node
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class Repeat(Node):
    """``item`` repeated ``min`` to ``max`` times; ``max=None`` means unbounded."""

    item: Node
    min: int
    max: int | None
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class Ref(Node):
    """A reference to a rule of the enclosing ``Grammar`` (this is what makes the IR context-free)."""

    name: str
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__


@_quick_init
@dataclass(frozen=True, slots=True)
class Unordered(Node):
    """Members in any order: each of ``items`` at most once (those flagged in ``required``
    exactly once), ``extra`` any number of times, between ``min`` and ``max`` members in all,
    written ``first m1 sep m2 ... sep mk last`` (the empty string when there are none).
    Members must not match the empty string (the compiler relies on it).

    JSON object members are this; spelling it with ``Alt``/``Seq`` needs a rule per subset of
    members already written, so it is a node of its own and the compiler expands the subsets
    it actually meets, one at a time.
    """

    items: tuple[Node, ...]
    required: tuple[bool, ...]
    extra: Node
    first: Node
    sep: Node
    last: Node
    min: int
    max: int | None
    _hash: int | None = field(default=None, init=False, compare=False, repr=False)
    _min_length: float | None = field(default=None, init=False, compare=False, repr=False)
    __hash__ = Node.__hash__

    def required_mask(self) -> int:
        """``required`` as a bitmask over ``items`` (the form the compiler's states use)."""
        return sum(1 << j for j, r in enumerate(self.required) if r)


@dataclass(frozen=True)
class Grammar:
    """Named rules plus a start rule. A grammar without ``Ref`` nodes is a plain regular expression."""

    rules: Mapping[str, Node]
    start: str = "start"
    # Human-readable notes from the front end (e.g. what a lenient compile relaxed).
    notes: tuple[str, ...] = field(default=())
    # What to raise when no document matches, from a front end that can say why (the JSON Schema
    # one names the first unsatisfiable place it met); raised where an emptiness is found by the
    # structure alone (``check_satisfiable`` and the compiler), not for an intersection found empty.
    unsatisfiable: UnsatisfiableError | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.start not in self.rules:
            raise ValueError(f"grammar has no start rule {self.start!r}")

    @cached_property
    def rule_lengths(self) -> RuleLengths:
        """Shortest match length per rule (``grammars.analysis.measure_rules``), computed once and
        shared by ``check_satisfiable`` and the Python compiler (which measures again only the rules
        whose length took a lower bound; the C++ one measures on its own)."""
        from constrain.grammars.analysis import measure_rules  # analysis builds on this module

        return measure_rules(self.rules)

    def check_satisfiable(self) -> None:
        """Raise ``unsatisfiable`` (an ``UnsatisfiableError``) when the start rule derives nothing
        even with each intersection and complement taken at its lower bound; the compiler finds
        the rest, searching them."""
        if self.start not in self.min_lengths:
            raise (self.unsatisfiable or UnsatisfiableError("grammar is unsatisfiable: its start rule derives "
                                                             "no string")).with_traceback(None)

    @property
    def min_lengths(self) -> dict[str, float]:
        """Shortest match length per rule, a lower bound where ``And``/``Not`` are involved."""
        return self.rule_lengths.lengths

    @staticmethod
    def of(node: Node) -> Grammar:
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


# One node per byte, shared by every literal: built once, hashed and measured once.
_BYTE: tuple[Node, ...] = tuple(Bytes(1 << b) for b in range(256))


def literal(text: bytes | str) -> Node:
    """Exactly ``text`` (a ``str`` is encoded as UTF-8), spelled with the shared byte nodes."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if len(data) == 1:
        return _BYTE[data[0]]
    return Seq(tuple(map(_BYTE.__getitem__, data)))


# The constructors below are the front ends' hottest code: they test node kinds with ``type(x) is``
# (no subclasses exist) and ``NOTHING``/``EMPTY`` by kind and content, where ``x == NOTHING`` would
# run the dataclass ``__eq__`` of both sides.

def _is_nothing(item: Node) -> bool:
    return type(item) is Bytes and not item.mask


def seq(*items: Node) -> Node:
    """Concatenation, flattened; ``NOTHING`` anywhere makes it ``NOTHING``."""
    out: list[Node] = []
    for item in items:
        kind = type(item)
        if kind is Seq:
            out.extend(item.items)  # type: ignore[attr-defined]
        elif kind is Bytes and not item.mask:  # type: ignore[attr-defined]
            return NOTHING
        else:
            out.append(item)
    return out[0] if len(out) == 1 else Seq(tuple(out))


# Up to this many parts ``alt`` compares a new part with those kept one by one (the kind, the
# hashes where both are cached, then a walk that stops at the first difference), rather than
# hashing it: a fresh tree's hash walks all of it, and the hashes would not be needed later.
_ALT_SCAN = 8


def alt(*items: Node) -> Node:
    """Union, flattened and de-duplicated (order kept); byte sets are merged."""
    out: list[Node] = []
    seen: set[Node] | None = None  # made past _ALT_SCAN parts: a lone part is never hashed (deep on a fresh tree)
    mask = 0
    for item in items:
        parts = item.items if type(item) is Alt else (item,)
        for part in parts:
            if type(part) is Bytes:
                mask |= part.mask
            elif seen is not None:
                if part not in seen:
                    seen.add(part)
                    out.append(part)
            else:
                kind, h = type(part), part._hash
                for kept in out:  # equal only if the same kind and (where both are known) hash
                    if kept is part or (type(kept) is kind and (h is None or kept._hash is None or h == kept._hash)
                                        and kept == part):
                        break
                else:
                    out.append(part)
                    if len(out) > _ALT_SCAN:
                        seen = set(out)
    if mask:
        out.insert(0, Bytes(mask))
    if not out:
        return NOTHING
    return out[0] if len(out) == 1 else Alt(tuple(out))


def intersect(*items: Node) -> Node:
    """Intersection; ``NOTHING`` anywhere makes it ``NOTHING``."""
    out: list[Node] = []
    for item in items:
        if _is_nothing(item):
            return NOTHING
        parts = item.items if type(item) is And else (item,)
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
    kind = type(item)
    if max == 0 or (kind is Seq and not item.items):  # type: ignore[attr-defined]
        return EMPTY
    if kind is Bytes and not item.mask:  # type: ignore[attr-defined]
        return EMPTY if min == 0 else NOTHING
    if min == max == 1:
        return item
    return Repeat(item, min, max)


def optional(item: Node) -> Node:
    """``item?``"""
    return EMPTY if _is_nothing(item) else alt(EMPTY, item)


def ref(name: str) -> Node:
    """A reference to rule ``name``."""
    return Ref(name)


def unordered(items: Iterable[tuple[Node, bool]], extra: Node = NOTHING, *, first: Node = EMPTY,
              sep: Node = EMPTY, last: Node = EMPTY, min: int = 0, max: int | None = None) -> Node:
    """``Unordered`` over ``(item, required)`` pairs; items that cannot match are dropped."""
    kept: list[tuple[Node, bool]] = []
    for item, req in items:
        if _is_nothing(item):
            if req:
                return NOTHING
            continue
        kept.append((item, req))
    if min < 0 or (max is not None and max < min):
        raise ValueError(f"bad member count bounds {{{min},{max}}}")
    if max is not None and sum(r for _, r in kept) > max:
        return NOTHING
    if not kept and _is_nothing(extra):
        return EMPTY if min == 0 else NOTHING
    return Unordered(tuple(i for i, _ in kept), tuple(r for _, r in kept), extra, first, sep, last, min, max)


def nullable(node: Node, nullable_rules: Container[str] = frozenset()) -> bool:
    """Whether ``node`` matches the empty string, given the names of the rules that do."""
    if isinstance(node, Bytes):
        return False
    if isinstance(node, (Seq, And)):
        return all(nullable(i, nullable_rules) for i in node.items)
    if isinstance(node, Alt):
        return any(nullable(i, nullable_rules) for i in node.items)
    if isinstance(node, Repeat):
        return node.min == 0 or nullable(node.item, nullable_rules)
    if isinstance(node, Ref):
        return node.name in nullable_rules
    if isinstance(node, Not):
        return not nullable(node.item, nullable_rules)
    if isinstance(node, Unordered):  # members are never empty: only the empty member list is
        return node.min == 0 and not any(node.required)
    raise TypeError(f"not an IR node: {node!r}")


def unordered_min_length(item_mins: Iterable[float], required: int, extra_min: float,
                         seps: tuple[float, float, float], lo: int, hi: int | None, seen: int = 0,
                         count: int = 0) -> float:
    """Shortest completion of an ``Unordered`` once the items in bitmask ``seen`` and ``count``
    members in all were written; ``required`` is a bitmask too (``Unordered.required_mask``);
    ``seps`` are the lengths of ``first``, ``sep``, ``last``.

    The required items still missing, then the cheapest others until ``min`` is reached."""
    inf = float("inf")
    need, optional_mins = 0.0, []
    n_req = 0
    for j, m in enumerate(item_mins):
        if seen >> j & 1:
            continue
        if required >> j & 1:
            need += m
            n_req += 1
        elif m < inf:
            optional_mins.append(m)
    more = max(lo - count - n_req, 0)
    total = n_req + more
    if hi is not None and count + total > hi:
        return inf
    if more:  # the extra member repeats, and may be cheaper than the optional items
        need += sum(sorted(optional_mins + [extra_min] * more)[:more])
    if total == 0:
        return 0 if count == 0 else seps[2]
    first, sep, last = seps
    return need + (first + (total - 1) * sep if count == 0 else total * sep) + last
