"""Front end + vocabulary -> ``CompiledGrammar``, through a ``GrammarCompiler`` context.

The context owns every cache that outlives one grammar (compiled grammars keyed by constraint,
vocabulary and options; each vocabulary's token trie; head walks shared between grammars; the
structure ids that let grammars share them) under one byte budget, as xgrammar's
``GrammarCompiler`` does. The module-level ``compile_*`` functions use a default context.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from constrain import native_derivatives
from constrain.arguments import check_index, check_instance, check_int
from constrain.automaton import TokenAutomaton
from constrain.budget import DEFAULT_BUDGET, BudgetExceededError, CompileBudget
from constrain.cache import ByteBudgetCache, Signatures
from constrain.derivatives import ExprTable
from constrain.grammars import ir
from constrain.grammars.errors import GrammarError, TimeLimitError, UnsatisfiableError
from constrain.matcher import TERMINATED, Matcher
from constrain.native_derivatives import NativeExprTable
from constrain.vocabulary import Vocabulary

# What a context keeps by default: a 131k-token trie is ~20 MB, a compiled grammar megabytes.
DEFAULT_CACHE_BYTES = 1 << 30
_SIGNATURES_KEY = ("signatures",)


class CompiledGrammar:
    """A constraint bound to a vocabulary: shared, thread-safe, lazily extended.

    Create per-request ``Matcher`` objects with ``matcher()``. The state-level methods are what
    the GPU state table and the engine use: states are integers, masks are int32 word arrays.
    Made by a ``GrammarCompiler`` (or the module-level ``compile_*``), whose caches it shares.
    """

    def __init__(self, grammar: ir.Grammar, vocab: Vocabulary, *, budget: CompileBudget,
                 shared: ByteBudgetCache, signatures: Signatures, native: bool | None = None) -> None:
        if not vocab.eos_token_ids:
            raise GrammarError(
                "vocabulary has no stop (EOS) token: a constrained sequence could never end; "
                "pass eos_token_ids when building the Vocabulary"
            )
        self._notes = grammar.notes  # (the grammar itself is not kept: the C++ table reads its IR whole and keeps none of it)
        self.vocab = vocab
        self.budget = budget
        if native is None:
            native = native_derivatives.available()
        table = (NativeExprTable if native else ExprTable)(grammar, budget=budget, signatures=signatures)
        self._automaton = TokenAutomaton(table, vocab, shared, native=None if native else False)
        start = self.initial_state
        if not table.row(start).any() and not self.is_accepting(start):
            if table.empty_by_structure and grammar.unsatisfiable is not None:
                raise grammar.unsatisfiable.with_traceback(None)  # the front end's account of why
            raise UnsatisfiableError("constraint is unsatisfiable: no document satisfies it")

    @property
    def notes(self) -> tuple[str, ...]:
        """What the front end relaxed or wants the user to know (lenient mode)."""
        return self._notes

    @property
    def initial_state(self) -> int:
        return self._automaton.initial_state

    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the document."""
        return Matcher(self._automaton)

    def state_mask(self, state: int) -> np.ndarray:
        """Bitmask words (int32, ``ceil(vocab_size/32)``) of the tokens allowed in ``state``."""
        return self._automaton.mask(self._check_state(state, "state_mask"))

    def state_transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """Allowed non-stop tokens of ``state`` and their next states (for GPU state tables)."""
        return self._automaton.transitions(self._check_state(state, "state_transitions"))

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token``, or -1 if it is not allowed (stop tokens excluded)."""
        s = self._check_state(state, "next_state")
        if type(token) is not int or not 0 <= token < self.vocab.vocab_size:
            token = check_index(token, "CompiledGrammar.next_state(token)", self.vocab.vocab_size,
                                f"the token ids of {self.vocab.name}")
        return self._automaton.next_state(s, token)

    def is_accepting(self, state: int) -> bool:
        """Whether the document may end in ``state``."""
        return self._automaton.is_accepting(self._check_state(state, "is_accepting"))

    def forced_bytes(self, state: int) -> bytes:
        """Bytes every document continues with from ``state`` (jump-forward text; empty where
        there is a choice or the document may end), what a matcher standing there reports."""
        if state == TERMINATED:
            return b""
        return self._automaton.forced_bytes(self._check_state(state, "forced_bytes"))

    @property
    def num_states(self) -> int:
        """Automaton states created so far (grows lazily)."""
        return len(self._automaton.table)

    def estimated_bytes(self) -> int:
        """A rough estimate of this grammar's memory (it grows as new states are met)."""
        return self._automaton.estimated_bytes()

    def _check_state(self, state: Any, verb: str) -> int:
        """``state`` if it names a state of this grammar; a ValueError naming it otherwise."""
        if type(state) is int and 0 <= state < len(self._automaton.table):
            return state
        name = f"CompiledGrammar.{verb}(state)"
        if check_int(state, name) == TERMINATED:
            raise ValueError(f"{name}={TERMINATED} is the state after a stop token: it has no mask or transitions")
        return check_index(state, name, len(self._automaton.table), "the states this grammar has created")


