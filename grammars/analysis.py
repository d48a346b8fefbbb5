"""Structural questions about IR rule sets, shared by the front ends: which rules a node uses,
which rules reach which, which sit on a cycle, and rewriting references."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from constrain.grammars import ir
from constrain.grammars.ir import Node, alt, repeat, seq

__all__ = ["children", "refs", "reachable_rules", "RefMapper", "cyclic_components", "rule_min_lengths", "MinLength", "INFINITE"]


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, (ir.Seq, ir.Alt, ir.And)):
        return node.items
    if isinstance(node, (ir.Repeat, ir.Not)):
        return (node.item,)
    if isinstance(node, ir.Unordered):
        return (*node.items, node.extra, node.first, node.sep, node.last)
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
        elif isinstance(node, ir.Unordered):
            out = ir.unordered([(self(i), r) for i, r in zip(node.items, node.required)], self(node.extra),
                               first=self(node.first), sep=self(node.sep), last=self(node.last),
                               min=node.min, max=node.max)
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


INFINITE = float("inf")


class MinLength:
    """Shortest match length of IR nodes, each rule counted as ``rule_mins[name]``.

    ``And``/``Not`` count as length 0 (a lower bound): the states built from them get an exact
    search in the compiler instead. Rule-free subtrees cache their length on the node itself.
    """

    def __init__(self, rule_mins: Mapping[str, float]) -> None:
        self.rule_mins = rule_mins
        self.memo: dict[int, float] = {}  # by identity (the grammar keeps every node alive)
        self.refs_seen = 0

    def rule(self, name: str) -> float:
        return self.rule_mins.get(name, INFINITE)

    def __call__(self, node: Node) -> float:
        got = node.cached_min_length
        if got is None:
            got = self.memo.get(id(node))
        if got is not None:
            return got
        refs_before = self.refs_seen
        if isinstance(node, ir.Bytes):
            out: float = 1 if node.mask else INFINITE
        elif isinstance(node, ir.Seq):
            out = sum([self(i) for i in node.items], 0.0)
        elif isinstance(node, ir.Alt):
            out = min([self(i) for i in node.items], default=INFINITE)
        elif isinstance(node, ir.And):
            out = INFINITE if INFINITE in [self(i) for i in node.items] else 0
        elif isinstance(node, ir.Not):
            out = 0
        elif isinstance(node, ir.Repeat):
            out = 0 if node.min == 0 else node.min * self(node.item)
        elif isinstance(node, ir.Unordered):
            out = ir.unordered_min_length([self(i) for i in node.items], node.required_mask(), self(node.extra),
                                          (self(node.first), self(node.sep), self(node.last)), node.min, node.max)
        elif isinstance(node, ir.Ref):
            self.refs_seen += 1
            return self.rule(node.name)  # never cached: it depends on the grammar
        else:
            raise TypeError(f"not an IR node: {node!r}")
        if self.refs_seen == refs_before:  # rule-free: true in every grammar, cache on the node
            node.cache_min_length(out)
        else:
            self.memo[id(node)] = out
        return out


class _RuleFixpoint(MinLength):
    """One pass of ``rule_min_lengths``: rules are entered, cycles fall back to the last pass."""

    def __init__(self, rules: Mapping[str, Node], known: dict[str, float]) -> None:
        super().__init__(known)
        self.rules = rules
        self.visiting: set[str] = set()
        self.cycles = False

    def rule(self, name: str) -> float:
        body = self.rules.get(name)
        if body is None or name in self.visiting:
            self.cycles = self.cycles or body is not None
            return self.rule_mins.get(name, INFINITE)  # undefined: reported when reached
        self.visiting.add(name)
        out = min(self(body), self.rule_mins.get(name, INFINITE))
        self.visiting.discard(name)
        return out


def rule_min_lengths(rules: Mapping[str, Node]) -> dict[str, float]:
    """Length of the shortest string each rule derives (``INFINITE`` for unproductive rules).

    Unproductive rules (``a: "x" a``) are turned into ``NOTHING`` so that no walk can enter a
    state with no way out; the lengths also drive the budget-aware close.
    """
    known: dict[str, float] = {}
    while True:
        size = _RuleFixpoint(rules, known)
        changed = False
        for name, body in rules.items():
            size.visiting.add(name)
            n = size(body)
            size.visiting.discard(name)
            if n < known.get(name, INFINITE):
                known[name] = n
                changed = True
        if not changed or not size.cycles:  # without cycles one pass is already exact
            return known
