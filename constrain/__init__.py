"""constrain: structured-output constrained decoding.

Compile a constraint against a vocabulary, then drive one ``Matcher`` per sequence::

    import constrain
    vocab = constrain.Vocabulary.from_hf(tokenizer)
    grammar = constrain.compile_json_schema(schema, vocab)
    matcher = grammar.matcher()
    bitmask = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)

The ``compile_*`` functions use a default ``GrammarCompiler``; make your own to own the caches
(``GrammarCompiler(max_cache_bytes=...)``, ``.clear()``, ``.cache_bytes``).
"""

from typing import Any

from constrain.batch_matcher import BatchMatcher
from constrain.bitmask import allocate_token_bitmask, bitmask_words
from constrain.budget import BudgetExceededError, CompileBudget
from constrain.compiler import (
    CompiledGrammar,
    GrammarCompiler,
    compile_grammar,
    compile_json_schema,
    compile_lark,
    compile_regex,
    get_default_compiler,
    set_default_compiler,
)
from constrain.grammars.errors import GrammarError, LarkGrammarError, RegexError, SchemaError, UnsatisfiableError
from constrain.matcher import Matcher
from constrain.vocabulary import Vocabulary

_ENGINE_NAMES = ("Engine", "ExtractionError", "Request")


def __getattr__(name: str) -> Any:
    """``from constrain import Engine``: the engine layer, imported only when asked for.

    constrain/ itself never depends on engine/ (which needs a model stack); this facade only
    saves users an import line, as DESIGN.md promises. ``bitmask_dtype`` likewise waits for its
    first use to import torch.
    """
    if name in _ENGINE_NAMES:
        from constrain import engine

        return getattr(engine, name)
    if name == "bitmask_dtype":  # torch.int32: torch is imported when asked for (constrain.bitmask)
        from constrain import bitmask

        return bitmask.bitmask_dtype
    raise AttributeError(f"module 'constrain' has no attribute {name!r}")


__all__ = [
    "Vocabulary", "CompiledGrammar", "Matcher", "BatchMatcher", "GrammarCompiler", "CompileBudget",
    "compile_json_schema", "compile_regex", "compile_lark", "compile_grammar",
    "get_default_compiler", "set_default_compiler",
    "allocate_token_bitmask", "bitmask_dtype", "bitmask_words",
    "GrammarError", "SchemaError", "RegexError", "LarkGrammarError", "UnsatisfiableError", "BudgetExceededError",
]