def _options_key(options: dict[str, Any]) -> tuple[Hashable, ...]:
    """Options as a hashable key: JSON-like values by content (a ``remote_schemas`` mapping),
    anything else (a resolver function) by identity."""
    def freeze(v: Any) -> Hashable:
        if isinstance(v, (dict, list, tuple)):
            try:
                return json.dumps(v, sort_keys=True)
            except (TypeError, ValueError):
                return id(v)
        return v if isinstance(v, (str, int, float, bool, type(None))) else id(v)

    return tuple(sorted((k, freeze(v)) for k, v in options.items()))


class GrammarCompiler:
    """Compiles constraints for vocabularies and owns the caches they share.

    ``max_cache_bytes`` bounds what the context keeps (compiled grammars, tries, shared walks);
    past it the least recently used entries go (what grammars grew while masks were filled, at
    the next compile). ``budget`` is the default ``CompileBudget`` of each compile (10 s, 2 GiB);
    every ``compile_*`` also takes its own. Grammars it compiled keep working after eviction or
    ``clear()``: the context only stops holding them. ``native``: the automaton's core, C++
    (``constrain._core``; None: where it is built) or, with False, its Python reference twin
    (``constrain.derivatives`` and the numpy trie walks).
    """

    def __init__(self, *, max_cache_bytes: int = DEFAULT_CACHE_BYTES, budget: CompileBudget | None = None,
                 native: bool | None = None) -> None:
        if isinstance(max_cache_bytes, bool) or not isinstance(max_cache_bytes, int) or max_cache_bytes < 0:
            raise ValueError(f"GrammarCompiler(max_cache_bytes) must be a non-negative int, got {max_cache_bytes!r}")
        if native is not None and not isinstance(native, bool):
            raise TypeError(f"GrammarCompiler(native) must be None, True or False, got {native!r}")
        if native and not native_derivatives.available():
            raise ValueError("GrammarCompiler(native=True): constrain._core is not built (pip install . builds it)")
        self.native = native
        self.budget = self._check_budget(budget, "GrammarCompiler(budget)", DEFAULT_BUDGET)
        self._cache = ByteBudgetCache(max_bytes=max_cache_bytes)

    @property
    def max_cache_bytes(self) -> int:
        return self._cache.max_bytes or 0

    @property
    def cache_bytes(self) -> int:
        """Bytes the context's caches hold now (an estimate; grammars are weighed as they are)."""
        return self._cache.nbytes

    @property
    def cache_entries(self) -> int:
        """Entries held now: compiled grammars, tries, shared walks."""
        return len(self._cache)

    def clear(self) -> None:
        """Drop every cached grammar, trie and walk (grammars in use keep working)."""
        self._cache.clear()

    def compile_grammar(self, grammar: ir.Grammar, vocab: Vocabulary, *,
                        budget: CompileBudget | None = None) -> CompiledGrammar:
        """Bind an IR grammar to a vocabulary (not cached itself: it shares the vocabulary's caches)."""
        check_instance(grammar, "compile_grammar(grammar)", ir.Grammar, "a constrain.grammars.ir.Grammar")
        self._check_vocab(vocab, "compile_grammar")
        return self._compile(grammar, vocab, self._check_budget(budget, "compile_grammar(budget)", self.budget))

    def compile_json_schema(self, schema: dict[str, Any] | bool | str, vocab: Vocabulary, *,
                            budget: CompileBudget | None = None, **options: Any) -> CompiledGrammar:
        """Compile a JSON Schema (dict, bool or JSON text). Options go to the JSON Schema front end.

        Raises ``grammars.errors.SchemaError`` naming the keyword and JSON pointer of anything that
        cannot be enforced, ``BudgetExceededError`` when translating it takes longer than the
        budget's ``seconds``.
        """
        from constrain.grammars.json_schema import translate_schema

        check_instance(schema, "compile_json_schema(schema)", (dict, bool, str), "a dict, a bool or JSON text (str)")
        self._check_vocab(vocab, "compile_json_schema")
        chosen = self._check_budget(budget, "compile_json_schema(budget)", self.budget)
        text = schema if isinstance(schema, str) else json.dumps(schema)  # key order matters (property_order="declared")
        key = ("json_schema", text, vocab.fingerprint, chosen, _options_key(options))

        def build() -> CompiledGrammar:
            try:
                grammar = translate_schema(schema, seconds=chosen.seconds, **options)
            except TimeLimitError as e:  # the front end's share of the budget: the same error as the core's
                raise BudgetExceededError("seconds", chosen.seconds, str(e)) from None
            return self._compile(grammar, vocab, chosen)

        return self._cached(key, build)

    def compile_regex(self, pattern: str, vocab: Vocabulary, *, budget: CompileBudget | None = None) -> CompiledGrammar:
        """Compile a regular expression (Python ``re`` syntax subset) that must match the whole output."""
        from constrain.grammars.regex import regex_to_ir

        check_instance(pattern, "compile_regex(pattern)", str, "a str")
        self._check_vocab(vocab, "compile_regex")
        chosen = self._check_budget(budget, "compile_regex(budget)", self.budget)
        key = ("regex", pattern, vocab.fingerprint, chosen)
        return self._cached(key, lambda: self._compile(ir.Grammar.of(regex_to_ir(pattern)), vocab, chosen))

    def compile_lark(self, text: str, vocab: Vocabulary, start: str = "start", *,
                     budget: CompileBudget | None = None) -> CompiledGrammar:
        """Compile a Lark grammar from its text, starting at rule ``start``."""
        from constrain.grammars.lark_frontend import lark_to_grammar

        check_instance(text, "compile_lark(text)", str, "the grammar's text (str)")
        check_instance(start, "compile_lark(start)", str, "a rule name (str)")
        self._check_vocab(vocab, "compile_lark")
        chosen = self._check_budget(budget, "compile_lark(budget)", self.budget)
        key = ("lark", text, start, vocab.fingerprint, chosen)
        return self._cached(key, lambda: self._compile(lark_to_grammar(text, start=start), vocab, chosen))

    def _compile(self, grammar: ir.Grammar, vocab: Vocabulary, budget: CompileBudget) -> CompiledGrammar:
        self._cache.settle()  # the growth that masks made since the last compile is paid here, not in a mask
        signatures: Signatures = self._cache.get_or_make(_SIGNATURES_KEY, Signatures)
        return CompiledGrammar(grammar, vocab, budget=budget, shared=self._cache, signatures=signatures,
                               native=self.native)

    def _cached(self, key: tuple[Hashable, ...], build: Callable[[], CompiledGrammar]) -> CompiledGrammar:
        return self._cache.get_or_make(("grammar", *key), build)

    @staticmethod
    def _check_vocab(vocab: Any, verb: str) -> None:
        check_instance(vocab, f"{verb}(vocab)", Vocabulary,
                       "a constrain.Vocabulary (Vocabulary.from_hf, from_tiktoken, ...)")

    @staticmethod
    def _check_budget(budget: Any, name: str, default: CompileBudget) -> CompileBudget:
        if budget is None:
            return default
        check_instance(budget, name, CompileBudget, "a constrain.CompileBudget or None")
        return budget  # type: ignore[no-any-return]


