"""Hypothesis strategies shared by the native-vs-twin tests: random regexes over a few atoms
(quotes, escapes, multi-byte characters, classes), small vocabularies over the same bytes, and IR
expressions over the bytes ``ab`` with intersections and complements, and grammars of a few such
rules referring to each other (cycles included)."""

from __future__ import annotations

from hypothesis import strategies as st

from constrain.grammars import ir

ALPHABET = b'ab"{}\\\xc3\xa9'

atoms = st.sampled_from(["a", "b", '"', r"\{", "é", "[ab]", '[^"]', '[^"\\\\]', ".", r"\w", "[a-zé]"])


def regexes() -> st.SearchStrategy[str]:
    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(inner, min_size=2, max_size=3).map("".join),
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{0,4}"])).map(lambda p: f"({p[0]}){p[1]}"),
        )
    return st.recursive(atoms, grow, max_leaves=8)


small_vocabularies = st.lists(st.binary(min_size=1, max_size=4).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] for c in b)),
                              min_size=1, max_size=60)


ir_leaves = st.sampled_from([
    ir.literal("a"), ir.literal("b"), ir.byte_set(b"ab"), ir.EMPTY, ir.NOTHING, ir.literal("ab"),
])


def _extend(children: st.SearchStrategy[ir.Node]) -> st.SearchStrategy[ir.Node]:
    bounds = st.tuples(st.integers(0, 3), st.one_of(st.none(), st.integers(0, 3))).filter(
        lambda b: b[1] is None or b[1] >= b[0]
    )
    return st.one_of(
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ir.seq(*xs)),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ir.alt(*xs)),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ir.intersect(*xs)),
        children.map(ir.complement),
        st.tuples(children, bounds).map(lambda t: ir.repeat(t[0], t[1][0], t[1][1])),
    )


expressions = st.recursive(ir_leaves, _extend, max_leaves=8)


RULES = ("start", "r1", "r2")


def grammars() -> st.SearchStrategy[ir.Grammar]:
    """Three rules over ``expressions`` and references to each other: self and mutual recursion,
    rules empty by structure or only by an intersection."""
    leaves = st.one_of(ir_leaves, st.sampled_from([ir.ref(r) for r in RULES]))
    bodies = st.recursive(leaves, _extend, max_leaves=6)
    return st.tuples(bodies, bodies, bodies).map(lambda b: ir.Grammar(dict(zip(RULES, b))))
