"""The compile budget: how much time, memory and how many states one grammar may use.

A server compiles constraints it did not write; one bad schema must end in a clear error, never a
hang or an exhausted machine. The same budget bounds the lazy growth of a grammar at decode time
(new states met by a sequence, and their masks), since that is compilation work too.
"""

from __future__ import annotations

from dataclasses import dataclass

from constrain.grammars.errors import GrammarError

DEFAULT_MAX_STATES = 2_000_000


@dataclass(frozen=True)
class CompileBudget:
    """Limits on the work one compiled grammar may do, first compile and lazy growth together.

    ``seconds``: wall time spent translating a JSON Schema (its front end), and again spent
    creating states and rows; ``max_bytes``: an estimate of the
    grammar's own memory (expressions, transition rows, caches); ``max_states``: interned
    expressions (automaton states).
    """

    seconds: float = 10.0
    max_bytes: int = 2 << 30
    max_states: int = DEFAULT_MAX_STATES

    def __post_init__(self) -> None:
        for name in ("seconds", "max_bytes", "max_states"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"CompileBudget.{name} must be a positive number, got {value!r}")


class BudgetExceededError(GrammarError):
    """A constraint needed more than its ``CompileBudget`` allows.

    ``budget`` names the field that ran out (``"seconds"``, ``"max_bytes"``, ``"max_states"``).
    """

    def __init__(self, budget: str, limit: float, detail: str) -> None:
        super().__init__(
            f"constraint exceeds its compile budget: {detail} (CompileBudget.{budget}={limit:g}); "
            f"simplify the constraint or pass budget=CompileBudget({budget}=...) with a larger value"
        )
        self.budget = budget
        self.limit = limit


DEFAULT_BUDGET = CompileBudget()
