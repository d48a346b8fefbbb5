"""Shapes -> grammar IR, one rule per value position.

Every subschema that describes a value (the document, a property, an item) becomes a rule, built
from a work queue rather than by recursion: 200-deep schemas and ``$ref`` cycles cost no Python
stack, and recursion in the schema becomes ``Ref`` cycles in the grammar (never left-recursive:
a ``[``, ``{`` or key is always consumed before a nested value).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal

from constrain.grammars.errors import RegexError, SchemaError, UnsatisfiableSchemaError
from constrain.grammars.ir import (
    EMPTY,
    NOTHING,
    Grammar,
    Node,
    alt,
    byte_set,
    complement,
    intersect,
    literal,
    optional,
    ref,
    repeat,
    seq,
)
from constrain.grammars.json_schema.building import Layout, RuleSink
from constrain.grammars.json_schema.document import ANNOTATIONS, Document, Sub
from constrain.grammars.json_schema.formats import KNOWN_FORMATS, format_ir
from constrain.grammars.json_schema.json_strings import (
    ANY_CANONICAL_CHAR,
    ANY_JSON_CHAR,
    canonical_char,
    json_char,
    json_text,
    string_literal,
)
from constrain.grammars.json_schema.literals import Incomplete, complete_value_ir, is_integral, value_ir
from constrain.grammars.json_schema.normalize import Normalizer
from constrain.grammars.json_schema.numbers import (
    ANY_NUMBER,
    FRACTION,
    INTEGRAL_FRACTION,
    MINUS,
    NATURAL,
    Bound,
    multiple_of_rules,
    number_ir,
)
from constrain.grammars.json_schema.oracle import ValidityOracle
from constrain.grammars.json_schema.shapes import Shape

__all__ = ["Options", "Translator"]


@dataclass(frozen=True)
class Options:
    """What ``json_schema_to_grammar`` was asked for (see its docstring)."""

    whitespace: Literal["compact", "flexible"] = "compact"
    max_whitespace: int = 4
    indent: int | None = None
    strict_properties: bool = False
    lenient: bool = False
    max_recursion_depth: int | None = None
    format_mode: Literal["enforce", "annotation"] = "enforce"
    unknown_format: Literal["error", "ignore"] = "ignore"
    oneof_as_anyof: bool = False
    remote_schemas: Any = None  # Mapping[str, schema] | Callable[[str], schema | None] | None
    property_order: Literal["any", "declared"] = "any"


_WS_BYTES = byte_set(b" \t\n\r")
_EXPONENT_FREE = seq(optional(MINUS), NATURAL, optional(FRACTION))
# With indent, how deep values may nest (rules are made per depth).
MAX_INDENT_DEPTH = 48


def _exact(bound: Bound | None) -> tuple[str, bool] | None:
    """A numeric bound as a key that tells apart every spelling (0, 0.0, -0)."""
    return None if bound is None else (str(bound.value), bound.inclusive)


def _any_body(lay: Layout, child: str, leaf: bool, surely_nonempty: Callable[[Node], bool]) -> Node:
    """The body of a rule of any JSON value whose members and items are rule ``child`` (``leaf``:
    containers only empty)."""
    chars = repeat(ref("json-char"))
    scalars = [literal("null"), literal("true"), literal("false"), ANY_NUMBER, seq(literal('"'), chars, literal('"'))]
    if leaf:
        return alt(*scalars, literal("[]"), literal("{}"))
    member = seq(literal('"'), chars, literal('"'), lay.colon, ref(child))
    return alt(
        *scalars,
        lay.container("[", optional(seq(ref(child), repeat(seq(lay.comma, ref(child))))), "]", surely_nonempty),
        lay.container("{", optional(seq(member, repeat(seq(lay.comma, member)))), "}", surely_nonempty),
    )


@lru_cache(maxsize=16)
def _compact_any_body(ws: Node) -> Node:
    """Rule ``any``'s body without indent, one per whitespace option and shared by every grammar:
    most schemas have one (an open object's additional values), and building it anew and walking a
    fresh copy in the length analysis cost ~13% of a small schema's front end. (Containers
    without indent ask nothing of ``surely_nonempty``.)"""
    return _any_body(Layout.at(ws, None, 0), "any", False, lambda node: False)


@lru_cache(maxsize=64)
def _number_range(lo: tuple[str, bool] | None, hi: tuple[str, bool] | None, integer: bool) -> Node:
    """``number_ir`` of a range given by ``_exact`` keys, made once per process: most number
    properties of most schemas share a few ranges (none, >= 0, >= 1), and the digits of one cost
    ~10% of a small schema's front end."""
    def bound(key: tuple[str, bool] | None) -> Bound | None:
        return None if key is None else Bound(Decimal(key[0]), key[1])

    return number_ir(bound(lo), bound(hi), integer=integer)


