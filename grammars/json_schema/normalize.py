"""Schemas -> disjunctions of ``Shape``s: ``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not``, ``if``.

``anyOf`` distributes over its siblings (``{A, anyOf: [B, C]}`` = ``anyOf: [A&B, A&C]``), which is
what lets ``allOf`` merge objects structurally. ``not`` is pushed inside by De Morgan where each
keyword has an expressible opposite (``minimum`` <-> ``exclusiveMaximum``, ``required: [a]`` <->
``a`` absent...). ``oneOf`` becomes a union when its branches are provably disjoint (types,
constants, a discriminating property), otherwise each branch is conjoined with the negation of
the branches it overlaps. Anything left over is reported, never guessed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any

from constrain.grammars.errors import SchemaError, TimeLimitError
from constrain.grammars.json_schema.document import Document, Sub
from constrain.grammars.json_schema.literals import dedupe_values, hashable
from constrain.grammars.json_schema.numbers import Bound, to_decimal
from constrain.grammars.json_schema.shapes import (
    ALL_TYPES,
    ArrayPart,
    Contains,
    ObjectPart,
    Shape,
    Witness,
    meet_types,
    tighter_hi,
    tighter_lo,
)

__all__ = ["Normalizer", "CannotNegate", "TooManyAlternatives"]

MAX_ALTERNATIVES = 512
MAX_DEPTH = 96
JSON_TYPES = {"null", "boolean", "object", "array", "string", "number", "integer"}
UNSUPPORTED = ("$recursiveRef",)


class CannotNegate(Exception):
    """``not`` of this shape has no structural form."""


class TooManyAlternatives(SchemaError):
    """Combining applicators here yields more than ``MAX_ALTERNATIVES`` shapes (``oneOf`` then
    retries with narrower negations)."""


def _num(sub: Sub, kw: str) -> Decimal:
    v = sub.schema[kw]
    try:
        return to_decimal(v)
    except TypeError:
        raise SchemaError(f"'{kw}' must be a number, got {v!r}", sub.pointer + "/" + kw, kw) from None


def _count(sub: Sub, kw: str) -> int:
    v = sub.schema[kw]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SchemaError(f"'{kw}' must be a non-negative integer, got {v!r}", sub.pointer + "/" + kw, kw)
    return v


class Normalizer:
    """Flattens subschemas of one document into shapes (memoized per subschema)."""

    def __init__(self, doc: Document, *, oneof_as_anyof: bool, lenient: bool, note: Callable[[str], None],
                 valid: Callable[..., bool | None], seconds: float | None = None) -> None:
        self.doc = doc
        self.seconds = seconds
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self.oneof_as_anyof = oneof_as_anyof
        self.lenient = lenient
        self.note = note
        self.valid = valid
        self._memo: dict[tuple[int, str], list[Shape]] = {}
        self._active: set[tuple[int, str]] = set()
        self._depth = 0
        self._enum_sets: dict[int, tuple[set, tuple]] = {}  # by identity, the tuple kept alive beside its set
        self._excluded_sets: dict[int, tuple[set, tuple]] = {}  # alike
        self._constants: dict[tuple[int, bool], tuple[set | None, Any]] = {}  # by the schema's identity, kept alike
        self._narrowed = False
        self.why_not: dict[tuple[int, str], str] = {}  # negated subschema -> the keyword with no opposite
        self.last_unsat = ("no value satisfies every subschema", "#")

    def check_time(self, pointer: str) -> None:
        """Raise ``TimeLimitError`` past the time limit: the translation's loops ask it per rule and
        per row of a product, so no schema keeps a compile past its budget."""
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise TimeLimitError(self.seconds or 0.0, pointer)

    # ------------------------------------------------------------------ flattening

    def flatten(self, sub: Sub) -> list[Shape]:
        """The disjunction of shapes equivalent to ``sub``."""
        key = sub.key()
        got = self._memo.get(key)
        if got is not None:
            return got
        if key in self._active:
            raise SchemaError(
                "infinite recursion: this schema refers back to itself without descending into a value",
                sub.pointer, "$ref")
        if self._depth >= MAX_DEPTH:
            raise SchemaError(f"allOf/anyOf/oneOf/$ref chains nested deeper than {MAX_DEPTH} levels", sub.pointer)
        self._active.add(key)
        self._depth += 1
        try:
            out = self._flatten(sub)
        finally:
            self._active.discard(key)
            self._depth -= 1
        self._memo[key] = out
        return out

    def _flatten(self, sub: Sub) -> list[Shape]:
        s = sub.schema
        if s is True:
            return [Shape(pointer=sub.pointer)]
        if s is False:
            return []
        if not isinstance(s, dict):
            raise SchemaError(f"a schema must be an object or a boolean, not {type(s).__name__}", sub.pointer)
        doc = self.doc
        for kw in doc.foreign_keywords(s):
            self.note(f"'{kw}' at {sub.pointer} is not a {doc.dialect} keyword: ignored, as validators of "
                      "that draft do (declare another $schema to enforce it)")
        s = doc.keywords(s)
        for kw in UNSUPPORTED:
            if kw in s:
                raise SchemaError(f"'{kw}' is not supported", sub.pointer + "/" + kw, kw)
        if "$ref" in s and isinstance(s["$ref"], str):
            target = doc.resolve(s["$ref"], sub)
            if doc.ref_overrides:
                return self.flatten(target)
        alternatives: list[Shape] = [self.local_shape(sub)]
        if alternatives[0].empty:
            self.last_unsat = (alternatives[0].unsat or "no value satisfies it", sub.pointer)
            return []

        def conjoin(options: list[Shape]) -> None:
            nonlocal alternatives
            alternatives = self._product(alternatives, options, sub)

        if "$ref" in s:
            if not isinstance(s["$ref"], str):
                raise SchemaError("'$ref' must be a string", sub.pointer + "/$ref", "$ref")
            conjoin(self.flatten(target))
        if "$dynamicRef" in s:
            conjoin(self.flatten(self._dynamic_target(sub)))
        for kw in ("allOf", "anyOf", "oneOf"):
            if kw in s:
                if not isinstance(s[kw], list) or not s[kw]:
                    raise SchemaError(f"'{kw}' must be a non-empty array of schemas", sub.pointer + "/" + kw, kw)
                branches = [doc.child(sub, kw, i) for i in range(len(s[kw]))]
                if kw == "allOf":
                    for b in branches:
                        conjoin(self.flatten(b))
                elif kw == "anyOf":
                    conjoin([x for b in branches for x in self.flatten(b)])
                else:
                    conjoin(self.one_of(branches, sub))
        if "not" in s:
            conjoin(self.negate(doc.child(sub, "not")))
        if "if" in s:
            cond = doc.child(sub, "if")
            then = self.flatten(doc.child(sub, "then")) if "then" in s else [Shape(pointer=sub.pointer)]
            other = self.flatten(doc.child(sub, "else")) if "else" in s else [Shape(pointer=sub.pointer)]
            yes = self._product(self.flatten(cond), then, sub)
            no = self._product(self.negate(cond), other, sub)
            conjoin(yes + no)
        for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
            deps = s.get(kw)
            if deps is None:
                continue
            if not isinstance(deps, dict):
                raise SchemaError(f"'{kw}' must be an object", sub.pointer + "/" + kw, kw)
            for name, dep in deps.items():
                false = Sub(False, sub.base, sub.pointer + "/" + kw)
                absent = Shape(pointer=sub.pointer, objects=(ObjectPart(properties=((name, false),)),))
                if isinstance(dep, list):
                    if not all(isinstance(x, str) for x in dep):
                        raise SchemaError(f"'{kw}/{name}' must list property names", sub.pointer + "/" + kw, kw)
                    then = [Shape(pointer=sub.pointer, objects=(ObjectPart(required=(name, *dep)),))]
                else:
                    present = Shape(pointer=sub.pointer, objects=(ObjectPart(required=(name,)),))
                    then = self._product([present], self.flatten(doc.child(sub, kw, name)), sub)
                conjoin([absent] + then)
        if "unevaluatedProperties" in s or "unevaluatedItems" in s:
            alternatives = self._unevaluated(sub, alternatives)
        return alternatives

    def _dynamic_target(self, sub: Sub) -> Sub:
        """A ``$dynamicRef`` resolved statically: exact unless several dynamic anchors share its name."""
        ref = sub.schema["$dynamicRef"]
        target = self.doc.resolve(ref, sub)
        name = ref.split("#", 1)[-1]
        if not (isinstance(target.schema, dict) and target.schema.get("$dynamicAnchor") == name):
            return target  # behaves like $ref
        found = [t for (_, a), t in self.doc.anchors.items() if a == name and isinstance(t.schema, dict)
                 and t.schema.get("$dynamicAnchor") == name]
        if len(found) > 1:
            raise SchemaError(f"'$dynamicRef' {ref!r} with several dynamic anchors is not supported",
                              sub.pointer + "/$dynamicRef", "$dynamicRef")
        return target

    def _product(self, left: list[Shape], right: list[Shape], sub: Sub) -> list[Shape]:
        out: list[Shape] = []
        reasons: list[str] = []
        for a in left:
            self.check_time(sub.pointer)
            for b in right:
                m = a.merge(b)
                if not m.empty and "object" in m.types and len(m.objects) > 1:
                    m = self._prune_object(m)
                if m.empty:
                    reasons.append(m.unsat or "no value satisfies every subschema")
                else:
                    out.append(m)
                    if len(out) > MAX_ALTERNATIVES:
                        raise TooManyAlternatives(f"combining anyOf/oneOf/allOf here yields more than "
                                                  f"{MAX_ALTERNATIVES} alternatives", sub.pointer)
        if not out and reasons:
            self.last_unsat = (reasons[0], sub.pointer)
        return out

    def _prune_object(self, m: Shape) -> Shape:
        """``m`` without the object type when a required property must be one of some constants
        and none of them (``{const: a}`` from one conjunct, ``not {const: a}`` or ``{const: b}`` from
        others): the typical discriminator of ``if``/``oneOf`` chains. A cheap, syntactic test."""
        for name in dict.fromkeys(n for part in m.objects for n in part.required):
            subs = self.property_subs(m, name)
            if subs is None or len(subs) < 2:
                continue
            allowed: set | None = None
            banned: set = set()
            for sub in subs:
                got = self._constants_of(sub.schema)
                if got is not None:
                    allowed = got if allowed is None else allowed & got
                elif isinstance(sub.schema, dict) and set(sub.schema) == {"not"}:
                    got = self._constants_of(sub.schema["not"], exact=True)
                    if got is not None:
                        banned |= got
            if allowed is not None and not allowed - banned:
                return replace(m, types=m.types - {"object"},
                               unsat=m.unsat or f"property {name!r} has no value every conjunct allows")
        return m

    def _constants_of(self, schema: Any, exact: bool = False) -> set | None:
        """``_constants`` of ``schema``'s keywords, once per schema: an ``if``/``oneOf`` chain of n
        branches asks it of each branch for each of the n products (cloudify: 2.5M calls, 5 s)."""
        key = (id(schema), exact)
        got = self._constants.get(key)
        if got is None:
            got = self._constants[key] = (_constants(self.doc.keywords(schema), exact), schema)
        return got[0]

    # ------------------------------------------------------------------ local keywords

    def local_shape(self, sub: Sub) -> Shape:
        """The assertions of ``sub`` itself, applicators excluded."""
        doc = self.doc
        s = doc.keywords(sub.schema)
        p = sub.pointer
        kw: dict[str, Any] = {"pointer": p, "raws": (sub,)}
        if "type" in s:
            t = s["type"]
            names = [t] if isinstance(t, str) else t
            if not isinstance(names, list) or not all(isinstance(x, str) and x in JSON_TYPES for x in names):
                raise SchemaError(f"'type' must be a JSON type name or a list of them, got {t!r}", p + "/type", "type")
            types = frozenset(names)
            if "number" in types:
                types -= {"integer"}
            kw["types"] = types
            if not types:
                return Shape(types=frozenset(), unsat="'type' is an empty list", pointer=p)
        if "enum" in s:
            if not isinstance(s["enum"], list):
                raise SchemaError("'enum' must be an array", p + "/enum", "enum")
            kw["enums"] = (tuple(dedupe_values(s["enum"])),)
        if "const" in s:
            kw["enums"] = kw.get("enums", ()) + ((s["const"],),)
        # numbers
        kw["lo"], kw["hi"] = self._bounds(sub, s)
        if "multipleOf" in s:
            m = _num(sub, "multipleOf")
            if m <= 0:
                raise SchemaError("'multipleOf' must be greater than 0", p + "/multipleOf", "multipleOf")
            kw["multiples"] = (m,)
        # strings
        if "minLength" in s:
            kw["min_length"] = _count(sub, "minLength")
        if "maxLength" in s:
            kw["max_length"] = _count(sub, "maxLength")
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                raise SchemaError("'pattern' must be a string", p + "/pattern", "pattern")
            kw["patterns"] = ((s["pattern"], p + "/pattern"),)
        if "format" in s and isinstance(s["format"], str):
            kw["formats"] = ((s["format"], p + "/format"),)
        # objects
        obj = self._object_part(sub)
        if not obj.trivial():
            kw["objects"] = (obj,)
        if "minProperties" in s:
            kw["min_props"] = _count(sub, "minProperties")
        if "maxProperties" in s:
            kw["max_props"] = _count(sub, "maxProperties")
        # arrays
        arr = self._array_part(sub)
        if arr is not None:
            kw["arrays"] = (arr,)
        if "minItems" in s:
            kw["min_items"] = _count(sub, "minItems")
        if "maxItems" in s:
            kw["max_items"] = _count(sub, "maxItems")
        if "contains" in s:
            lo_c = _count(sub, "minContains") if "minContains" in s else 1
            hi_c = _count(sub, "maxContains") if "maxContains" in s else None
            kw["contains"] = (Contains(doc.child(sub, "contains"), lo_c, hi_c),)
        if s.get("uniqueItems") is True:
            kw["unique"] = (p + "/uniqueItems",)
        return Shape.make(**kw).check()

    def _bounds(self, sub: Sub, s: dict) -> tuple[Bound | None, Bound | None]:
        """``minimum``/``maximum`` and their exclusive forms: booleans modifying them up to draft-04,
        numbers of their own since draft-06; a value of the other kind is a ``SchemaError``."""
        legacy = self.doc.draft4
        for name in ("exclusiveMinimum", "exclusiveMaximum"):
            if name in s and isinstance(s[name], bool) != legacy:
                want = "a boolean (it modifies 'minimum'/'maximum')" if legacy else "a number"
                raise SchemaError(f"'{name}' must be {want} in {self.doc.dialect}, got {s[name]!r}",
                                  sub.pointer + "/" + name, name)
        lo = Bound(_num(sub, "minimum"), s.get("exclusiveMinimum") is not True) if "minimum" in s else None
        hi = Bound(_num(sub, "maximum"), s.get("exclusiveMaximum") is not True) if "maximum" in s else None
        if not legacy and "exclusiveMinimum" in s:
            lo = tighter_lo(lo, Bound(_num(sub, "exclusiveMinimum"), False))
        if not legacy and "exclusiveMaximum" in s:
            hi = tighter_hi(hi, Bound(_num(sub, "exclusiveMaximum"), False))
        return lo, hi

    def _unevaluated(self, sub: Sub, shapes: list[Shape]) -> list[Shape]:
        """``unevaluated*`` as a plain conjunct, per alternative: what its own scope did not evaluate.

        In one alternative the evaluated keys are those declared or pattern-matched by the parts
        that came from this subschema (negations annotate nothing), so the keyword becomes an
        ``additionalProperties`` next to exactly those names (and likewise for items).
        """
        s = self.doc.keywords(sub.schema)
        out = []
        for shape in shapes:
            if "unevaluatedProperties" in s:
                x = self.doc.child(sub, "unevaluatedProperties")
                parts = [p for p in shape.objects if p.annotates]
                if not any(p.additional is not None for p in parts):
                    true = Sub(True, sub.base, sub.pointer)
                    names = tuple(dict.fromkeys(n for p in parts for n, _ in p.properties))
                    pats = tuple(dict.fromkeys(pat for p in parts for pat, _ in p.patterns))
                    part = ObjectPart(tuple((n, true) for n in names), (), x, tuple((q, true) for q in pats))
                    shape = replace(shape, objects=shape.objects + (part,))
            if "unevaluatedItems" in s:
                x = self.doc.child(sub, "unevaluatedItems")
                if not any(a.items is not None for a in shape.arrays if a.annotates):
                    if shape.contains:
                        raise SchemaError("'unevaluatedItems' next to 'contains' is not supported",
                                          sub.pointer + "/unevaluatedItems", "unevaluatedItems")
                    n = max((len(a.prefix) for a in shape.arrays if a.annotates), default=0)
                    true = Sub(True, sub.base, sub.pointer)
                    shape = replace(shape, arrays=shape.arrays + (ArrayPart((true,) * n, x),))
            out.append(shape)
        return out

    def _object_part(self, sub: Sub) -> ObjectPart:
        s, p, doc = self.doc.keywords(sub.schema), sub.pointer, self.doc
        props: tuple = ()
        if "properties" in s:
            if not isinstance(s["properties"], dict):
                raise SchemaError("'properties' must be an object", p + "/properties", "properties")
            props = tuple((k, doc.child(sub, "properties", k)) for k in s["properties"])
        required: tuple = ()
        if "required" in s:
            r = s["required"]
            if isinstance(r, bool):  # draft-03 style: ignore
                r = []
            if not isinstance(r, list) or not all(isinstance(x, str) for x in r):
                raise SchemaError("'required' must be an array of property names", p + "/required", "required")
            required = tuple(dict.fromkeys(r))
        additional = doc.child(sub, "additionalProperties") if "additionalProperties" in s else None
        patterns: tuple = ()
        if "patternProperties" in s:
            if not isinstance(s["patternProperties"], dict):
                raise SchemaError("'patternProperties' must be an object", p + "/patternProperties", "patternProperties")
            patterns = tuple((k, doc.child(sub, "patternProperties", k)) for k in s["patternProperties"])
        names = doc.child(sub, "propertyNames") if "propertyNames" in s and s["propertyNames"] is not True else None
        return ObjectPart(props, required, additional, patterns, names)

    def _array_part(self, sub: Sub) -> ArrayPart | None:
        s, doc = self.doc.keywords(sub.schema), self.doc
        prefix: tuple = ()
        items = None
        if "prefixItems" in s:
            if not isinstance(s["prefixItems"], list):
                raise SchemaError("'prefixItems' must be an array", sub.pointer + "/prefixItems", "prefixItems")
            prefix = tuple(doc.child(sub, "prefixItems", i) for i in range(len(s["prefixItems"])))
            if "items" in s:
                items = doc.child(sub, "items")
        elif isinstance(s.get("items"), list):
            prefix = tuple(doc.child(sub, "items", i) for i in range(len(s["items"])))
            if "additionalItems" in s:
                items = doc.child(sub, "additionalItems")
        elif "items" in s:
            items = doc.child(sub, "items")
        if not prefix and items is None:
            return None
        return ArrayPart(prefix, items)

    # ------------------------------------------------------------------ negation

    def negate(self, sub: Sub, only: frozenset[str] | None = None, narrow: bool = False) -> list[Shape]:
        """Shapes equivalent to ``not sub``; keeps ``sub`` as an opaque negation when impossible.

        ``only``: the negation is needed for these types alone (the caller knows values of other
        types cannot satisfy ``sub`` in its context), so keywords of other types need no opposite.
        """
        p = sub.pointer
        shapes = self.flatten(sub)
        out = [Shape(pointer=p, neg_raws=(sub,))]
        try:
            for shape in shapes:
                out = self._product(out, self._negate_shape(shape, only, narrow), sub)
        except CannotNegate as exc:
            self.why_not.setdefault(sub.key(), str(exc))
            out = [Shape(pointer=p, nots=(sub,), neg_raws=(sub,))]
            if only is None:
                return out
            out = [replace(x, types=meet_types(x.types, only)).check() for x in out]
        if only is not None:
            out += _other_types(only, p)
        return [x for x in out if not x.empty]

    def _negate_shape(self, s: Shape, only: frozenset[str] | None = None, narrow: bool = False) -> list[Shape]:
        p = s.pointer
        scope = only if only is not None else ALL_TYPES

        def relevant(*types: str) -> bool:
            return bool(meet_types(meet_types(s.types, frozenset(types)), scope))

        if s.non_integer and relevant("number"):
            raise CannotNegate("'not' of 'not integer'")
        if s.nots:
            if len(s.nots) == 1 and s == Shape(pointer=s.pointer, nots=s.nots, neg_raws=s.neg_raws):
                return [replace(x, types=meet_types(x.types, scope)).check() for x in self.flatten(s.nots[0])]
            raise CannotNegate("a double negation next to other keywords")
        out: list[Shape] = []
        if s.excluded:  # not (v not in E) = v in E
            out.append(Shape(pointer=p, types=meet_types(s.types, scope), enums=(tuple(s.excluded),)).check())
        if s.types != ALL_TYPES:
            for x in _other_types(s.types, p):
                out.append(replace(x, types=meet_types(x.types, scope)).check())

        def violation(types: set[str], **kw: Any) -> None:
            t = meet_types(meet_types(s.types, frozenset(types)), scope)
            if t:
                out.append(Shape(pointer=p, types=t, **kw).check())

        for values in s.enums:
            out.append(Shape(pointer=p, types=meet_types(s.types, scope), excluded=tuple(values)).check())
        if s.lo is not None:
            violation({"number"}, hi=Bound(s.lo.value, not s.lo.inclusive))
        if s.hi is not None:
            violation({"number"}, lo=Bound(s.hi.value, not s.hi.inclusive))
        if s.multiples and relevant("number"):
            raise CannotNegate("'multipleOf'")
        if s.min_length:
            violation({"string"}, max_length=s.min_length - 1)
        if s.max_length is not None:
            violation({"string"}, min_length=s.max_length + 1)
        for pat in s.patterns:
            violation({"string"}, anti_patterns=(pat,))
        if s.anti_patterns and len(s.anti_patterns) == 1:
            violation({"string"}, patterns=s.anti_patterns)
        elif (s.anti_patterns or s.formats) and relevant("string"):
            raise CannotNegate("'format'" if s.formats else "several negated 'pattern's")
        required_here = {n for part in s.objects for n in part.required}
        if s.witnesses and relevant("object"):
            raise CannotNegate("negated 'additionalProperties'/'patternProperties'")
        if s.min_props:
            violation({"object"}, max_props=s.min_props - 1)
        if s.max_props is not None:
            violation({"object"}, min_props=s.max_props + 1)
        for part in s.objects:
            for name in part.required:
                false = Sub(False, "", p)
                violation({"object"}, objects=(ObjectPart(properties=((name, false),), annotates=False),))
            for name, value in part.properties:
                if value.schema is True or value.schema == {}:
                    continue
                if narrow and name in required_here:
                    self._narrowed = True  # "name absent" is kept; "present with a bad value" is dropped
                    continue
                neg = self.doc.negation(value)
                violation({"object"}, objects=(ObjectPart(properties=((name, neg),), required=(name,), annotates=False),))
            if part.names is not None and relevant("object"):
                raise CannotNegate("'propertyNames'")
            # not (every other member satisfies X) = some member violates X
            pats = tuple(key_pattern for key_pattern, _ in part.patterns)
            if part.additional is not None and part.additional.schema not in (True, {}):
                w = Witness(tuple(n for n, _ in part.properties), pats, None, self.doc.negation(part.additional))
                violation({"object"}, witnesses=(w,))
            for key_pattern, psub in part.patterns:
                if psub.schema not in (True, {}):
                    violation({"object"}, witnesses=(Witness((), (), key_pattern, self.doc.negation(psub)),))
        if s.min_items:
            violation({"array"}, max_items=s.min_items - 1)
        if s.max_items is not None:
            violation({"array"}, min_items=s.max_items + 1)
        for c in s.contains:
            if (c.min != 1 or c.max is not None) and relevant("array"):
                raise CannotNegate("'minContains'/'maxContains'")
            neg = self.doc.negation(c.sub)
            violation({"array"}, arrays=(ArrayPart(items=neg, annotates=False),))
        for arr in s.arrays:
            # not (item i is X_i) = there is an item i and it is not X_i
            true = Sub(True, "", p)
            for i, item in enumerate(arr.prefix):
                if item.schema not in (True, {}):
                    violation({"array"}, arrays=(ArrayPart((true,) * i + (self.doc.negation(item),), annotates=False),),
                              min_items=i + 1)
            if arr.prefix and arr.items is not None and arr.items.schema not in (True, {}) and relevant("array"):
                raise CannotNegate("'items' after 'prefixItems'")
            # not (every item is X) = some item is not X
            if not arr.prefix and arr.items is not None and arr.items.schema not in (True, {}):
                neg = self.doc.negation(arr.items)
                violation({"array"}, contains=(Contains(neg),))
        if s.unique and relevant("array"):
            raise CannotNegate("'uniqueItems'")
        return [x for x in out if not x.empty]

    # ------------------------------------------------------------------ oneOf

    def one_of(self, branches: list[Sub], sub: Sub) -> list[Shape]:
        """Each branch conjoined with the negation of the branches it may overlap.

        When that yields too many alternatives, the negations are narrowed: a branch that
        requires a property is excluded by that property's absence only (not also by its presence
        with a value the branch rejects). A subset of the exact language, so still sound; noted.
        """
        try:
            return self._one_of(branches, sub, narrow=False)
        except TooManyAlternatives:
            pass
        self._narrowed = False
        out = self._one_of(branches, sub, narrow=True)
        if self._narrowed:
            self.note(f"oneOf at {sub.pointer}/oneOf: a value matching one branch never has the required "
                      "properties of another (narrower than the schema, which would also allow them with "
                      "values the other branch rejects)")
        return out

    def _one_of(self, branches: list[Sub], sub: Sub, narrow: bool) -> list[Shape]:
        flat = [self.flatten(b) for b in branches]
        # Overlaps only matter among values the rest of ``sub`` admits (e.g. its 'required' may make
        # a discriminating property mandatory), so they are judged next to its own keywords.
        local = self.local_shape(sub)
        local = replace(local, raws=(), enums=()) if local.raws else local
        in_context = [[m for a in shapes if not (m := a.merge(local)).empty] for shapes in flat]
        out: list[Shape] = []
        for i, shapes in enumerate(flat):
            mine = shapes
            for j in range(len(flat)):
                if i == j or not mine:
                    continue
                overlap = frozenset().union(*[self.overlap(a, b) for a in in_context[i] for b in in_context[j]])
                if not overlap:
                    continue
                neg = self.negate(branches[j], overlap, narrow)
                if any(x.nots for x in neg) and not any(x.enums for x in mine):
                    if self.oneof_as_anyof or self.lenient:
                        self.note(f"relaxed oneOf to anyOf at {sub.pointer}/oneOf")
                        return [x for f in flat for x in f]
                    why = self.why_not.get(branches[j].key())
                    raise SchemaError(
                        f"cannot enforce 'oneOf': branches {i} and {j} may both match and branch {j} "
                        f"cannot be negated{f' (its {why} has no expressible opposite)' if why else ''}; "
                        "pass oneof_as_anyof=True to accept any matching branch",
                        sub.pointer + "/oneOf", "oneOf")
                mine = self._product(mine, neg, sub)
            out += mine
        return out

    def disjoint(self, a: Shape, b: Shape, depth: int = 0) -> bool:
        """Sufficient test that no value satisfies both shapes."""
        return not self.overlap(a, b, depth)

    def overlap(self, a: Shape, b: Shape, depth: int = 0) -> frozenset[str]:
        """The types on which some value may satisfy both shapes (empty: provably disjoint)."""
        common = meet_types(a.types, b.types)
        if not common:
            return frozenset()
        for x, y in ((a, b), (b, a)):
            if x.enums:
                values = self.values(x)
                if values is not None and not any(self.valid_shape(v, y) is not False for v in values):
                    return frozenset()
        return frozenset(t for t in common if not self._disjoint_type(t, a, b, depth))

    def _disjoint_type(self, t: str, a: Shape, b: Shape, depth: int) -> bool:
        if t in ("number", "integer"):
            for x, y in ((a, b), (b, a)):
                if x.hi is not None and y.lo is not None and (
                    x.hi.value < y.lo.value or (x.hi.value == y.lo.value and not (x.hi.inclusive and y.lo.inclusive))):
                    return True
            return False
        if t == "string":
            return (a.max_length is not None and a.max_length < b.min_length) or (
                b.max_length is not None and b.max_length < a.min_length)
        if t == "array":
            return (a.max_items is not None and a.max_items < b.min_items) or (
                b.max_items is not None and b.max_items < a.min_items)
        if t == "object" and depth < 3:
            for x, y in ((a, b), (b, a)):
                for name in {n for part in x.objects for n in part.required}:
                    xs, ys = self.property_subs(x, name), self.property_subs(y, name)
                    if ys is None:
                        return True  # forbidden in y
                    if xs and ys:  # present in x, so y's constraint on it applies too
                        try:
                            xf = self._flat_all(xs)
                            yf = self._flat_all(ys)
                        except SchemaError:  # e.g. a recursive definition still being flattened
                            continue
                        if all(self.disjoint(m, n, depth + 1) for m in xf for n in yf):
                            return True
        return False

    def _flat_all(self, subs: list[Sub]) -> list[Shape]:
        out = [Shape()]
        for s in subs:
            out = [a.merge(b) for a in out for b in self.flatten(s)]
            out = [x for x in out if not x.empty]
        return out

    def property_subs(self, s: Shape, name: str) -> list[Sub] | None:
        """Schemas a property ``name`` must satisfy in ``s`` (None: the property is forbidden)."""
        out: list[Sub] = []
        for part in s.objects:
            matched = [sub for pat, sub in part.patterns if _pattern_search(pat, name)] if part.patterns else None
            if matched:
                out += matched
            declared = part.declared.get(name)
            if declared is not None:
                out.append(declared)
            elif not matched and part.additional is not None:
                out.append(part.additional)
        for x in out:
            if x.schema is False:
                return None
        return out

    # ------------------------------------------------------------------ values

    def values(self, s: Shape) -> list[Any] | None:
        """The allowed values when ``s`` lists them (``enum``/``const``), checked against everything."""
        if not s.enums:
            return None
        return [v for v in s.enums[0] if self.valid_shape(v, s) is True]

    def valid_shape(self, v: Any, s: Shape) -> bool | None:
        """Whether ``v`` satisfies the conjuncts behind ``s`` (None: cannot tell)."""
        if not _type_ok(v, s.types):
            return False
        key = hashable(v)
        if s.excluded:  # (a set per shape: ``values`` asks this of every listed value)
            banned = self._excluded_sets.get(id(s.excluded))
            if banned is None:
                banned = self._excluded_sets[id(s.excluded)] = ({hashable(x) for x in s.excluded}, s.excluded)
            if key in banned[0]:
                return False
        for values in s.enums:
            members = self._enum_sets.get(id(values))
            if members is None:
                members = self._enum_sets[id(values)] = ({hashable(x) for x in values}, values)
            if key not in members[0]:
                return False
        result: bool | None = True
        for raw in s.raws:
            ok = self.valid(v, raw, True)
            if ok is False:
                return False
            if ok is None:
                result = None
        for raw in s.neg_raws:
            ok = self.valid(v, raw)
            if ok is True:
                return False
            if ok is None:
                result = None
        return result


_CONSTANT_SIBLINGS = frozenset({"type", "title", "description", "$comment", "default", "examples"})


def _constants(schema: Any, exact: bool = False) -> set | None:
    """The (hashable keys of the) values a schema's ``enum``/``const`` allow, if it has them and only
    annotations (``exact``) or also other keywords (which only narrow it further) beside them."""
    if not isinstance(schema, dict) or not ("enum" in schema or "const" in schema):
        return None
    others = set(schema) - {"enum", "const"}
    if exact and others - (_CONSTANT_SIBLINGS - {"type"}):
        return None
    out: set | None = None
    if isinstance(schema.get("enum"), list):
        out = {hashable(v) for v in schema["enum"]}
    if "const" in schema:
        c = {hashable(schema["const"])}
        out = c if out is None else out & c
    return out


def _type_ok(v: Any, types: frozenset[str]) -> bool:
    if v is None:
        return "null" in types
    if isinstance(v, bool):
        return "boolean" in types
    if isinstance(v, (int, float)):
        if "number" in types:
            return True
        return "integer" in types and (isinstance(v, int) or float(v).is_integer())
    if isinstance(v, str):
        return "string" in types
    if isinstance(v, list):
        return "array" in types
    return "object" in types


def _pattern_search(pattern: str, text: str) -> bool:
    from constrain.grammars.json_schema.keys import pattern_search

    return pattern_search(pattern, text)


def _other_types(types: frozenset[str], pointer: str) -> list[Shape]:
    """Shapes for the values whose type is not in ``types`` (integer-aware)."""
    out = []
    rest = ALL_TYPES - types - ({"number"} if "integer" in types else set())
    if "integer" in types and "number" not in types:
        out.append(Shape(pointer=pointer, types=frozenset({"number"}), non_integer=True))
    if rest:
        out.append(Shape(pointer=pointer, types=frozenset(rest)))
    return out
