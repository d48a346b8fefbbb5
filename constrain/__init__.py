"""constrain: structured-output constrained decoding.

Compile a constraint against a vocabulary, then drive one ``Matcher`` per sequence::

    import constrain
    vocab = constrain.Vocabulary.from_hf(tokenizer)
    grammar = constrain.compile_json_schema(schema, vocab)
    matcher = grammar.matcher()
    bitmask = constrain.allocate_token_bitmask(1, vocab.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0)
"""

from constrain.bitmask import allocate_token_bitmask, bitmask_dtype, bitmask_words
from constrain.compiler import (
    CompiledGrammar,
    compile_grammar,
    compile_json_schema,
    compile_lark,
    compile_regex,
)
from constrain.grammars.errors import GrammarError, LarkGrammarError, RegexError, SchemaError
from constrain.matcher import Matcher
from constrain.vocabulary import Vocabulary

_ENGINE_NAMES = ("Engine", "ExtractionError", "Request")


def __getattr__(name: str):
    """``from constrain import Engine``: the engine layer, imported only when asked for.

    constrain/ itself never depends on engine/ (which needs a model stack); this facade only
    saves users an import line, as DESIGN.md promises.
    """
    if name in _ENGINE_NAMES:
        from constrain import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'constrain' has no attribute {name!r}")


__all__ = [
    "Vocabulary", "CompiledGrammar", "Matcher",
    "compile_json_schema", "compile_regex", "compile_lark", "compile_grammar",
    "allocate_token_bitmask", "bitmask_dtype", "bitmask_words",
    "GrammarError", "SchemaError", "RegexError", "LarkGrammarError",
]
