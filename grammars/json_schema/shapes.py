"""``Shape``: one conjunction of JSON Schema assertions, in a form that merges by plain rules.

Applicators (``allOf``, ``anyOf``, ``oneOf``, ``$ref``, ``not``, ``if``...) are flattened away by
``grammars.json_schema.normalize`` into a disjunction of shapes. A shape keeps what ``allOf``
needs to merge structurally: type sets intersect, bounds tighten, string patterns and formats
accumulate, and object/array keywords stay per conjunct (``ObjectPart``/``ArrayPart``) because
``additionalProperties`` or ``items`` only mean something next to their own ``properties`` or
``prefixItems``. Subschemas below a value (a property's schema, ``items``) stay unexpanded
``Sub`` references: they become grammar rules of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from decimal import Decimal
from functools import cached_property
from typing import Any

from constrain.grammars.json_schema.document import Sub
from constrain.grammars.json_schema.numbers import Bound

__all__ = ["ALL_TYPES", "ObjectPart", "ArrayPart", "Contains", "Witness", "Shape", "meet_types", "tighter_lo", "tighter_hi"]

ALL_TYPES = frozenset({"null", "boolean", "object", "array", "string", "number"})
# The types a merge can leave: JSON's, with "integer" where "number" is not.
_MERGED_TYPES = ALL_TYPES | {"integer"}


def meet_types(a: frozenset[str], b: frozenset[str]) -> frozenset[str]:
    """Intersection of type sets where "number" includes "integer"."""
    out = set(a & b)
    if ("number" in a and "integer" in b) or ("integer" in a and "number" in b):
        out.add("integer")
    if "number" in out:
        out.discard("integer")
    return frozenset(out)


def tighter_lo(a: Bound | None, b: Bound | None) -> Bound | None:
    if a is None or b is None:
        return a or b
    if a.value != b.value:
        return a if a.value > b.value else b
    return a if not a.inclusive else b


def tighter_hi(a: Bound | None, b: Bound | None) -> Bound | None:
    if a is None or b is None:
        return a or b
    if a.value != b.value:
        return a if a.value < b.value else b
    return a if not a.inclusive else b


def _min(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else min(a, b)


@dataclass(frozen=True)
class ObjectPart:
    """The object keywords of one conjunct (``properties`` order is declaration order)."""

    properties: tuple[tuple[str, Sub], ...] = ()
    required: tuple[str, ...] = ()
    additional: Sub | None = None  # None: any value
    patterns: tuple[tuple[str, Sub], ...] = ()
    names: Sub | None = None
    annotates: bool = True  # False for parts made by negation: they evaluate no property

    @cached_property
    def declared(self) -> dict[str, Sub]:
        return dict(self.properties)

    @cached_property
    def forbidden(self) -> frozenset[str]:
        """The names declared with the schema ``false``."""
        return frozenset(n for n, sub in self.properties if sub.schema is False)

    def trivial(self) -> bool:
        return not (self.properties or self.required or self.patterns or self.names) and self.additional is None


@dataclass(frozen=True)
class ArrayPart:
    """The array keywords of one conjunct."""

    prefix: tuple[Sub, ...] = ()
    items: Sub | None = None  # None: any value beyond the prefix
    annotates: bool = True


@dataclass(frozen=True)
class Witness:
    """An object must have at least one member whose key is not in ``names``, matches none of
    ``patterns``, matches ``include`` (when given), and whose value satisfies ``value``.

    This is what negating ``additionalProperties``/``patternProperties`` asks for: some
    undeclared key with a value the keyword forbids, or some key matching a pattern with a value
    its schema rejects.
    """

    names: tuple[str, ...]
    patterns: tuple[str, ...]
    include: str | None
    value: Sub

    def covers(self, key: str) -> bool:
        """Whether a member with this (declared) key may serve as the witness."""
        from constrain.grammars.json_schema.keys import pattern_search

        return (key not in self.names and not any(pattern_search(p, key) for p in self.patterns)
                and (self.include is None or pattern_search(self.include, key)))


@dataclass(frozen=True)
class Contains:
    sub: Sub
    min: int = 1
    max: int | None = None


@dataclass(frozen=True)
class Shape:
    """A conjunction of assertions; ``types`` says which JSON types remain possible."""

    pointer: str = "#"
    types: frozenset[str] = ALL_TYPES
    enums: tuple[tuple[Any, ...], ...] = ()  # each: a list of allowed values (const is a 1-list)
    excluded: tuple[Any, ...] = ()  # values ruled out by ``not``
    # numbers
    lo: Bound | None = None
    hi: Bound | None = None
    multiples: tuple[Decimal, ...] = ()
    non_integer: bool = False  # from ``not: {type: integer}``
    # strings
    min_length: int = 0
    max_length: int | None = None
    patterns: tuple[tuple[str, str], ...] = ()  # (pattern, pointer)
    anti_patterns: tuple[tuple[str, str], ...] = ()  # must NOT match (from ``not``)
    formats: tuple[tuple[str, str], ...] = ()  # (format, pointer)
    # objects
    objects: tuple[ObjectPart, ...] = ()
    min_props: int = 0
    max_props: int | None = None
    witnesses: tuple[Witness, ...] = ()  # members that must exist (from negated additionalProperties...)
    # arrays
    arrays: tuple[ArrayPart, ...] = ()
    min_items: int = 0
    max_items: int | None = None
    contains: tuple[Contains, ...] = ()
    unique: tuple[str, ...] = ()  # pointers of uniqueItems: true
    # what could not be turned into structure: negations, and the raw conjuncts for value checks
    nots: tuple[Sub, ...] = ()
    raws: tuple[Sub, ...] = ()
    neg_raws: tuple[Sub, ...] = ()
    unsat: str | None = field(default=None, compare=False)

    @staticmethod
    def make(**values: Any) -> Shape:
        """``Shape(**fields)`` without the frozen dataclass's ``__init__`` (a guarded
        ``object.__setattr__`` per field: most of what a shape costs to make). A frozen
        dataclass keeps its fields in ``__dict__``, defaults first, then the ones given."""
        assert values.keys() <= _FIELD_DEFAULTS.keys(), values.keys() - _FIELD_DEFAULTS.keys()
        out = object.__new__(Shape)
        state = out.__dict__
        state.update(_FIELD_DEFAULTS)
        state.update(values)
        return out

    def merge(self, other: Shape) -> Shape:
        """The conjunction of two shapes (``allOf``)."""
        types = meet_types(self.types, other.types)
        out = Shape.make(
            pointer=self.pointer,
            types=types,
            enums=self.enums + other.enums,
            excluded=self.excluded + other.excluded,
            lo=tighter_lo(self.lo, other.lo),
            hi=tighter_hi(self.hi, other.hi),
            multiples=tuple(dict.fromkeys(self.multiples + other.multiples)),
            non_integer=self.non_integer or other.non_integer,
            min_length=max(self.min_length, other.min_length),
            max_length=_min(self.max_length, other.max_length),
            patterns=tuple(dict.fromkeys(self.patterns + other.patterns)),
            anti_patterns=tuple(dict.fromkeys(self.anti_patterns + other.anti_patterns)),
            formats=tuple(dict.fromkeys(self.formats + other.formats)),
            objects=tuple(p for p in dict.fromkeys(self.objects + other.objects) if not p.trivial()),
            min_props=max(self.min_props, other.min_props),
            max_props=_min(self.max_props, other.max_props),
            witnesses=tuple(dict.fromkeys(self.witnesses + other.witnesses)),
            arrays=tuple(dict.fromkeys(self.arrays + other.arrays)),
            min_items=max(self.min_items, other.min_items),
            max_items=_min(self.max_items, other.max_items),
            contains=self.contains + other.contains,
            unique=self.unique + other.unique,
            nots=self.nots + other.nots,
            raws=self.raws + other.raws,
            neg_raws=self.neg_raws + other.neg_raws,
            unsat=self.unsat or other.unsat,
        )
        return out.check()

    def at(self, pointer: str) -> Shape:
        """``Shape(pointer=pointer).merge(self)``: this shape as a value at ``pointer`` (how every
        rule's shapes start). Merging with that empty conjunct only normalises (removes repeated
        entries and trivial object parts, settles the types), so a shape with nothing to normalise
        is returned as it is, or copied with the new pointer, without a merge's full rebuild."""
        types = self.types
        if (len(self.multiples) > 1 or len(self.patterns) > 1 or len(self.anti_patterns) > 1
                or len(self.formats) > 1 or len(self.witnesses) > 1 or len(self.arrays) > 1
                or len(self.objects) > 1 or (self.objects and self.objects[0].trivial())
                or ("integer" in types and "number" in types) or not types <= _MERGED_TYPES
                or min(self.min_length, self.min_props, self.min_items) < 0 or self.check() is not self):
            return Shape(pointer=pointer).merge(self)
        if pointer == self.pointer:
            return self
        out = object.__new__(Shape)
        out.__dict__.update(self.__dict__)  # a frozen dataclass: its fields live in __dict__
        out.__dict__["pointer"] = pointer
        return out

    def check(self) -> Shape:
        """Drop types whose own keywords cannot be satisfied; record why when nothing is left."""
        types = set(self.types)
        reasons = []
        if self.lo is not None and self.hi is not None and (
            self.lo.value > self.hi.value or (self.lo.value == self.hi.value and not (self.lo.inclusive and self.hi.inclusive))
        ):
            types -= {"number", "integer"}
            reasons.append(f"the numeric range is empty (minimum {self.lo.value} > maximum {self.hi.value})")
        if self.non_integer and "integer" in types:
            types.discard("integer")
            reasons.append("a value must be both an integer and not an integer")
        if self.max_length is not None and self.min_length > self.max_length:
            types.discard("string")
            reasons.append(f"minLength {self.min_length} > maxLength {self.max_length}")
        if self.max_items is not None and self.min_items > self.max_items:
            types.discard("array")
            reasons.append(f"minItems {self.min_items} > maxItems {self.max_items}")
        if "object" in types and self.objects:
            required = set().union(*[part.required for part in self.objects])
            clash = required & set().union(*[part.forbidden for part in self.objects]) if required else required
            if clash:
                types.discard("object")
                reasons.append(f"property {sorted(clash)[0]!r} is both required and forbidden")
        if self.max_props is not None and self.min_props > self.max_props:
            types.discard("object")
            reasons.append(f"minProperties {self.min_props} > maxProperties {self.max_props}")
        if not types and self.unsat is None:
            reason = "; ".join(reasons) or "no JSON type satisfies every 'type' keyword"
            return replace(self, types=frozenset(), unsat=reason)
        return replace(self, types=frozenset(types)) if len(types) != len(self.types) else self

    @property
    def empty(self) -> bool:
        return not self.types


_FIELD_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Shape)}
