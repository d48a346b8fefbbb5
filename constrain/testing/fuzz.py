"""Random constraints and the four properties every one must keep, for ``tests/test_fuzz.py`` (bounded,
under hypothesis) and ``bench/fuzz.py`` (hours, seeded): the generators and checks live here once.

Cases are regexes over a small alphabet (checked exhaustively against ``re`` on every short string),
Lark grammars (checked against lark's own Earley parser) and mutations of real JSON Schemas (checked
by ``jsonschema``). Every case is compiled under a ``CompileBudget`` and walked at random, following
the mask; a finished document must satisfy the oracle. The properties:

- ``crash``: compiling raised something other than a ``GrammarError``, or a verb raised at all;
- ``hang``: the case outlived its watchdog, well past its compile budget;
- ``unsound``: a document (or a short string) the matcher accepts and the oracle rejects (lark parses
  with ``lexer="dynamic_complete"``: every tokenization, the grammar as a CFG over its terminals);
- ``disagree``: a token the mask allows that ``accept_token`` on a ``fork()`` refuses, or the reverse.

Also counted: ``dead_end`` (a compiled constraint with no way to finish: an empty mask before the
end, or a budget-aware close that leaves nothing) and ``incomplete`` (a short string the oracle
accepts and the matcher refuses: completeness, not soundness).

Not failures, counted in ``NOTES``: ``budget`` (a verb that stopped with ``BudgetExceededError``, the
compile budget bounding lazy growth at decode time, within the budget's time: a clear refusal; one
that came late, see ``Refused``, is a ``hang``) and ``no_oracle`` (the oracle itself raised on
the constraint or a document, e.g. ``jsonschema`` on a schema its metaschema forbids: nothing to
judge by). JSON numbers reach ``jsonschema`` as ``ExactNumber``: JSON Schema compares the decimal
values written, and float64 would make ``6392170690045133614395.2`` an integer.
"""

from __future__ import annotations

import contextlib
import decimal
import fractions
import itertools
import json
import random
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lark
import numpy as np

import constrain
from constrain.budget import BudgetExceededError, CompileBudget
from constrain.grammars.errors import GrammarError
from constrain.testing.corpus import DEFAULT_DATA, JSB_SUBSETS, load_cases, suite_files
from constrain.testing.schema_check import oracle

PROPERTIES = ("crash", "hang", "unsound", "disagree", "dead_end", "incomplete")
NOTES = ("budget", "no_oracle")      # counted, not failures (see the module docstring)
KINDS = ("regex", "lark", "schema")
ALPHABET = "abc"
EXHAUSTIVE_LENGTH = 4          # every string over ALPHABET up to this length is checked
WALKS_PER_CASE = 2
MAX_EXTRA_TOKENS = 40          # a walk's token budget: the shortest completion plus up to this many
MAX_CHECKED_TOKENS = 400       # mask tokens checked by accept_token per step on a large vocabulary
P_STOP = 0.3                   # a walk stops where it may with this probability
MAX_SCHEMA_CHARS = 3000        # corpus schemas larger than this are not mutated (speed)
FUZZ_BUDGET = CompileBudget(seconds=5.0, max_bytes=1 << 30)
WATCHDOG_S = 60.0              # a case (compile, walks, checks) past this much CPU time is a hang


@dataclass
class FuzzCase:
    kind: str                  # "regex" | "lark" | "schema"
    source: Any                # the pattern, the grammar text or the schema

    def describe(self) -> str:
        return self.source if isinstance(self.source, str) else json.dumps(self.source)


@dataclass
class Failure:
    prop: str                  # one of PROPERTIES
    case: FuzzCase
    detail: str
    tokens: list[int] = field(default_factory=list)   # the walk up to the failure, when there is one

    def to_json(self) -> dict[str, Any]:
        return {"property": self.prop, "kind": self.case.kind, "source": self.case.source,
                "detail": self.detail, "tokens": self.tokens}


# ----------------------------------------------------------------------------------- generators

_ATOMS = ("a", "b", "c", ".", "[ab]", "[^a]", "[b-c]", "(?:)")
_QUANTIFIERS = ("*", "+", "?", "{2}", "{1,3}", "{0,2}", "*?", "{2,}")