def _rule_key(sub: Sub) -> tuple[Any, ...]:
    """Which rule a value satisfying ``sub`` gets: ``sub``'s identity (``Sub.key()``), or, for a leaf
    (keywords with scalar values or lists of them, no dynamic reference), its content with the
    annotations left out, so that equal leaves share one rule: a schema's dozens of
    ``{"type": "string", "description": ...}`` properties, or of ``{"$ref": ...}`` to one
    definition, translate once. Values are tagged with their types (``1``, ``1.0`` and ``True``
    are equal in Python) and floats spelt exactly; a value of another type (a subclass) makes
    the schema no leaf."""
    schema = sub.schema
    if type(schema) is dict and "$dynamicRef" not in schema and "$recursiveRef" not in schema:
        content: list[tuple[Any, ...]] = []
        for k, v in schema.items():
            if k in ANNOTATIONS:
                continue
            kind = type(v)
            if kind is list:
                items = [_scalar_key(x) for x in v]
                if None in items:
                    return sub.key()
                content.append((k, kind, tuple(items)))
            else:
                key = _scalar_key(v)
                if key is None:
                    return sub.key()
                content.append((k, key))
        return ("leaf", tuple(content), sub.base)
    return sub.key()


def _scalar_key(v: Any) -> tuple[type, Any] | None:
    """A JSON scalar with its type (floats by their exact spelling); None for anything else."""
    kind = type(v)
    if kind is str or kind is int or kind is bool or v is None:
        return (kind, v)
    if kind is float:
        return (kind, repr(v))
    return None


