"""Bounding recursion: rules on a ``Ref`` cycle are copied once per nesting level, the last
level referring to nothing, so a recursive schema admits at most ``depth`` nested levels."""

from __future__ import annotations

from constrain.grammars.analysis import RefMapper, cyclic_components, refs
from constrain.grammars.ir import NOTHING, Node, ref

__all__ = ["bound_recursion"]


def _cyclic(rules: dict[str, Node]) -> set[str]:
    """Rules that can reach themselves."""
    graph = {name: refs(node) & rules.keys() for name, node in rules.items()}
    return {name for comp in cyclic_components(graph, rules) for name in comp}


def bound_recursion(rules: dict[str, Node], depth: int) -> dict[str, Node]:
    """Rules where each cyclic rule exists at levels 0..depth and a cyclic reference goes one level down."""
    cyclic = _cyclic(rules)
    if not cyclic:
        return rules
    out: dict[str, Node] = {}

    def at(level: int):
        def f(name: str) -> Node:
            if name not in cyclic:
                return ref(name)
            return ref(f"{name}@depth{level + 1}") if level + 1 <= depth else NOTHING
        return f

    for name, node in rules.items():
        if name in cyclic:
            for level in range(depth + 1):
                out[f"{name}@depth{level}"] = RefMapper(at(level))(node)
        else:
            out[name] = RefMapper(lambda n: ref(f"{n}@depth0") if n in cyclic else None)(node)
    return out
