"""Random strings from a Lark grammar, generated from lark's own compiled rules (not our IR).

Terminals are sampled from their regular expressions with Python's own regex parser
(``re._parser``), so nothing here shares code with the front end under test.
"""

from __future__ import annotations

import random
import re
import re._constants as C
import re._parser as sre

import lark

# Characters tried for negated classes and "." (ASCII, Latin-1, CJK, an emoji, odd spaces).
ALPHABET = [chr(c) for c in range(32, 127)] + ["\t", "é", "ß", "ñ", "中", "文", "😀", "\u00a0", "Ω"]
MAX_EXTRA_REPEATS = 3


def regex_sample(pattern: str, rng: random.Random, flags: int = 0) -> str:
    """A random string that ``re.fullmatch(pattern, ., flags)`` accepts."""
    tree = sre.parse(pattern, flags)
    for _ in range(100):
        out: list[str] = []
        _emit(tree, rng, tree.state.flags, out)
        s = "".join(out)
        if re.fullmatch(pattern, s, flags):
            return s
    raise AssertionError(f"could not sample {pattern!r}")


def _in_set(items, ch: str, ignorecase: bool) -> bool:
    c = ord(ch)
    negate = False
    hit = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            hit |= c == av or (ignorecase and ch.lower() == chr(av).lower())
        elif op is C.RANGE:
            lo, hi = av
            hit |= lo <= c <= hi or (ignorecase and any(lo <= ord(x) <= hi for x in (ch.lower(), ch.upper())))
        elif op is C.CATEGORY:
            hit |= _category(av, ch)
        else:
            raise NotImplementedError(op)
    return hit != negate


def _category(cat, ch: str) -> bool:
    table = {
        C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_SPACE: r"\s",
        C.CATEGORY_NOT_SPACE: r"\S", C.CATEGORY_WORD: r"\w", C.CATEGORY_NOT_WORD: r"\W",
    }
    return re.fullmatch(table[cat], ch) is not None


def _emit(tree, rng: random.Random, flags: int, out: list[str]) -> None:
    ignorecase = bool(flags & re.IGNORECASE)
    for op, av in tree:
        if op is C.LITERAL:
            ch = chr(av)
            out.append(rng.choice([ch.lower(), ch.upper()]) if ignorecase else ch)
        elif op is C.NOT_LITERAL:
            out.append(rng.choice([x for x in ALPHABET if ord(x) != av]))
        elif op is C.ANY:
            out.append(rng.choice([x for x in ALPHABET if x != "\n" or flags & re.DOTALL]))
        elif op is C.IN:
            choices = [x for x in ALPHABET if _in_set(av, x, ignorecase)]
            for sub, arg in av:  # make sure small explicit sets outside ALPHABET are reachable
                if sub is C.LITERAL:
                    choices.append(chr(arg))
                elif sub is C.RANGE:
                    choices.append(chr(rng.randint(*arg)))
            choices = [x for x in choices if _in_set(av, x, ignorecase)]
            out.append(rng.choice(choices))
        elif op is C.BRANCH:
            _emit(rng.choice(av[1]), rng, flags, out)
        elif op is C.SUBPATTERN:
            _group, add, dele, sub = av
            _emit(sub, rng, (flags | add) & ~dele, out)
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            lo, hi, sub = av
            top = lo + MAX_EXTRA_REPEATS if hi == C.MAXREPEAT else min(hi, lo + MAX_EXTRA_REPEATS)
            for _ in range(rng.randint(lo, top)):
                _emit(sub, rng, flags, out)
        elif op is C.ATOMIC_GROUP:
            _emit(av, rng, flags, out)
        elif op is C.AT:
            pass
        else:
            raise NotImplementedError(op)


class LarkSampler:
    """Random derivations of a Lark grammar, depth-limited, with ignored text sprinkled in."""

    def __init__(self, parser: lark.Lark, start: str = "start") -> None:
        self.start = start
        self.by_origin: dict[str, list[list]] = {}
        for rule in parser.rules:
            self.by_origin.setdefault(rule.origin.name, []).append(rule.expansion)
        self.patterns = {t.name: t.pattern.to_regexp() for t in parser.terminals}
        self.ignore = sorted(parser.ignore_tokens)
        self.height = self._heights()

    def _heights(self) -> dict[str, int]:
        inf = float("inf")
        h: dict[str, float] = {name: inf for name in self.by_origin}
        changed = True
        while changed:
            changed = False
            for name, expansions in self.by_origin.items():
                best = min(1 + max((self._h(h, s) for s in exp), default=0) for exp in expansions)
                if best < h[name]:
                    h[name] = best
                    changed = True
        return h  # type: ignore[return-value]

    def _h(self, h, sym) -> float:
        return 0 if sym.is_term else h[sym.name]

    def sample(self, rng: random.Random, max_depth: int = 8, ignore_rate: float = 0.3) -> str:
        tokens: list[str] = []
        self._expand(self.start, rng, max_depth, tokens)
        out: list[str] = []
        for tok in tokens + [""]:
            if self.ignore and rng.random() < ignore_rate:
                out.append(regex_sample(self.patterns[rng.choice(self.ignore)], rng))
            out.append(tok)
        return "".join(out)

    def _expand(self, name: str, rng: random.Random, depth: int, tokens: list[str]) -> None:
        expansions = self.by_origin[name]
        if depth <= 0:
            best = min(1 + max((self._h(self.height, s) for s in e), default=0) for e in expansions)
            expansions = [e for e in expansions
                          if 1 + max((self._h(self.height, s) for s in e), default=0) == best]
        for sym in rng.choice(expansions):
            if sym.is_term:
                tokens.append(regex_sample(self.patterns[sym.name], rng))
            else:
                self._expand(sym.name, rng, depth - 1, tokens)
