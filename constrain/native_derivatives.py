"""The expression table in C++ (``constrain._core.ExprCore``), behind the ``ExprTable`` interface.

``constrain.derivatives.ExprTable`` is the reference twin: the same expressions, derivatives,
lengths and liveness searches, in Python. The C++ table reads the IR objects into flat arrays (one
pass in C++, per compile), measures the rules' lengths there (the twin's ``measure_rules``) and
converts rule bodies lazily, as the twin does; the walks of ``constrain._core.PackedTrie`` read and
fill its rows directly, with no Python in between. What stays in Python: structure signatures
(they intern into the compiler context's ``Signatures``) and the work lock.
"""

from __future__ import annotations

import threading

from constrain.budget import DEFAULT_BUDGET, CompileBudget
from constrain.cache import Signatures
from constrain.derivatives import structure_signature
from constrain.grammars import ir
from constrain.grammars.analysis import INFINITE, MAX_NESTING, MAX_REPEAT
from constrain.grammars.errors import GrammarError

try:
    from constrain import _core
except ImportError:  # the core is not built: the Python table is used (see ``available``)
    _core = None  # type: ignore[assignment]

__all__ = ["NativeExprTable", "available"]

# The IR node classes in the order of cpp/derivatives.hpp's IrKind.
_IR_CLASSES = (ir.Bytes, ir.Seq, ir.Alt, ir.And, ir.Not, ir.Repeat, ir.Ref, ir.Unordered)


def available() -> bool:
    """Whether the C++ table is built."""
    return _core is not None


class NativeExprTable(_core.ExprCore if _core is not None else object):  # type: ignore[misc]
    """``ExprTable``'s interface over the C++ table; safe to share between threads."""

    def __init__(self, grammar: ir.Grammar, *, budget: CompileBudget = DEFAULT_BUDGET,
                 signatures: Signatures | None = None) -> None:
        if _core is None:
            raise RuntimeError("constrain._core is not built: use constrain.derivatives.ExprTable")
        if grammar.start not in grammar.rules:
            raise GrammarError(f"grammar has no start rule {grammar.start!r}")
        names = list(grammar.rules)
        start = names.index(grammar.start)
        super().__init__(list(grammar.rules.values()), {n: i for i, n in enumerate(names)}, _IR_CLASSES,
                         float(budget.seconds), float(budget.max_bytes), int(budget.max_states), MAX_NESTING, MAX_REPEAT)
        self.lock = threading.RLock()
        self.signatures = Signatures() if signatures is None else signatures
        self._sigs: dict[int, int | None] = {}
        with self.work():
            lower = self.measure_rules(names)
            self.start = self.ref(start)
        self.empty_by_structure = lower[start] == INFINITE

    def work(self) -> _Work:
        """One unit of compilation work holding the lock; ``CompileBudget.seconds`` bounds it.
        Reentrant: the outermost unit sets the deadline (kept by the C++ table)."""
        return _Work(self)

    def signature(self, e: int) -> int | None:
        """An id of ``e``'s structure, equal across the grammars sharing ``self.signatures``."""
        return structure_signature(self, e, self._sigs)


class _Work:
    """``NativeExprTable.work()``. A class rather than a generator context manager: a quarter of
    the cost (~0.3 against ~1.5 µs), and every new state's mask enters it two to four times."""

    __slots__ = ("_table",)

    def __init__(self, table: NativeExprTable) -> None:
        self._table = table

    def __enter__(self) -> None:
        table = self._table
        table.lock.acquire()
        try:
            table._begin_work()
        except BaseException:
            table.lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        table = self._table
        try:
            table._end_work()
        finally:
            table.lock.release()
