"""Bounding recursion: rules on a ``Ref`` cycle are copied once per nesting level, the last
level referring to nothing, so a recursive schema admits at most ``depth`` nested levels."""

from __future__ import annotations

from grammars.ir import NOTHING, Alt, And, Node, Not, Ref, Repeat, Seq, alt, complement, intersect, ref, repeat, seq

__all__ = ["bound_recursion"]


def _cyclic(rules: dict[str, Node]) -> set[str]:
    """Rules that can reach themselves (Tarjan's algorithm, iterative)."""
    from grammars.json_schema.translate import _refs

    graph = {}
    for name, node in rules.items():
        out: set[str] = set()
        _refs(node, out)
        graph[name] = sorted(out & rules.keys())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cyclic: set[str] = set()
    counter = 0
    for root in rules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            succ = graph[v]
            if i < len(succ):
                work.append((v, i + 1))
                w = succ[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    cyclic.update(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return cyclic


def _rename(node: Node, f) -> Node:
    if isinstance(node, Ref):
        return f(node.name)
    if isinstance(node, Seq):
        return seq(*[_rename(i, f) for i in node.items])
    if isinstance(node, Alt):
        return alt(*[_rename(i, f) for i in node.items])
    if isinstance(node, And):
        return intersect(*[_rename(i, f) for i in node.items])
    if isinstance(node, Not):
        return complement(_rename(node.item, f))
    if isinstance(node, Repeat):
        return repeat(_rename(node.item, f), node.min, node.max)
    return node


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
                out[f"{name}@depth{level}"] = _rename(node, at(level))
        else:
            out[name] = _rename(node, lambda n: ref(f"{n}@depth0") if n in cyclic else ref(n))
    return out
