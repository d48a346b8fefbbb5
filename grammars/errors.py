"""Errors raised by the front ends. Each names what was wrong and where, like pydantic-core's."""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint that cannot be compiled."""


#: Longest pattern quoted whole in a ``RegexError`` message (``.pattern`` always has all of it).
_QUOTED_PATTERN = 200


class RegexError(GrammarError):
    """A regular expression that is malformed or uses a feature we cannot enforce."""

    def __init__(self, message: str, pattern: str, position: int | None = None) -> None:
        where = f" at position {position}" if position is not None else ""
        quoted = repr(pattern) if len(pattern) <= _QUOTED_PATTERN else \
            f"{pattern[:_QUOTED_PATTERN]!r}... ({len(pattern)} characters)"
        super().__init__(f"{message}{where} in pattern {quoted}")
        self.pattern = pattern
        self.position = position


class SchemaError(GrammarError):
    """A JSON Schema that is malformed or uses a keyword we cannot enforce."""

    def __init__(self, message: str, pointer: str = "", keyword: str | None = None) -> None:
        where = f" at {pointer or '#'}" if pointer is not None else ""
        super().__init__(f"{message}{where}")
        self.pointer = pointer
        self.keyword = keyword


class UnsatisfiableError(GrammarError):
    """A well-formed constraint that no document satisfies (callers tell it apart by type, not text)."""


class UnsatisfiableSchemaError(SchemaError, UnsatisfiableError):
    """A JSON Schema that no document satisfies; ``pointer`` names the first unsatisfiable place found."""


class TimeLimitError(GrammarError):
    """A front end that ran past its time limit (at compile: ``CompileBudget.seconds``)."""

    def __init__(self, seconds: float, pointer: str) -> None:
        super().__init__(f"translating the schema took more than {seconds:g} s (stopped at {pointer or '#'})")
        self.seconds = seconds
        self.pointer = pointer


class LarkGrammarError(GrammarError):
    """A Lark grammar that is malformed or uses a feature we do not support."""

    def __init__(self, message: str, line: int | None = None) -> None:
        where = f" (grammar line {line})" if line is not None else ""
        super().__init__(f"{message}{where}")
        self.line = line
