"""Front end + vocabulary -> ``CompiledGrammar``, with a cache keyed by (constraint, vocabulary, options)."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from constrain.automaton import TokenAutomaton
from constrain.budget import DEFAULT_MAX_STATES, CompileBudget
from constrain.derivatives import ExprTable
from constrain.grammars import ir
from constrain.grammars.errors import GrammarError
from constrain.matcher import Matcher

log = logging.getLogger("constrain")

# Compiled grammars kept for reuse; each holds its own state and mask caches (megabytes).
CACHE_SIZE = 32


class CompiledGrammar:
    """A constraint bound to a vocabulary: shared, thread-safe, lazily extended.

    Create per-request ``Matcher`` objects with ``matcher()``. The state-level methods are what
    the GPU state table and the engine use: states are integers, masks are int32 word arrays.
    """

    def __init__(self, grammar: ir.Grammar, vocab, *, max_states: int = DEFAULT_MAX_STATES) -> None:
        if not tuple(vocab.eos_token_ids):
            raise GrammarError(
                "vocabulary has no stop (EOS) token: a constrained sequence could never end; "
                "pass eos_token_ids when building the Vocabulary"
            )
        self.grammar = grammar
        self.vocab = vocab
        self._automaton = TokenAutomaton(ExprTable(grammar, budget=CompileBudget(max_states=max_states)), vocab)
        start = self.initial_state
        if not self._automaton.table.row(start).any() and not self.is_accepting(start):
            raise GrammarError("constraint is unsatisfiable: no document satisfies it")

    @property
    def notes(self) -> tuple[str, ...]:
        """What the front end relaxed or wants the user to know (lenient mode)."""
        return self.grammar.notes

    @property
    def initial_state(self) -> int:
        return self._automaton.initial_state

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the document."""
        return Matcher(self._automaton)

    def state_mask(self, state: int) -> np.ndarray:
        """Bitmask words (int32, ``ceil(vocab_size/32)``) of the tokens allowed in ``state``."""
        return self._automaton.mask(state)

    def state_transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """Allowed non-stop tokens of ``state`` and their next states (for GPU state tables)."""
        return self._automaton.transitions(state)

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token``, or -1 if it is not allowed (stop tokens excluded)."""
        return self._automaton.next_state(state, token)

    def is_accepting(self, state: int) -> bool:
        """Whether the document may end in ``state``."""
        return self._automaton.is_accepting(state)

    @property
    def num_states(self) -> int:
        """Automaton states created so far (grows lazily)."""
        return len(self._automaton.table)


_cache: OrderedDict[tuple, CompiledGrammar] = OrderedDict()
_cache_lock = threading.Lock()


def _cached(key: tuple, build: Callable[[], CompiledGrammar]) -> CompiledGrammar:
    with _cache_lock:
        got = _cache.get(key)
        if got is not None:
            _cache.move_to_end(key)
            return got
    compiled = build()
    with _cache_lock:
        _cache[key] = compiled
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def _options_key(options: dict[str, Any]) -> tuple:
    """Options as a hashable key: JSON-like values by content (a ``remote_schemas`` mapping),
    anything else (a resolver function) by identity."""
    def freeze(v: Any) -> object:
        if isinstance(v, (dict, list, tuple)):
            try:
                return json.dumps(v, sort_keys=True)
            except (TypeError, ValueError):
                return id(v)
        return v if isinstance(v, (str, int, float, bool, type(None))) else id(v)

    return tuple(sorted((k, freeze(v)) for k, v in options.items()))


def _vocab_key(vocab) -> object:
    return getattr(vocab, "fingerprint", None) or id(vocab)


def compile_grammar(grammar: ir.Grammar, vocab, *, max_states: int = DEFAULT_MAX_STATES) -> CompiledGrammar:
    """Bind an IR grammar to a vocabulary."""
    return CompiledGrammar(grammar, vocab, max_states=max_states)


def compile_json_schema(schema: dict | bool | str, vocab, **options: Any) -> CompiledGrammar:
    """Compile a JSON Schema (dict, bool or JSON text). Options go to the JSON Schema front end.

    Raises ``grammars.errors.SchemaError`` naming the keyword and JSON pointer of anything that
    cannot be enforced.
    """
    from constrain.grammars.json_schema import json_schema_to_grammar

    text = schema if isinstance(schema, str) else json.dumps(schema)  # key order matters (property_order="declared")
    key = ("json_schema", text, _vocab_key(vocab), _options_key(options))
    return _cached(key, lambda: compile_grammar(json_schema_to_grammar(schema, **options), vocab))


def compile_regex(pattern: str, vocab) -> CompiledGrammar:
    """Compile a regular expression (Python ``re`` syntax subset) that must match the whole output."""
    from constrain.grammars.regex import regex_to_ir

    key = ("regex", pattern, _vocab_key(vocab))
    return _cached(key, lambda: compile_grammar(ir.Grammar.of(regex_to_ir(pattern)), vocab))


def compile_lark(text: str, vocab, start: str = "start") -> CompiledGrammar:
    """Compile a Lark grammar."""
    from constrain.grammars.lark_frontend import lark_to_grammar

    key = ("lark", text, start, _vocab_key(vocab))
    return _cached(key, lambda: compile_grammar(lark_to_grammar(text, start=start), vocab))
