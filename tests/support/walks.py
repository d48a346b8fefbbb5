"""Hypothesis strategies shared by the native-vs-twin tests: random regexes over a few atoms
(quotes, escapes, multi-byte characters, classes) and small vocabularies over the same bytes."""

from __future__ import annotations

from hypothesis import strategies as st

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