def random_regex(rng: random.Random, depth: int = 3) -> str:
    """A random regex AST over ALPHABET, written in Python syntax (lookaheads included)."""
    r = rng.random()
    if depth <= 0 or r < 0.25:
        return rng.choice(_ATOMS)
    if r < 0.5:
        return "".join(random_regex(rng, depth - 1) for _ in range(rng.randint(2, 3)))
    if r < 0.65:
        return "(?:" + "|".join(random_regex(rng, depth - 1) for _ in range(rng.randint(2, 3))) + ")"
    if r < 0.9:
        return "(?:" + random_regex(rng, depth - 1) + ")" + rng.choice(_QUANTIFIERS)
    look = rng.choice(("(?=", "(?!"))
    return look + random_regex(rng, depth - 1) + ")" + random_regex(rng, depth - 1)


def random_lark(rng: random.Random) -> str:
    """A random Lark grammar over ALPHABET: a few rules, literals, one regex terminal, EBNF operators."""
    rules = ["start"] + [f"r{i}" for i in range(rng.randint(0, 3))]

    def item(depth: int) -> str:
        r = rng.random()
        if r < 0.35:
            text = rng.choice(('"a"', '"b"', '"c"', '"ab"', '"ca"'))
        elif r < 0.5:
            text = "T"
        elif r < 0.75 and len(rules) > 1:
            text = rng.choice(rules[1:])
        elif depth > 0:
            text = "(" + " | ".join(sequence(depth - 1) for _ in range(rng.randint(1, 2))) + ")"
        else:
            text = '"b"'
        return text + (rng.choice(("?", "*", "+")) if rng.random() < 0.3 else "")

    def sequence(depth: int) -> str:
        return " ".join(item(depth) for _ in range(rng.randint(1, 3)))

    lines = [f"{name}: " + " | ".join(sequence(1) for _ in range(rng.randint(1, 3))) for name in rules]
    lines.append("T: " + rng.choice(("/[ab]+/", "/c[ab]?/", '"cc"', "/a{1,2}/")))
    if rng.random() < 0.2:
        lines.append('%ignore " "')
    return "\n".join(lines) + "\n"


_KEYWORD_VALUES: dict[str, Callable[[random.Random], Any]] = {
    "type": lambda r: r.choice(("string", "integer", "number", "boolean", "null", "object", "array", ["string", "null"])),
    "minLength": lambda r: r.randint(0, 5), "maxLength": lambda r: r.randint(0, 8),
    "pattern": lambda r: r.choice(("^a", "b$", "^[ab]*$", "x", "^.{2,4}$")),
    "format": lambda r: r.choice(("date", "email", "uuid", "date-time", "ipv4", "time")),
    "minimum": lambda r: r.randint(-5, 5), "maximum": lambda r: r.randint(-5, 50),
    "exclusiveMinimum": lambda r: r.randint(-5, 5), "multipleOf": lambda r: r.choice((1, 2, 3, 0.5)),
    "enum": lambda r: r.sample(["a", 1, None, True, "b", 2.5, [1], {"k": 1}], r.randint(1, 3)),
    "const": lambda r: r.choice(("a", 1, None, False, {"k": "v"})),
    "minItems": lambda r: r.randint(0, 3), "maxItems": lambda r: r.randint(0, 4), "uniqueItems": lambda r: True,
    "minProperties": lambda r: r.randint(0, 3), "maxProperties": lambda r: r.randint(0, 3),
    "required": lambda r: r.sample(["a", "b", "id", "name"], r.randint(1, 2)),
    "additionalProperties": lambda r: r.choice((False, {"type": "integer"}, True)),
    "properties": lambda r: {r.choice(("a", "id")): {"type": r.choice(("string", "integer"))}},
    "patternProperties": lambda r: {"^x": {"type": "integer"}},
    "items": lambda r: r.choice(({"type": "string"}, {"type": "integer", "maximum": 3}, False)),
    "prefixItems": lambda r: [{"const": 1}],
    "not": lambda r: r.choice(({"type": "null"}, {"const": 1}, {"maxProperties": 1})),
}


