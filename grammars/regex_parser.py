"""Regex syntax -> a small AST whose leaves are code-point sets.

Two dialects: ``python`` follows CPython's ``re`` (str patterns) and ``ecma`` follows ECMA-262 as
JSON Schema uses it (Annex B leniency for a stray ``]``, ``}`` or non-quantifier ``{``, plus the
``u``-mode escapes ``\\u{..}`` and ``\\p{..}``). Every character-matching construct is resolved here
to code-point ranges (case folding included), so the IR builder in ``grammars.regex`` only sees
sets, sequences, unions, repeats, anchors and lookaheads (which the builder places). Features we
do not translate (backreferences, lookbehind, word boundaries, atomic groups, possessive
quantifiers...) raise ``RegexError`` naming the feature and its position.

Class escapes follow each dialect: Python's ``\\d \\w \\s`` are Unicode-aware (exactly as ``re``
for str patterns, ASCII under ``(?a)``); ECMA's ``\\d \\w`` are ASCII and ``\\s`` is ECMA's own
whitespace list. Known gap: CPython's ``(?ai)`` with a class range reaching past U+FFFF folds
non-ASCII letters (an ``re`` quirk we do not reproduce; we fold ASCII only under ``(?a)``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, replace
from typing import Literal

from constrain.grammars.errors import RegexError
from constrain.grammars.regex_classes import (
    ECMA_LINE_TERMINATORS,
    UnknownProperty,
    ecma_class,
    fold_ascii,
    fold_python,
    general_category,
    python_class,
)
from constrain.grammars.unicode import MAX_CODE_POINT, Ranges, negate, normalize

__all__ = ["Chars", "Concat", "Alternation", "Group", "Quant", "Anchor", "Look", "Ast", "parse", "MAX_REPEAT", "MAX_NESTING"]

Dialect = Literal["python", "ecma"]
AnchorMode = Literal["strict", "final_newline", "multiline"]

#: Largest repetition count accepted (``Repeat`` keeps counts symbolic, but the compiler's
#: automata still grow with them).
MAX_REPEAT = 100_000

#: Deepest group nesting accepted. The parser and the IR builder recurse once per level; the bound
#: keeps a deep pattern a ``RegexError`` (Python's ``re`` itself overflows the stack near 1,000)
#: while leaving the recursion limit alone.
MAX_NESTING = 50


@dataclass(frozen=True)
class Chars:
    """One character from ``ranges`` (sorted, merged code-point ranges)."""

    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Concat:
    items: tuple[Ast, ...]


@dataclass(frozen=True)
class Alternation:
    items: tuple[Ast, ...]


@dataclass(frozen=True)
class Group:
    """A parenthesised sub-pattern (kept so anchors inside ``(^a$)|(^b$)`` can be found)."""

    item: Ast


@dataclass(frozen=True)
class Quant:
    item: Ast
    min: int
    max: int | None


@dataclass(frozen=True)
class Anchor:
    """``^``/``$``/``\\A``/``\\Z``: ``side`` is start or end; ``mode`` says what else it accepts.

    ``strict``: only the string's edge; ``final_newline`` (Python ``$``): also before a final
    ``\\n``; ``multiline`` (``(?m)``): also after/before any ``\\n``.
    """

    side: Literal["start", "end"]
    mode: AnchorMode
    text: str
    pos: int


@dataclass(frozen=True)
class Look:
    """A lookahead ``(?=item)`` (``negative``: ``(?!item)``) found at ``pos``; the builder decides
    where it can be enforced."""

    item: Ast
    negative: bool
    pos: int


Ast = Chars | Concat | Alternation | Group | Quant | Anchor | Look


@dataclass(frozen=True)
class _Flags:
    ignorecase: bool = False
    dotall: bool = False
    multiline: bool = False
    verbose: bool = False
    ascii: bool = False


_PY_FLAG_LETTERS = "aiLmsux"
_FLAG_FIELDS = {"i": "ignorecase", "s": "dotall", "m": "multiline", "x": "verbose"}
_PY_ESCAPES = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92}
_ECMA_ESCAPES = {"f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
_ECMA_SYNTAX = set("^$\\.*+?()[]{}|/-")
_HEX = set("0123456789abcdefABCDEF")
_OCT = set("01234567")


def parse(pattern: str, dialect: Dialect = "python") -> Ast:
    """Parse ``pattern``; raises ``RegexError`` for malformed or unsupported syntax."""
    if dialect not in ("python", "ecma"):
        raise ValueError(f"unknown regex dialect {dialect!r}")
    return _Parser(pattern, dialect).parse()


class _Parser:
    def __init__(self, pattern: str, dialect: Dialect) -> None:
        self.src = pattern
        self.ecma = dialect == "ecma"
        self.i = 0
        self.flags = _Flags()
        self.names: set[str] = set()
        self.depth = 0  # groups open at the current position

    # --- helpers -----------------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> RegexError:
        return RegexError(message, self.src, self.i if pos is None else pos)

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src[j] if j < len(self.src) else ""

    def take(self) -> str:
        ch = self.peek()
        if not ch:
            raise self.error("unexpected end of pattern")
        self.i += 1
        return ch

    def eat(self, text: str) -> bool:
        if self.src.startswith(text, self.i):
            self.i += len(text)
            return True
        return False

    def skip_verbose(self) -> None:
        while self.flags.verbose:
            ch = self.peek()
            if ch in " \t\n\r\f\v" and ch:
                self.i += 1
            elif ch == "#":
                end = self.src.find("\n", self.i)
                self.i = len(self.src) if end < 0 else end + 1
            else:
                return

    def chars(self, ranges: Ranges, fold: bool = True) -> Chars:
        """A set leaf, case-folded under ``(?i)`` (``fold=False`` for ``.`` and bare class escapes)."""
        if fold and self.flags.ignorecase:
            ranges = fold_ascii(ranges) if self.flags.ascii else fold_python(ranges)
        return Chars(tuple(normalize(ranges)))

    # --- grammar -------------------------------------------------------------------------------
    def parse(self) -> Ast:
        if not self.ecma:
            self.global_flags()
        tree = self.alternation()
        if self.i < len(self.src):  # only a stray ')' stops the top-level alternation early
            raise self.error("unbalanced parenthesis")
        return tree

    def global_flags(self) -> None:
        """Python's ``(?aiLmsux)`` groups, accepted only at the very start (as in ``re`` 3.11+)."""
        while self.src.startswith("(?", self.i) and self.peek(2) in _PY_FLAG_LETTERS and self.peek(2):
            start = self.i
            j = self.i + 2
            while j < len(self.src) and self.src[j] in _PY_FLAG_LETTERS:
                j += 1
            if j >= len(self.src) or self.src[j] != ")":
                return  # a scoped group such as (?i:...), parsed as an atom
            self.flags = self.apply_flags(self.src[self.i + 2:j], "", start)
            self.i = j + 1
            self.skip_verbose()

    def apply_flags(self, on: str, off: str, pos: int) -> _Flags:
        if "L" in on + off:
            raise self.error("the L (locale) flag is not supported with str patterns", pos)
        if "a" in on and "u" in on:
            raise self.error("flags 'a' and 'u' are incompatible", pos)
        if set(off) & set("au"):
            raise self.error("cannot turn off flags 'a' and 'u'", pos)
        flags = self.flags
        for letter, value in [(c, True) for c in on] + [(c, False) for c in off]:
            if letter in "au":  # a: ASCII classes and folding; u: Unicode (the default)
                flags = replace(flags, ascii=letter == "a")
            else:
                flags = replace(flags, **{_FLAG_FIELDS[letter]: value})
        return flags

    def alternation(self) -> Ast:
        items = [self.concat()]
        while self.eat("|"):
            items.append(self.concat())
        return items[0] if len(items) == 1 else Alternation(tuple(items))

    def concat(self) -> Ast:
        items: list[Ast] = []
        quantified = False
        while True:
            self.skip_verbose()
            ch = self.peek()
            if ch == "" or ch in "|)":
                break
            start = self.i
            bounds = self.quantifier()
            if bounds is not None:
                if not items or isinstance(items[-1], Anchor):
                    raise self.error("nothing to repeat", start)
                if isinstance(items[-1], Look):
                    raise self.error("a quantified lookahead is not supported", start)
                if quantified:
                    raise self.error("multiple repeat", start)
                if self.peek() == "+" and not self.ecma:
                    raise self.error("possessive quantifiers are not supported", start)
                self.eat("?")  # lazy: same language
                low, high = bounds
                items[-1] = Quant(items[-1], low, high)
                quantified = True
                continue
            items.append(self.atom())
            quantified = False
        return items[0] if len(items) == 1 else Concat(tuple(items))

    def quantifier(self) -> tuple[int, int | None] | None:
        """Consume a quantifier if one starts here; a ``{`` that is not one is left alone."""
        start = self.i
        ch = self.peek()
        if ch in ("*", "+", "?") and ch:
            self.i += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if ch != "{":
            return None
        j = self.i + 1
        lo_start = j
        while j < len(self.src) and self.src[j].isdigit() and self.src[j].isascii():
            j += 1
        lo = self.src[lo_start:j]
        hi: str | None = lo
        if j < len(self.src) and self.src[j] == ",":
            j += 1
            hi_start = j
            while j < len(self.src) and self.src[j].isdigit() and self.src[j].isascii():
                j += 1
            hi = self.src[hi_start:j]
        if j >= len(self.src) or self.src[j] != "}":
            return None
        if self.ecma and not lo:  # ECMA needs a lower bound; "{,3}" is literal text
            return None
        if not self.ecma and j == self.i + 1:  # python: "{}" is literal text ("{,}" is {0,})
            return None
        low = int(lo) if lo else 0
        high = int(hi) if hi else None
        for count in (low, high):
            if count is not None and count > MAX_REPEAT:
                raise self.error(f"repetition count {count} exceeds the limit of {MAX_REPEAT}", start + 1)
        if high is not None and high < low:
            raise self.error("min repeat greater than max repeat", start + 1)
        self.i = j + 1
        return low, high

    def atom(self) -> Ast:
        start = self.i
        ch = self.take()
        if ch == "(":
            return self.group(start)
        if ch == "[":
            return self.char_class(start)
        if ch == ".":
            if self.ecma:
                return Chars(tuple(negate(ECMA_LINE_TERMINATORS)))
            return Chars(((0, MAX_CODE_POINT),) if self.flags.dotall else tuple(negate([(10, 10)])))
        if ch == "^":
            return Anchor("start", "multiline" if self.flags.multiline else "strict", ch, start)
        if ch == "$":
            mode: AnchorMode = "strict" if self.ecma else ("multiline" if self.flags.multiline else "final_newline")
            return Anchor("end", mode, ch, start)
        if ch == "\\":
            return self.escape(start)
        if self.ecma and ch in "*+?":
            raise self.error("nothing to repeat", start)
        return self.chars([(ord(ch), ord(ch))])

    # --- groups --------------------------------------------------------------------------------
    def group(self, start: int) -> Ast:
        if self.depth >= MAX_NESTING:
            raise self.error(f"groups nested more than {MAX_NESTING} deep", start)
        saved = self.flags
        self.depth += 1
        try:
            if self.src.startswith("?=", self.i) or self.src.startswith("?!", self.i):
                negative = self.src[self.i + 1] == "!"
                self.i += 2
                inner = self.alternation()
                if not self.eat(")"):
                    raise self.error("missing ), unterminated subpattern", start)
                return Look(inner, negative, start)
            if self.eat("?"):
                self.group_extension(start)
            inner = self.alternation()
            if not self.eat(")"):
                raise self.error("missing ), unterminated subpattern", start)
            return Group(inner)
        finally:
            self.depth -= 1
            self.flags = saved

    def group_extension(self, start: int) -> None:
        """Handle what follows ``(?``: non-capturing and named groups, scoped flags; reject the rest."""
        if self.eat(":"):
            return
        for prefix, feature in (("<=", "lookbehind"), ("<!", "negative lookbehind"),
                                (">", "atomic groups"), ("(", "conditional groups")):
            if self.src.startswith(prefix, self.i):
                raise self.error(f"{feature} (?{prefix}...) is not supported", start)
        if self.ecma:
            if self.eat("<"):
                self.group_name(">", start)
                return
            raise self.error("invalid group syntax (?" + self.peek() + ")", start)
        if self.eat("P<"):
            self.group_name(">", start)
            return
        if self.eat("P="):
            raise self.error("backreferences (?P=name) are not supported", start)
        if self.eat("#"):
            end = self.src.find(")", self.i)
            if end < 0:
                raise self.error("missing ), unterminated comment", start)
            self.i = end  # the caller parses an empty group and eats ")"
            return
        j = self.i
        while j < len(self.src) and self.src[j] in _PY_FLAG_LETTERS:
            j += 1
        on = self.src[self.i:j]
        off = ""
        if j < len(self.src) and self.src[j] == "-":
            k = j + 1
            while k < len(self.src) and self.src[k] in _PY_FLAG_LETTERS:
                k += 1
            off, j = self.src[j + 1:k], k
            if not off:
                raise self.error("missing flag after '-'", j)
        if (on or off) and j < len(self.src) and self.src[j] == ":":
            self.flags = self.apply_flags(on, off, start)
            self.i = j + 1
            return
        if on and j < len(self.src) and self.src[j] == ")":
            raise self.error("global flags not at the start of the expression", start)
        raise self.error(f"unknown extension ?{self.peek()}", start)

    def group_name(self, close: str, start: int) -> None:
        end = self.src.find(close, self.i)
        if end < 0:
            raise self.error("missing >, unterminated name", self.i)
        name = self.src[self.i:end]
        if not name.isidentifier():
            raise self.error(f"bad character in group name {name!r}", self.i)
        if name in self.names and not self.ecma:
            raise self.error(f"redefinition of group name {name!r}", self.i)
        self.names.add(name)
        self.i = end + 1

    # --- escapes -------------------------------------------------------------------------------
    def escape(self, start: int) -> Ast:
        """An escape outside a class: an anchor, a class escape, or one character."""
        ch = self.peek()
        if ch in ("b", "B") and ch:
            raise self.error(f"word boundary \\{ch} is not supported", start)
        if not self.ecma and ch in ("A", "Z") and ch:
            self.i += 1
            return Anchor("start" if ch == "A" else "end", "strict", "\\" + ch, start)
        if ch.isdigit() and ch != "0" and ch.isascii():
            if not self.ecma and all(c in _OCT for c in self.src[self.i:self.i + 3]) \
                    and len(self.src) >= self.i + 3:
                return self.chars([self.octal(start)] * 2)
            raise self.error(f"backreferences (\\{ch}) are not supported", start)
        if self.ecma and ch == "k":
            raise self.error("backreferences (\\k<name>) are not supported", start)
        ranges, folds = self.class_escape(start, in_class=False)
        return self.chars(ranges, fold=folds)

    def octal(self, start: int) -> tuple[int, int]:
        digits = ""
        while len(digits) < 3 and self.peek() in _OCT and self.peek():
            digits += self.take()
        value = int(digits, 8)
        if value > 0o377:
            raise self.error(f"octal escape value \\{digits} outside of range 0-0o377", start)
        return value, value

    def class_escape(self, start: int, in_class: bool) -> tuple[Ranges, bool]:
        """The ranges of an escape usable inside a class, and whether ``(?i)`` folds them."""
        ch = self.take()
        if ch in "dDwWsS":
            ranges = ecma_class(ch) if self.ecma else python_class(ch, self.flags.ascii)
            return ranges, False
        if in_class and ch == "b":
            return [(8, 8)], True
        if self.ecma:
            cp = self.ecma_char_escape(ch, start)
        else:
            cp = self.python_char_escape(ch, start)
        if isinstance(cp, list):
            return cp, False  # \p{..}: a set, not one character
        return [(cp, cp)], True

    def python_char_escape(self, ch: str, start: int) -> int:
        if ch in _PY_ESCAPES:
            return _PY_ESCAPES[ch]
        if ch == "x":
            return self.hex_digits(2, start)
        if ch == "u":
            return self.hex_digits(4, start)
        if ch == "U":
            value = self.hex_digits(8, start)
            if value > MAX_CODE_POINT:
                raise self.error(f"bad escape \\U{value:08x}", start)
            return value
        if ch == "N":
            if not self.eat("{"):
                raise self.error("missing {", self.i)
            end = self.src.find("}", self.i)
            if end < 0:
                raise self.error("missing }, unterminated name", self.i)
            name = self.src[self.i:end]
            try:
                value = ord(unicodedata.lookup(name))
            except KeyError:
                raise self.error(f"undefined character name {name!r}", start) from None
            self.i = end + 1
            return value
        if ch in _OCT:
            self.i -= 1
            return self.octal(start)[0]
        if ch.isascii() and ch.isalnum():
            raise self.error(f"bad escape \\{ch}", start)
        return ord(ch)

    def ecma_char_escape(self, ch: str, start: int) -> int | Ranges:
        if ch in _ECMA_ESCAPES:
            return _ECMA_ESCAPES[ch]
        if ch == "c":
            letter = self.peek()
            if letter.isascii() and letter.isalpha():
                self.i += 1
                return ord(letter) % 32
            raise self.error("\\c must be followed by an ASCII letter", start)
        if ch == "0":
            if self.peek().isdigit():
                raise self.error("legacy octal escapes are not supported", start)
            return 0
        if ch == "x":
            return self.hex_digits(2, start)
        if ch == "u":
            if self.eat("{"):
                end = self.src.find("}", self.i)
                digits = self.src[self.i:end] if end >= 0 else ""
                if not digits or not set(digits) <= _HEX or int(digits, 16) > MAX_CODE_POINT:
                    raise self.error("invalid Unicode escape \\u{...}", start)
                self.i = end + 1
                return int(digits, 16)
            value = self.hex_digits(4, start)
            # A surrogate pair written as two \u escapes is one code point (u-mode semantics).
            if 0xD800 <= value <= 0xDBFF and self.src.startswith("\\u", self.i):
                save = self.i
                self.i += 2
                if all(c in _HEX for c in self.src[self.i:self.i + 4]) and len(self.src) >= self.i + 4:
                    low = int(self.src[self.i:self.i + 4], 16)
                    if 0xDC00 <= low <= 0xDFFF:
                        self.i += 4
                        return 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                self.i = save
            return value
        if ch in ("p", "P"):
            if not self.eat("{"):
                raise self.error(f"\\{ch} must be followed by {{property}}", start)
            end = self.src.find("}", self.i)
            if end < 0:
                raise self.error("missing }, unterminated property", start)
            try:
                ranges = general_category(self.src[self.i:end])
            except UnknownProperty as exc:
                raise self.error(str(exc), start) from None
            self.i = end + 1
            return negate(ranges) if ch == "P" else ranges
        if ch.isascii() and ch.isalnum():
            raise self.error(f"unknown escape \\{ch}", start)
        return ord(ch)

    def hex_digits(self, count: int, start: int) -> int:
        digits = self.src[self.i:self.i + count]
        if len(digits) != count or not set(digits) <= _HEX:
            raise self.error(f"incomplete escape \\{self.src[start + 1]}{digits}", start)
        self.i += count
        return int(digits, 16)

    # --- character classes ---------------------------------------------------------------------
    def char_class(self, start: int) -> Chars:
        negated = self.eat("^")
        # Single characters and ranges fold under (?i); class escapes match as they are
        # (``re`` folds only a class's literal members; \w, \d, \s are case-invariant).
        folded: Ranges = []
        plain: Ranges = []
        first = True
        while True:
            if self.i >= len(self.src):
                raise self.error("unterminated character set", start)
            if self.peek() == "]" and not (first and not self.ecma):
                self.i += 1
                break
            first = False
            lo_pos = self.i
            lo, lo_folds = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                hi, hi_folds = self.class_atom()
                if lo_folds and hi_folds:
                    if lo[0][0] > hi[0][0]:
                        raise self.error(f"bad character range {self.src[lo_pos:self.i]}", lo_pos)
                    folded.append((lo[0][0], hi[0][0]))
                    continue
                if not self.ecma:
                    raise self.error(f"bad character range {self.src[lo_pos:self.i]}", lo_pos)
                # Annex B: a class escape next to '-' makes the '-' a literal.
                plain += lo + [(0x2D, 0x2D)] + hi
                continue
            (folded if lo_folds else plain).extend(lo)
        ranges = normalize(self.chars(folded).ranges + tuple(plain))
        return Chars(tuple(negate(ranges) if negated else ranges))

    def class_atom(self) -> tuple[Ranges, bool]:
        """One class member: a single character (folds=True) or a set escape (folds=False)."""
        start = self.i
        ch = self.take()
        if ch != "\\":
            return [(ord(ch), ord(ch))], True
        nxt = self.peek()
        if self.ecma:
            if nxt == "-":
                self.i += 1
                return [(0x2D, 0x2D)], True
            if nxt == "B" or (nxt.isdigit() and nxt != "0"):
                raise self.error(f"escape \\{nxt} is not supported in a character class", start)
        return self.class_escape(start, in_class=True)