class Translator:
    """Builds the rules of one grammar from one schema document."""

    def __init__(self, root: Any, options: Options, seconds: float | None = None) -> None:
        self.options = options
        self.doc = Document(root, options.remote_schemas)
        self.sink = RuleSink()
        self.notes: dict[str, None] = {}  # an ordered set: the normalizer adds to it too (no cycle back here)
        self._unsat: dict[str, str] = {}
        self._names: dict[tuple, str] = {}
        self._queue: deque[tuple[str, list[Sub], str, int]] = deque()
        self.norm = Normalizer(self.doc, oneof_as_anyof=options.oneof_as_anyof, lenient=options.lenient,
                               note=self.notes.setdefault, valid=ValidityOracle(self.doc, options.format_mode).valid,
                               seconds=seconds)
        if options.whitespace == "flexible":
            ws: Node = repeat(_WS_BYTES, 0, max(options.max_whitespace, 0))
        elif options.whitespace == "compact":
            ws = EMPTY
        else:
            raise SchemaError(f"whitespace must be 'compact' or 'flexible', not {options.whitespace!r}", "")
        indent = options.indent
        if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int) or indent < 0):
            raise SchemaError(f"indent must be a non-negative integer, not {indent!r}", "")
        self._ws, self._indent = ws, indent
        self._string_bodies: dict[tuple[Any, ...], Node] = {}
        self._patterns: dict[tuple[str, bool], Node] = {}
        self._key_literals: dict[str, Node] = {}
        self._key_bodies: dict[str, Node] = {}
        self.layout = self.layout_at(0)

    # ------------------------------------------------------------------ bookkeeping

    def layout_at(self, depth: int) -> Layout:
        """The document's ``Layout`` at ``depth`` (``Layout.at`` keeps them, per process)."""
        return Layout.at(self._ws, self._indent, depth)

    def note(self, text: str) -> None:
        self.notes.setdefault(text)

    def unsat(self, reason: str, pointer: str) -> None:
        self._unsat.setdefault(pointer, reason)

    def value_rule(self, subs: list[Sub], pointer: str, depth: int | None = None) -> Node:
        """A reference to the rule for values satisfying every schema in ``subs``, nested ``depth``
        containers deep (default: a member of the container being built)."""
        kept: list[Sub] = []  # the schemas that assert something
        for s in subs:
            schema = s.schema
            if schema is False:
                return NOTHING
            if schema is not True and schema != {}:
                kept.append(s)
        indent = self.layout.indent
        if depth is None:
            depth = self.layout.depth + 1
        if indent is not None and depth > MAX_INDENT_DEPTH:
            self.note(f"indent: values nested deeper than {MAX_INDENT_DEPTH} levels are not generated")
            return NOTHING
        subs = kept
        if not subs:
            return self.any_value(depth)
        key = tuple([_rule_key(s) for s in subs]) + ((depth,) if indent is not None else ())
        name = self._names.get(key)
        if name is None:
            label = "&".join(s.pointer for s in subs) + (f"@{depth}" if indent is not None else "")
            name = self._names[key] = self.sink.fresh_name(label)
            self.sink.mark_value(name)
            self._queue.append((name, subs, subs[0].pointer, depth))
        return ref(name)

    def shapes_of(self, subs: list[Sub]) -> list[Shape]:
        if not subs:
            return [Shape(pointer="#")]
        # ``Shape(pointer).merge(b)`` for the first schema's shapes (``Shape.at``), then merges.
        shapes = [m for b in self.norm.flatten(subs[0]) if not (m := b.at(subs[0].pointer)).empty]
        for s in subs[1:]:
            shapes = [m for a in shapes for b in self.norm.flatten(s) if not (m := a.merge(b)).empty]
        return shapes

    def run(self) -> Grammar:
        start = self.value_rule([self.doc.root_sub], "#", depth=0)
        while self._queue:
            name, subs, pointer, depth = self._queue.popleft()
            self.norm.check_time(pointer)
            self.layout = self.layout_at(depth)
            shapes = self.shapes_of(subs)
            if not shapes:
                self.unsat(*self.norm.last_unsat)
            self.sink.define(name, alt(*[self.shape_ir(sh) for sh in shapes]))
        rules = self.sink.rules
        rules["start"] = start
        if self.options.max_recursion_depth is not None:
            from constrain.grammars.json_schema.recursion import bound_recursion

            rules = bound_recursion(rules, self.options.max_recursion_depth)
        # Whether any document matches is the compiler's question (it measures the rules anyway,
        # in C++); this is what it says if none does, naming the first unsatisfiable place found.
        pointer, reason = next(iter(self._unsat.items()), ("#", "no finite JSON document satisfies it"))
        return Grammar(rules, "start", tuple(self.notes),
                       UnsatisfiableSchemaError(f"schema is unsatisfiable: {reason}", pointer))

    # ------------------------------------------------------------------ shapes

    def shape_ir(self, sh: Shape) -> Node:
        """The IR of values satisfying one shape."""
        if sh.enums:
            values = self.norm.values(sh)
            if not values:
                self.unsat("no value of 'enum'/'const' satisfies the other keywords", sh.pointer)
                return NOTHING
            return alt(*[self.value_literal(v, sh) for v in values])
        if sh.nots:
            where = ", ".join(n.pointer for n in sh.nots)
            if not self.options.lenient:
                whys = sorted({w for n in sh.nots if (w := self.norm.why_not.get(n.key()))})
                what = f" (its {', '.join(whys)})" if whys else ""
                raise SchemaError("cannot enforce a negation (from 'not', 'if' or the exclusivity of 'oneOf'): "
                                  f"the negated schema{what} has no expressible opposite; pass lenient=True to drop it "
                                  "(or oneof_as_anyof=True for oneOf)", where, "not")
            self.note(f"relaxed not at {where}")
        parts: list[Node] = []
        types = sh.types
        if "null" in types:
            parts.append(literal("null"))
        if "boolean" in types:
            parts.append(alt(literal("true"), literal("false")))
        if "number" in types or "integer" in types:
            parts.append(self.number_part(sh, integer="number" not in types))
        if "string" in types:
            parts.append(seq(literal('"'), self.string_body(sh), literal('"')))
        if "array" in types:
            from constrain.grammars.json_schema.arrays import array_ir

            parts.append(array_ir(self, self.layout, self.sink, sh))
        if "object" in types:
            from constrain.grammars.json_schema.objects import object_ir

            parts.append(object_ir(self, self.layout, self.sink, sh))
        node = alt(*parts)
        if sh.excluded and node != NOTHING:
            try:
                lay = self.layout
                if lay.indent is not None and any(isinstance(v, (list, dict)) and v for v in sh.excluded):
                    raise Incomplete()
                banned = alt(*[complete_value_ir(v, lay.ws, lay.comma, lay.colon) for v in sh.excluded])
            except Incomplete:
                raise SchemaError("cannot enforce 'not' of an object value with several keys", sh.pointer, "not") from None
            node = intersect(node, complement(banned))
        if node == NOTHING and sh.types:
            self.unsat("no value satisfies these keywords together", sh.pointer)
        return node

    def value_literal(self, v: Any, sh: Shape | None = None, depth: int | None = None) -> Node:
        """``v`` as generated (at ``depth``, default the current one); ``2.0`` for ``2`` too unless
        draft-04's integer type would reject it."""
        lay = self.layout
        if lay.indent is not None and isinstance(v, (list, dict)) and v:
            pad = b" " * (lay.indent * (lay.depth if depth is None else depth))
            return literal(json_text(v, indent=lay.indent).replace(b"\n", b"\n" + pad))
        fraction = not self.doc.draft4
        if not fraction and sh is not None and is_integral(v):
            fraction = self.norm.valid_shape(float(v), sh) is True
        return value_ir(v, lay.ws, lay.comma, lay.colon, fraction)

    def number_part(self, sh: Shape, integer: bool) -> Node:
        exponent_free = bool(sh.multiples or sh.excluded or sh.non_integer)
        node = _number_range(_exact(sh.lo), _exact(sh.hi), integer)
        if exponent_free and node == ANY_NUMBER:
            node = _EXPONENT_FREE
        if sh.non_integer:
            node = intersect(node, complement(seq(optional(MINUS), NATURAL, INTEGRAL_FRACTION)))
        for m in sh.multiples:
            if integer and m == m.to_integral_value() and m == 1:
                continue
            built = multiple_of_rules(m, f"multipleOf({m})@")
            if built is None:
                raise SchemaError(f"cannot enforce multipleOf {m}: the remainder automaton would be too large",
                                  sh.pointer + "/multipleOf", "multipleOf")
            rules, start = built
            for k, v in rules.items():
                self.sink.shared(k, v)
            node = intersect(node, seq(optional(MINUS), start))
        return node

    def string_body(self, sh: Shape, canonical: bool = False) -> Node:
        """The inside of a JSON string satisfying the string keywords of ``sh`` (made once per
        set of them: most string properties share theirs)."""
        key = (sh.min_length, sh.max_length, sh.patterns, sh.anti_patterns, sh.formats, canonical)
        got = self._string_bodies.get(key)
        if got is None:
            got = self._string_bodies[key] = self._string_body(sh, canonical)
        return got

    def _string_body(self, sh: Shape, canonical: bool) -> Node:
        char = (self.sink.shared("json-key-char", ANY_CANONICAL_CHAR) if canonical
                else self.sink.shared("json-char", ANY_JSON_CHAR))
        parts = [repeat(char, sh.min_length, sh.max_length)]
        for pat, where in sh.patterns:
            parts.append(self.pattern_ir(pat, where, canonical))
        for pat, where in sh.anti_patterns:
            parts.append(complement(self.pattern_ir(pat, where, canonical)))
        if self.options.format_mode == "enforce":
            for fmt, where in sh.formats:
                if fmt in KNOWN_FORMATS:
                    parts.append(format_ir("time@draft3" if fmt == "time" and self.doc.draft3 else fmt))
                elif self.options.unknown_format == "error":
                    raise SchemaError(
                        f"unknown format {fmt!r} (known: {', '.join(sorted(KNOWN_FORMATS))}); "
                        "pass unknown_format='ignore' to treat it as an annotation", where, "format")
                else:
                    self.note(f"ignored unknown format {fmt!r} at {where} (an annotation: it asserts nothing)")
        return intersect(*parts) if len(parts) > 1 else parts[0]

    def pattern_ir(self, pattern: str, where: str, canonical: bool = False) -> Node:
        """The IR of key or string bodies ``pattern`` matches (made once per pattern)."""
        from constrain.grammars.regex import regex_to_ir

        got = self._patterns.get((pattern, canonical))
        if got is None:
            try:
                got = self._patterns[pattern, canonical] = regex_to_ir(
                    pattern, dialect="ecma", search=True, encode_class=canonical_char if canonical else json_char)
            except RegexError as exc:
                raise SchemaError(f"cannot enforce pattern: {exc}", where, "pattern") from None
        return got

    def key_literal(self, key: str) -> Node:
        """The canonical spelling of ``key``, quotes included, made once per translation: keys repeat
        across a schema's objects, each spelling costs a ``json.dumps``, and a node made once is
        hashed and measured once. (Per translation, not per process: a process-wide table would
        keep thousands of nodes alive for the collector to walk, and other schemas share few keys.)"""
        got = self._key_literals.get(key)
        if got is None:
            got = self._key_literals[key] = string_literal(key)
        return got

    def key_body_literal(self, key: str) -> Node:
        """The canonical spelling of ``key`` without its quotes (made once per translation)."""
        got = self._key_bodies.get(key)
        if got is None:
            got = self._key_bodies[key] = literal(json_text(key)[1:-1])
        return got

    def property_names_ir(self, sub: Sub) -> Node:
        """Key bodies (canonical spelling) allowed by ``propertyNames``."""
        parts = []
        for sh in self.norm.flatten(sub):
            if sh.enums:
                parts += [self.key_body_literal(v) for v in self.norm.values(sh) or [] if isinstance(v, str)]
            elif "string" in sh.types:
                if sh.nots:
                    raise SchemaError("'not' inside propertyNames is not supported", sub.pointer, "propertyNames")
                body = self.string_body(sh, canonical=True)
                banned = [self.key_body_literal(v) for v in sh.excluded if isinstance(v, str)]
                if banned:  # keys are spelled canonically, so one spelling per excluded name
                    body = intersect(body, complement(alt(*banned)))
                parts.append(body)
        return alt(*parts)

    # ------------------------------------------------------------------ shared rules

    def any_value(self, depth: int | None = None) -> Node:
        """Any JSON value (nested ``depth`` containers deep with ``indent``; default: a member)."""
        depth = self.layout.depth + 1 if depth is None else depth
        if self.layout.indent is None:
            name, child = "any", "any"
        else:
            if depth > MAX_INDENT_DEPTH:
                return NOTHING
            name, child = f"any@{depth}", f"any@{depth + 1}"
        if name in self.sink:
            return ref(name)
        sink = self.sink
        sink.define(name, NOTHING, value=True)  # a placeholder while its members refer to it
        sink.shared("json-char", ANY_JSON_CHAR)  # (the bodies' strings refer to it)
        lay = self.layout_at(depth)
        if lay.indent is None:
            sink.define(name, _compact_any_body(lay.ws))
        else:
            sink.define(name, _any_body(lay, child, depth == MAX_INDENT_DEPTH, sink.surely_nonempty))
        if lay.indent is not None:
            self.any_value(depth + 1)
        return ref(name)

    def any_list(self) -> Node:
        return optional(seq(self.any_value(), repeat(seq(self.layout.comma, self.any_value()))))