def _subschemas(node: Any) -> Iterator[dict[str, Any]]:
    """Every object node of a schema, the root first."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _subschemas(v)
    elif isinstance(node, list):
        for v in node:
            yield from _subschemas(v)


def mutate_schema(rng: random.Random, schema: Any, pool: list[Any], steps: int = 3) -> Any:
    """``schema`` (a copy) with keywords dropped, added or changed, nested and combined with ``pool``'s."""
    root = json.loads(json.dumps(schema))
    if not isinstance(root, dict):
        root = {}
    for _ in range(steps):
        node = rng.choice(list(_subschemas(root)))
        op = rng.choice(("drop", "add", "add", "change", "nest", "combine"))
        if op == "drop" and node:
            del node[rng.choice(sorted(node))]
        elif op in ("add", "change"):
            key = rng.choice(sorted(node)) if op == "change" and node else rng.choice(sorted(_KEYWORD_VALUES))
            node[key] = _KEYWORD_VALUES[key](rng) if key in _KEYWORD_VALUES else _change(rng, node[key])
        elif op == "nest":
            inner = dict(node)
            node.clear()
            node.update(rng.choice(({"type": "array", "items": inner, "minItems": 1},
                                    {"type": "object", "properties": {"k": inner}, "required": ["k"]})))
        elif op == "combine":
            other = rng.choice(list(_subschemas(rng.choice(pool)))) if pool else {"type": "string"}
            inner = dict(node)
            node.clear()
            node[rng.choice(("anyOf", "oneOf", "allOf"))] = [inner, json.loads(json.dumps(other))]
    return root


def _change(rng: random.Random, value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + rng.choice((-2, -1, 1, 3))
    if isinstance(value, str):
        return rng.choice(("", value + "x", "a"))
    if isinstance(value, list):
        return value[: rng.randint(0, len(value))]
    return value


def generate(kind: str, rng: random.Random, pool: list[Any]) -> FuzzCase:
    if kind == "regex":
        return FuzzCase(kind, random_regex(rng))
    if kind == "lark":
        return FuzzCase(kind, random_lark(rng))
    return FuzzCase(kind, mutate_schema(rng, rng.choice(pool), pool, rng.randint(1, 4)))


def schema_pool(data_dir: Path = DEFAULT_DATA) -> list[Any]:
    """The schemas of the corpus's dev half (JSONSchemaBench and the test suite) small enough to mutate."""
    cases = load_cases(data_dir, list(JSB_SUBSETS), "dev") + load_cases(data_dir, suite_files(data_dir), "dev")
    return [c.schema for c in cases if isinstance(c.schema, dict) and len(json.dumps(c.schema)) <= MAX_SCHEMA_CHARS]


def byte_vocabulary() -> constrain.Vocabulary:
    """256 single-byte tokens and a stop token (id 256): every token of every mask can be checked."""
    return constrain.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None], eos_token_ids=[256])


# ----------------------------------------------------------------------------------- checks


class Hang(Exception):
    pass


class NoOracle(Exception):
    """The oracle cannot judge: it raised on the constraint or on a document."""


class Refused(Exception):
    """A verb stopped with ``BudgetExceededError`` (``late``: long past the budget, see ``__init__``)."""

    def __init__(self, error: BudgetExceededError, seconds: float, cpu_seconds: float) -> None:
        super().__init__(str(error))
        self.seconds = seconds
        # Late: past twice the budget and a second, in wall time and (so that a machine loaded
        # by others does not count) in CPU time past the budget and a second.
        self.late = seconds > 2 * FUZZ_BUDGET.seconds + 1.0 and cpu_seconds > FUZZ_BUDGET.seconds + 1.0