_default_compiler: GrammarCompiler | None = None
_default_lock = threading.Lock()


def get_default_compiler() -> GrammarCompiler:
    """The context the module-level ``compile_*`` functions use (made on first use)."""
    global _default_compiler
    with _default_lock:
        if _default_compiler is None:
            _default_compiler = GrammarCompiler()
        return _default_compiler


def set_default_compiler(compiler: GrammarCompiler) -> None:
    """Make ``compiler`` the context of the module-level ``compile_*`` functions."""
    global _default_compiler
    check_instance(compiler, "set_default_compiler(compiler)", GrammarCompiler, "a constrain.GrammarCompiler")
    with _default_lock:
        _default_compiler = compiler


def compile_grammar(grammar: ir.Grammar, vocab: Vocabulary, *, budget: CompileBudget | None = None) -> CompiledGrammar:
    """Bind an IR grammar to a vocabulary (``GrammarCompiler.compile_grammar`` of the default context)."""
    return get_default_compiler().compile_grammar(grammar, vocab, budget=budget)


def compile_json_schema(schema: dict[str, Any] | bool | str, vocab: Vocabulary, *,
                        budget: CompileBudget | None = None, **options: Any) -> CompiledGrammar:
    """Compile a JSON Schema (``GrammarCompiler.compile_json_schema`` of the default context)."""
    return get_default_compiler().compile_json_schema(schema, vocab, budget=budget, **options)


def compile_regex(pattern: str, vocab: Vocabulary, *, budget: CompileBudget | None = None) -> CompiledGrammar:
    """Compile a full-match regex (``GrammarCompiler.compile_regex`` of the default context)."""
    return get_default_compiler().compile_regex(pattern, vocab, budget=budget)


def compile_lark(text: str, vocab: Vocabulary, start: str = "start", *,
                 budget: CompileBudget | None = None) -> CompiledGrammar:
    """Compile a Lark grammar (``GrammarCompiler.compile_lark`` of the default context)."""
    return get_default_compiler().compile_lark(text, vocab, start, budget=budget)
