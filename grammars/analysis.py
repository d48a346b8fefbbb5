"""Structural questions about IR rule sets, shared by the front ends: which rules a node uses,
which rules reach which, which sit on a cycle, and rewriting references."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from grammars import ir
from grammars.ir import Node, alt, repeat, seq

__all__ = ["children", "refs", "reachable_rules", "RefMapper", "cyclic_components"]


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, (ir.Seq, ir.Alt, ir.And)):
        return node.items
    if isinstance(node, (ir.Repeat, ir.Not)):
        return (node.item,)
    return ()


def refs(node: Node) -> set[str]:
    out: set[str] = set()
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, ir.Ref):
            out.add(n.name)
        else:
            stack.extend(children(n))
    return out


def reachable_rules(rules: Mapping[str, Node], start: str) -> set[str]:
    """Names of the rules ``start`` uses, directly or not (itself included)."""
    seen = {start}
    work = [start]
    while work:
        for r in refs(rules[work.pop()]):
            if r not in seen and r in rules:
                seen.add(r)
                work.append(r)
    return seen


class RefMapper:
    """Rebuild an IR tree with some ``Ref`` nodes replaced (``fn`` returns None to keep one)."""

    def __init__(self, fn: Callable[[str], Node | None]) -> None:
        self.fn = fn
        self.memo: dict[int, tuple[Node, Node]] = {}

    def __call__(self, node: Node) -> Node:
        got = self.memo.get(id(node))
        if got is not None:
            return got[1]
        if isinstance(node, ir.Ref):
            new = self.fn(node.name)
            out = node if new is None else new
        elif isinstance(node, ir.Seq):
            out = seq(*(self(i) for i in node.items))
        elif isinstance(node, ir.Alt):
            out = alt(*(self(i) for i in node.items))
        elif isinstance(node, ir.Repeat):
            out = repeat(self(node.item), node.min, node.max)
        elif isinstance(node, ir.And):
            out = ir.intersect(*(self(i) for i in node.items))
        elif isinstance(node, ir.Not):
            out = ir.complement(self(node.item))
        else:
            out = node
        self.memo[id(node)] = (node, out)
        return out


def cyclic_components(graph: dict[str, set[str]], order: Iterable[str]) -> list[list[str]]:
    """Strongly connected components that contain a cycle (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in order:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            pushed = False
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    pushed = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if pushed:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    out.append(comp)
    return out