def _verb(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a ``BudgetExceededError`` turned into ``Refused`` with its time."""
    t0, c0 = time.monotonic(), time.process_time()
    try:
        return fn(*args, **kwargs)
    except BudgetExceededError as exc:
        raise Refused(exc, time.monotonic() - t0, time.process_time() - c0) from exc


MAX_EXPONENT = 5000  # a number literal with a larger exponent is not judged (exact arithmetic would explode)


def _exact(x: Any) -> fractions.Fraction | None:
    """The exact value of a JSON Schema number: a float is read as the decimal it was written as."""
    if isinstance(x, ExactNumber):
        return x.exact
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if isinstance(x, float):
        return fractions.Fraction(repr(x)) if x == x and abs(x) != float("inf") else None
    return fractions.Fraction(x)


class ExactNumber(float):
    """A JSON number literal with a fraction or an exponent: a float to ``jsonschema`` (so every
    keyword treats it as a number), but compared, divided and tested for integrality by its exact
    decimal value, as JSON Schema reads it (``6392170690045133614395.2`` is no integer, though
    float64 rounds it to one)."""

    exact: fractions.Fraction

    def __new__(cls, text: str) -> ExactNumber:
        written = re.search(r"[eE][+-]?0*(\d*)", text)  # before Decimal, which refuses exponents past 10**18
        if written and len(written.group(1)) > len(str(MAX_EXPONENT)):
            raise NoOracle(f"number {text[:40]} is beyond exact judging")
        value = decimal.Decimal(text)
        exponent = value.as_tuple().exponent
        if not isinstance(exponent, int) or abs(exponent) + len(text) > MAX_EXPONENT:
            raise NoOracle(f"number {text[:40]} is beyond exact judging")
        self = super().__new__(cls, float(text))
        self.exact = fractions.Fraction(value)
        return self

    def is_integer(self) -> bool:
        return self.exact.denominator == 1

    def _cmp(self, other: Any, op: Callable[[Any, Any], bool]) -> Any:
        theirs = _exact(other)
        if theirs is None:
            return op(float(self), other) if isinstance(other, float) else NotImplemented
        return op(self.exact, theirs)

    def __eq__(self, other: Any) -> Any:
        return self._cmp(other, lambda a, b: a == b)

    def __ne__(self, other: Any) -> Any:
        return self._cmp(other, lambda a, b: a != b)

    def __lt__(self, other: Any) -> Any:
        return self._cmp(other, lambda a, b: a < b)

    def __le__(self, other: Any) -> Any:
        return self._cmp(other, lambda a, b: a <= b)

    def __gt__(self, other: Any) -> Any:
        return self._cmp(other, lambda a, b: a > b)

    def __ge__(self, other: Any) -> Any:
        return self._cmp(other, lambda a, b: a >= b)

    def __hash__(self) -> int:
        return hash(self.exact)

    def __truediv__(self, other: Any) -> Any:   # multipleOf with a float divisor
        theirs = _exact(other)
        return self.exact / theirs if theirs else float(self) / other

    def __mod__(self, other: Any) -> Any:       # multipleOf with an integer divisor
        theirs = _exact(other)
        return self.exact % theirs if theirs else float(self) % other


def parse_json(data: bytes) -> Any:
    """A document as ``jsonschema`` should see it: numbers with a fraction or exponent exact."""
    return json.loads(data, parse_float=ExactNumber)


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in the main thread after ``seconds`` of this process's CPU time (SIGPROF):
    a loaded machine slows a case down without making it a hang. A worker stuck without using
    CPU is caught by ``bench/fuzz.py``'s wall-clock margin instead."""
    def fire(signum: int, frame: Any) -> None:
        raise Hang()

    old = signal.signal(signal.SIGPROF, fire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def check_case(case: FuzzCase, vocab: constrain.Vocabulary, rng: random.Random,
               watchdog_s: float = WATCHDOG_S) -> list[Failure]:
    """Every property violation ``case`` shows: compile, exhaustive short strings, random walks."""
    failures: list[Failure] = []
    try:
        with watchdog(watchdog_s):
            _check(case, vocab, rng, failures)
    except Hang:
        failures.append(Failure("hang", case, f"still running after {watchdog_s:g} s of CPU time (compile budget {FUZZ_BUDGET})"))
    except Refused as exc:  # the budget bounding lazy growth: a clear error, if it came in time
        if exc.late:
            failures.append(Failure("hang", case, f"BudgetExceededError only after {exc.seconds:.1f} s "
                                    f"(budget {FUZZ_BUDGET.seconds:g} s): {exc}"[:500]))
        else:
            failures.append(Failure("budget", case, f"after {exc.seconds:.1f} s: {exc}"[:500]))
    except NoOracle as exc:
        failures.append(Failure("no_oracle", case, str(exc)[:500]))
    except Exception as exc:  # a verb that raised: a bug
        failures.append(Failure("crash", case, f"{type(exc).__name__}: {exc}"[:500]))
    return failures


def _check(case: FuzzCase, vocab: constrain.Vocabulary, rng: random.Random, failures: list[Failure]) -> None:
    accepts = _oracle(case)
    t0, c0 = time.monotonic(), time.process_time()
    try:
        compiled = _compile(case, vocab)
    except GrammarError as exc:  # a clear refusal is allowed, a budget one only in time
        if isinstance(exc, BudgetExceededError):
            raise Refused(exc, time.monotonic() - t0, time.process_time() - c0) from exc
        return
    except Exception as exc:
        failures.append(Failure("crash", case, f"compile raised {type(exc).__name__}: {exc}"[:500]))
        return
    if accepts is None:
        return  # the oracle itself refuses the constraint: only the compile is checked (no crash)
    if case.kind != "schema":
        _check_short_strings(case, compiled, accepts, failures)
    for _ in range(WALKS_PER_CASE):
        _walk(case, compiled, accepts, rng, failures)


def _compile(case: FuzzCase, vocab: constrain.Vocabulary) -> constrain.CompiledGrammar:
    if case.kind == "regex":
        return constrain.compile_regex(case.source, vocab, budget=FUZZ_BUDGET)
    if case.kind == "lark":
        return constrain.compile_lark(case.source, vocab, budget=FUZZ_BUDGET)
    return constrain.compile_json_schema(case.source, vocab, budget=FUZZ_BUDGET)


def _oracle(case: FuzzCase) -> Callable[[bytes], bool] | None:
    """bytes -> does the constraint's own reference (re, lark, jsonschema) accept them; None if it cannot judge."""
    if case.kind == "regex":
        try:
            pattern = re.compile(case.source)
        except re.error:
            return None
        return lambda data: _text(data) is not None and pattern.fullmatch(_text(data) or "") is not None
    if case.kind == "lark":
        try:
            parser = lark.Lark(case.source, start="start", lexer="dynamic_complete")
        except Exception:
            return None

        def parses(data: bytes) -> bool:
            text = _text(data)
            try:
                return text is not None and parser.parse(text) is not None
            except lark.exceptions.LarkError:
                return False
            except Exception as exc:  # lark's own failure (RecursionError on a deep parse): no judge
                raise NoOracle(f"lark raised {type(exc).__name__}: {exc}") from exc

        return parses
    try:
        validator = oracle(case.source)
    except Exception:
        return None

    def valid(data: bytes) -> bool:
        try:
            document = parse_json(data)
        except ValueError:
            return False
        try:
            return bool(validator.is_valid(document))
        except RecursionError:
            raise NoOracle("jsonschema: RecursionError") from None
        except Exception as exc:  # jsonschema on a schema its metaschema forbids (`"items": false` in draft-04)
            raise NoOracle(f"jsonschema raised {type(exc).__name__}: {exc}") from exc

    return valid


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _check_short_strings(case: FuzzCase, compiled: constrain.CompiledGrammar, accepts: Callable[[bytes], bool],
                         failures: list[Failure]) -> None:
    """Every string over ALPHABET (and a space for ignored text) up to EXHAUSTIVE_LENGTH, both ways."""
    letters = ALPHABET + (" " if case.kind == "lark" else "")
    for n in range(EXHAUSTIVE_LENGTH + 1):
        for chars in itertools.product(letters, repeat=n):
            data = "".join(chars).encode()
            m = compiled.matcher()
            ours = _verb(m.accept_bytes, data) and _verb(m.is_accepting)
            theirs = accepts(data)
            if ours and not theirs:
                failures.append(Failure("unsound", case, f"accepts {data!r}, the oracle refuses it"))
                return
            if theirs and not ours:
                failures.append(Failure("incomplete", case, f"refuses {data!r}, the oracle accepts it"))
                return


def _walk(case: FuzzCase, compiled: constrain.CompiledGrammar, accepts: Callable[[bytes], bool],
          rng: random.Random, failures: list[Failure]) -> None:
    """Follow the budget-aware mask to a stop token; check each step's tokens and the finished document."""
    vocab = compiled.vocab
    eos = set(vocab.eos_token_ids)
    m = compiled.matcher()
    shortest = _verb(m.min_completion_bytes)
    if shortest == float("inf"):
        failures.append(Failure("dead_end", case, "compiled, but no document can be completed"))
        return
    budget = int(shortest) + 1 + rng.randint(0, MAX_EXTRA_TOKENS)
    bitmask = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    lengths = np.array([len(b or b"") for b in vocab.token_bytes])
    tokens: list[int] = []
    doc = b""
    while True:
        allowed = _verb(m.allowed_token_ids)
        if not len(allowed):
            failures.append(Failure("dead_end", case, f"empty mask after {doc!r}", tokens))
            return
        bad = _disagreement(m, allowed, lengths, rng)
        if bad is not None:
            failures.append(Failure("disagree", case, f"after {doc!r}: {bad}", tokens))
            return
        _verb(m.fill_next_token_bitmask, bitmask, 0, tokens_left=budget - len(tokens))
        close = _ids(bitmask[0].numpy(), len(vocab.token_bytes))
        if not np.isin(close, allowed, assume_unique=True).all():
            failures.append(Failure("disagree", case, f"after {doc!r}: the budget-aware mask allows tokens the "
                                    "full mask does not", tokens))
            return
        if not len(close):
            failures.append(Failure("dead_end", case, f"budget-aware close left no token after {doc!r} "
                                    f"({budget - len(tokens)} tokens left)", tokens))
            return
        listed = close.tolist()
        stops = [t for t in listed if t in eos]
        words = [t for t in listed if t not in eos]
        token = stops[0] if stops and (not words or rng.random() < P_STOP) else rng.choice(words)
        tokens.append(token)
        if not _verb(m.accept_token, token):
            failures.append(Failure("disagree", case, f"after {doc!r}: accept_token({token}) refused a mask token",
                                    tokens))
            return
        if token in eos:
            break
        doc += vocab.token_bytes[token] or b""
    try:
        valid = accepts(doc)
    except NoOracle as exc:  # this document (a huge exponent) or every one (jsonschema raising)
        failures.append(Failure("no_oracle", case, f"{exc}: {doc!r}"[:500], tokens))  # the reason first
        return
    if not valid:
        failures.append(Failure("unsound", case, f"finished document {doc!r} is refused by the oracle", tokens))


def _ids(words: np.ndarray, n_tokens: int) -> np.ndarray:
    """Token ids whose bit is set in one bitmask row (bit j of word i is token 32*i + j)."""
    bits = np.unpackbits(words.astype("<i4").view(np.uint8), bitorder="little")
    return np.flatnonzero(bits[:n_tokens])


def _disagreement(m: constrain.Matcher, allowed: np.ndarray, lengths: np.ndarray, rng: random.Random) -> str | None:
    """A token where the mask and ``accept_token`` on a fork disagree, or None.

    A small vocabulary is checked whole; a large one on a sample of the allowed tokens, their longest
    ones and as many random others.
    """
    n_tokens = len(lengths)
    in_mask = np.zeros(n_tokens, dtype=bool)
    in_mask[allowed] = True
    if n_tokens <= 1024:
        candidates = list(range(n_tokens))
    else:
        longest = allowed[np.argsort(lengths[allowed], kind="stable")[-16:]].tolist()
        sample = rng.sample(range(len(allowed)), min(len(allowed), MAX_CHECKED_TOKENS))
        candidates = allowed[sample].tolist() + longest + [rng.randrange(n_tokens) for _ in range(MAX_CHECKED_TOKENS)]
    for t in candidates:
        if _verb(m.fork().accept_token, t) != in_mask[t]:
            return f"token {t} is {'in' if in_mask[t] else 'not in'} the mask and accept_token says the opposite"
    return None

