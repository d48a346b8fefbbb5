"""Structural questions about IR rule sets, shared by the front ends: which rules a node uses,
which rules reach which, which sit on a cycle, and rewriting references."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from constrain.grammars import ir
from constrain.grammars.errors import GrammarError
from constrain.grammars.ir import Node, alt, repeat, seq

__all__ = ["children", "refs", "reachable_rules", "RefMapper", "cyclic_components", "rule_min_lengths", "measure_rules", "RuleLengths", "MinLength", "INFINITE",
           "MAX_NESTING", "MAX_REPEAT", "nesting_error", "complement_cycle_error"]


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, (ir.Seq, ir.Alt, ir.And)):
        return node.items
    if isinstance(node, (ir.Repeat, ir.Not)):
        return (node.item,)
    if isinstance(node, ir.Unordered):
        return (*node.items, node.extra, node.first, node.sep, node.last)
    return ()


def refs(node: Node) -> set[str]:
    """Names of the rules ``node`` refers to.

    Called on every rule of every grammar, so it walks only what may hold a reference: a node
    whose length is cached is rule-free (``MinLength`` caches only those), which skips the shared
    byte nodes of literals (two thirds of a JSON Schema grammar) and the character classes,
    formats and patterns shared between grammars; each other subtree is walked once. (The node
    kinds are dispatched inline: a call per node was most of the walk.)"""
    out: set[str] = set()
    stack: list[Node] = [node]
    seen: set[int] = set()
    pop, push, extend, visit = stack.pop, stack.append, stack.extend, seen.add
    while stack:
        n = pop()
        kind = type(n)
        if kind is ir.Ref:
            out.add(n.name)  # type: ignore[attr-defined]
        elif n._min_length is None and kind is not ir.Bytes and id(n) not in seen:
            visit(id(n))
            if kind is ir.Seq or kind is ir.Alt or kind is ir.And:
                extend(n.items)  # type: ignore[attr-defined]
            elif kind is ir.Repeat or kind is ir.Not:
                push(n.item)  # type: ignore[attr-defined]
            else:
                extend(children(n))
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
    """Strongly connected components that contain a cycle."""
    return [c for c in strongly_connected_components(graph, order) if len(c) > 1 or c[0] in graph[c[0]]]


def strongly_connected_components(graph: dict[str, set[str]], order: Iterable[str]) -> list[list[str]]:
    """Strongly connected components (iterative Tarjan), each after every component it reaches."""
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
                out.append(comp)
    return out


INFINITE = float("inf")
# How deeply IR nodes (and rules through references) may nest for the recursive analyses here
# and in the compiler: each level costs a few interpreter frames, and together they must stay
# well below the default recursion limit (1000), which nothing in constrain changes.
MAX_NESTING = 150


# Each iteration a counted repetition must still make is a state of its own (its count): more
# required iterations than this cannot be decoded within a server's budget, so the length
# analysis (run on every rule when a grammar is compiled) refuses them up front rather than
# meeting them token by token. An upper bound alone costs nothing until used.
MAX_REPEAT = 100_000


def nesting_error() -> GrammarError:
    """The error for a constraint nested deeper than ``MAX_NESTING``."""
    return GrammarError(
        f"constraint nests more than {MAX_NESTING} levels deep (constrain.grammars.analysis.MAX_NESTING): "
        "flatten its deepest part (nested groups, properties or a chain of rules) or make it a recursive rule")


def complement_cycle_error(rule: str, used: str) -> GrammarError:
    """The error for recursion through a complement (``a: !b``, ``b: "" & a``: is "" in ``a``?
    only if it is not), which no front end produces and neither table decodes."""
    return GrammarError(
        f"rule {rule!r} refers to rule {used!r} inside a complement (Not), and {used!r} leads back to {rule!r}: "
        "recursion through a complement is not supported")


def _check_complements(comp: list[str], rules: Mapping[str, Node], index: Mapping[str, int]) -> None:
    """Raise ``complement_cycle_error`` where a rule of the cycle ``comp`` uses one of its rules
    inside a ``Not``: naming the first such rule (in grammar order) and the first rule it so uses,
    as the C++ table does."""
    cycle = set(comp)
    for name in sorted(comp, key=index.__getitem__):
        used: set[str] = set()
        stack, seen = [rules[name]], set()
        while stack:
            n = stack.pop()
            kind = type(n)
            if kind is ir.Ref or kind is ir.Bytes or n._min_length is not None or id(n) in seen:
                continue  # (a node with a cached length is rule-free)
            seen.add(id(n))
            if kind is ir.Not:
                used |= refs(n.item) & cycle  # type: ignore[attr-defined]
            else:
                stack.extend(children(n))
        if used:
            raise complement_cycle_error(name, min(used, key=index.__getitem__))


class MinLength:
    """Shortest match length of IR nodes, each rule counted as ``rule_mins[name]``.

    ``exact`` gives the length of an ``And``/``Not`` (the compiler searches its derivatives);
    without it they count as a lower bound (the longest member for ``And``, 0 for ``Not``).
    Only exact lengths of rule-free subtrees are cached on the node itself, since they hold in
    every grammar.
    """

    def __init__(self, rule_mins: Mapping[str, float], exact: Callable[[Node], float] | None = None) -> None:
        self.rule_mins = rule_mins
        self.exact = exact
        # By identity (the grammar keeps every node alive): lengths that depend on the rules or took
        # a lower bound, with whether they took one (a node seen again passes both on to its user)
        # and whether that was inside another node's bound.
        self.memo: dict[int, tuple[float, bool, bool]] = {}
        self.refs_seen = 0
        self.bounds_seen = 0  # lower bounds taken for And/Not
        self.level = 0  # recursion depth, bounded by MAX_NESTING
        # The And/Not nodes whose lower bound stands in a length (not inside another's bound), with
        # the bound; ``bounds_known`` turns False when one may be missing (see ``RuleLengths``).
        self.bounds: dict[int, tuple[Node, float]] = {}
        self.bounds_known = True
        self._inside_bound = 0

    def rule(self, name: str) -> float:
        return self.rule_mins.get(name, INFINITE)

    def __call__(self, node: Node) -> float:
        got = node._min_length
        if got is not None:
            return got
        hit = self.memo.get(id(node))
        if hit is not None:
            self.refs_seen += 1  # so the user is not cached as rule-free and exact either
            self.bounds_seen += hit[1]
            if hit[2] and not self._inside_bound:
                self.bounds_known = False  # its bounds were not listed: measured inside another's
            return hit[0]
        if self.level >= MAX_NESTING:
            raise nesting_error()
        self.level += 1
        try:
            out = self._measure(node)
        finally:
            self.level -= 1
        return out

    def _measure(self, node: Node) -> float:
        refs_before, bounds_before = self.refs_seen, self.bounds_seen
        kind = type(node)
        # Items whose length is cached on the node (most are the shared bytes of literals) are read
        # in place, not measured by a call each: that call was most of the measuring.
        if kind is ir.Seq:
            out: float = 0.0
            for i in node.items:  # type: ignore[attr-defined]
                m = i._min_length
                out += self(i) if m is None else m
        elif kind is ir.Alt:
            out = INFINITE
            for i in node.items:  # type: ignore[attr-defined]
                m = i._min_length
                if m is None:
                    m = self(i)
                if m < out:
                    out = m
        elif kind is ir.Bytes:
            out = 1 if node.mask else INFINITE  # type: ignore[attr-defined]
        elif kind is ir.Ref:
            self.refs_seen += 1
            return self.rule(node.name)  # type: ignore[attr-defined]  # never cached: it depends on the grammar
        elif isinstance(node, ir.Repeat):
            if node.min > MAX_REPEAT:
                raise GrammarError(
                    f"repetition of at least {node.min} iterations: more than {MAX_REPEAT} "
                    "(constrain.grammars.analysis.MAX_REPEAT) would be decoded one state per iteration; "
                    "lower its minimum")
            if node.min:
                out = node.min * self(node.item)
            else:
                out = 0
                if not isinstance(node.item, ir.Bytes) and node.item._min_length is None:
                    self.refs_seen += 1  # not measured, so perhaps not rule-free: ``refs`` trusts what is cached
        elif isinstance(node, (ir.And, ir.Not)):
            out = self._boolean(node)
        elif isinstance(node, ir.Unordered):
            out = ir.unordered_min_length(self._each(node.items), node.required_mask(), self(node.extra),
                                          (self(node.first), self(node.sep), self(node.last)), node.min, node.max)
        else:
            raise TypeError(f"not an IR node: {node!r}")
        if self.refs_seen == refs_before and self.bounds_seen == bounds_before:
            node.cache_min_length(out)  # exact and rule-free: true in every grammar
        else:
            took = self.bounds_seen != bounds_before
            self.memo[id(node)] = (out, took, took and self._inside_bound > 0)
        return out

    def _each(self, items: tuple[Node, ...]) -> list[float]:
        """The lengths of ``items``, those cached on the node read in place."""
        return [self(i) if (m := i._min_length) is None else m for i in items]

    def _boolean(self, node: ir.And | ir.Not) -> float:
        if self.exact is not None:
            if refs(node):
                self.refs_seen += 1  # exact, but only in this grammar
            return self.exact(node)
        self.bounds_seen += 1
        if isinstance(node, ir.Not):
            out: float = 0
        else:
            self._inside_bound += 1
            try:
                out = max(self._each(node.items))
            finally:
                self._inside_bound -= 1
        if not self._inside_bound:
            seen = self.bounds.setdefault(id(node), (node, out))
            if seen[1] != out:
                self.bounds_known = False  # its bound fell with its cycle's lengths: not one number
        return out


class RuleLengths(NamedTuple):
    """What ``measure_rules`` learnt: the lengths (finite ones), the rules whose length took a
    lower bound (an ``And``/``Not`` measured without ``exact``, in the rule or in a rule it uses:
    every other length is exact), the rule graph (which rules each rule uses) and the bounds
    taken: each ``And``/``Not`` whose lower bound stands in some length, with that bound (None
    when the list may be incomplete)."""

    lengths: dict[str, float]
    bounded: frozenset[str]
    graph: dict[str, set[str]]
    bounds: tuple[tuple[Node, float], ...] | None = ()


def rule_min_lengths(rules: Mapping[str, Node], exact: Callable[[Node], float] | None = None) -> dict[str, float]:
    """Length of the shortest string each rule derives (``INFINITE`` for unproductive rules).

    Unproductive rules (``a: "x" a``) are turned into ``NOTHING`` so that no walk can enter a
    state with no way out; the lengths also drive the budget-aware close. ``exact``: as for
    ``MinLength``; with it, a rule whose intersection is empty is unproductive too.
    """
    return measure_rules(rules, exact).lengths


def measure_rules(rules: Mapping[str, Node], exact: Callable[[Node], float] | None = None,
                  known: RuleLengths | None = None,
                  settled: Callable[[dict[str, float]], None] | None = None) -> RuleLengths:
    """``rule_min_lengths``, with what it learnt; ``known``: an earlier measure of the same rules
    (without ``exact``), whose graph is reused and whose exact lengths are kept: only the rules it
    bounded are measured again (the compiler's exact pass after the front end's check), and none
    when ``exact`` finds each bound it took exact (``_bounds_exact``: the usual case).

    Rules are measured after the rules they use (no recursion through references, so a chain
    of thousands of rules costs no depth); a cycle is iterated until its lengths settle, which
    takes at most one pass per rule in it (a shortest derivation repeats no rule on a path).

    ``settled`` is told each component's lengths (``INFINITE`` included) once they are final,
    before any rule using them is measured: ``exact`` can then measure with them, so that an
    intersection found empty makes the rules above it unproductive too (``exact`` measuring
    with the first pass's lower bounds would find them a length).
    """
    if known is not None and exact is not None and _bounds_exact(known, exact):
        # Every bound taken was exact: measuring again would repeat the same sums and minima.
        return RuleLengths(dict(known.lengths), frozenset(), known.graph)
    graph = known.graph if known is not None else {name: {r for r in refs(body) if r in rules}
                                                   for name, body in rules.items()}
    lengths: dict[str, float] = {}
    bounded: set[str] = set()
    size = MinLength(lengths, exact)
    index = {name: i for i, name in enumerate(rules)}
    for comp in strongly_connected_components(graph, rules):
        if known is not None and known.bounded.isdisjoint(comp):
            lengths.update((name, known.lengths[name]) for name in comp if name in known.lengths)
        else:
            bounds_before = size.bounds_seen
            _measure_component(comp, rules, graph, lengths, size, index)
            if size.bounds_seen > bounds_before or any(not bounded.isdisjoint(graph[name]) for name in comp):
                bounded.update(comp)
        if settled is not None:
            settled({name: lengths.get(name, INFINITE) for name in comp})
    return RuleLengths({name: n for name, n in lengths.items() if n < INFINITE}, frozenset(bounded), graph,
                       tuple(size.bounds.values()) if size.bounds_known else None)


def _bounds_exact(known: RuleLengths, exact: Callable[[Node], float]) -> bool:
    """Whether every bound ``known`` took is what ``exact`` finds for its node.

    The exact pass measures the bounded rules again, the same way, but each of these nodes counts
    as ``exact(node)``, one number (``exact`` sees the rules with ``known``'s lengths throughout):
    where each equals the bound the first pass took every time it met the node, the two passes
    add and compare the same numbers and end with the same lengths."""
    if known.bounds is None or not known.bounded:
        return known.bounds is not None
    return all(exact(node) == bound for node, bound in known.bounds)


def _measure_component(comp: list[str], rules: Mapping[str, Node], graph: dict[str, set[str]],
                       known: dict[str, float], size: MinLength, index: Mapping[str, int]) -> None:
    """Lengths of one strongly connected component's rules into ``known`` (``index``: each rule's
    place in ``rules``)."""
    if len(comp) == 1 and comp[0] not in graph[comp[0]]:
        known[comp[0]] = size(rules[comp[0]])
        return
    _check_complements(comp, rules, index)
    changed = True
    while changed:
        changed = False
        size.memo.clear()  # lengths inside the cycle are still falling
        for name in comp:
            n = size(rules[name])
            if n < known.get(name, INFINITE):
                known[name] = n
                changed = True
