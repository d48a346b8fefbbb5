"""One adapter per engine, all over the same token bytes, with one small common interface.

`Engine(tok)` builds the engine's tokenizer object once; `engine.compile(schema)` returns a
`Compiled` whose `matcher()` gives a fresh `EngineMatcher`. Masks are written into a torch int32
row of `ceil(vocab_size/32)` words (the layout every engine here shares). Compile errors raise.
Every engine is configured for compact JSON (`,` and `:` without spaces) where it can be.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from bench.tok import Tok
from constrain.testing.corpus import suite_remote

ENGINES = ("constrain", "xgrammar", "llguidance", "outlines")


class EngineMatcher:
    def fill(self, bitmask: torch.Tensor) -> None:
        """Write the next-token mask into row 0 of `bitmask`."""
        raise NotImplementedError

    def accept(self, token: int) -> bool:
        """Advance by a non-EOS token; False if refused."""
        raise NotImplementedError

    def accept_eos(self, eos: int) -> bool:
        """Advance by EOS; True if the engine takes it and is now terminated."""
        raise NotImplementedError


class Compiled:
    def matcher(self) -> EngineMatcher:
        raise NotImplementedError


class Engine:
    name = "?"
    options = ""    # how the engine is configured, for the report

    def __init__(self, tok: Tok) -> None:
        self.tok = tok

    def compile(self, schema: Any) -> Compiled:
        raise NotImplementedError

    @staticmethod
    def version() -> str:
        return ""


# ----------------------------------------------------------------------------------- xgrammar

class _StdMatcher(EngineMatcher):
    """Matchers with the shared verbs (xgrammar's and constrain's)."""

    def __init__(self, m: Any) -> None:
        self.m = m

    def fill(self, bitmask: torch.Tensor) -> None:
        self.m.fill_next_token_bitmask(bitmask, 0)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def accept_eos(self, eos: int) -> bool:
        return bool(self.m.accept_token(eos)) and bool(self.m.is_terminated())


class _FactoryCompiled(Compiled):
    def __init__(self, make: Callable[[], EngineMatcher]) -> None:
        self.make = make

    def matcher(self) -> EngineMatcher:
        return self.make()


class XGrammar(Engine):
    name = "xgrammar"
    options = "compile_json_schema(any_whitespace=False, separators=(',', ':'), strict_mode=False), max_threads=1, no cache"

    def __init__(self, tok: Tok) -> None:
        super().__init__(tok)
        import xgrammar as xgr

        # Empty bytes mark a special token (never allowed); EOS is given as a stop token.
        encoded = [b if b is not None else b"" for b in tok.token_bytes]
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=tok.vocab_size,
                                 stop_token_ids=list(tok.eos_token_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: Any) -> Compiled:
        import xgrammar as xgr

        cg = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                               strict_mode=False)
        return _FactoryCompiled(lambda: _StdMatcher(xgr.GrammarMatcher(cg)))

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("xgrammar")


# --------------------------------------------------------------------------------- llguidance

class _LlgTokenizerSource:
    """What `llguidance.TokenizerWrapper` reads: raw token bytes (specials as b"\\xff<name>"), EOS,
    and an encoder (the tokenizer's canonical one)."""

    def __init__(self, tok: Tok) -> None:
        self.tokens = [b if b is not None else b"\xff<|special_%d|>" % i for i, b in enumerate(tok.token_bytes)]
        self.tokens += [b"\xff<|pad_%d|>" % i for i in range(len(self.tokens), tok.vocab_size)]
        self.eos_token_id = tok.eos_token_ids[0]
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(tok.token_bytes) if b is None]
        self._encode = tok.encode

    def __call__(self, s: str | bytes) -> list[int]:
        return self._encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s)


class _LlgMatcher(EngineMatcher):
    def __init__(self, m: Any, nbytes: int) -> None:
        self.m = m
        self.nbytes = nbytes

    def fill(self, bitmask: torch.Tensor) -> None:
        self.m.unsafe_compute_mask_ptr(bitmask.data_ptr(), self.nbytes)

    def accept(self, token: int) -> bool:
        return bool(self.m.consume_token(token))

    def accept_eos(self, eos: int) -> bool:
        return bool(self.m.consume_token(eos)) and bool(self.m.is_stopped())


class LLGuidance(Engine):
    name = "llguidance"
    options = "grammar_from_json_schema(whitespace_flexible=False, separators ',' ':'), default limits"

    def __init__(self, tok: Tok) -> None:
        super().__init__(tok)
        import llguidance as llg

        self.llg = llg
        self.tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_LlgTokenizerSource(tok)),
                                         n_vocab=tok.vocab_size, eos_token=list(tok.eos_token_ids))
        self.nbytes = 4 * ((tok.vocab_size + 31) // 32)

    def compile(self, schema: Any) -> Compiled:
        llg = self.llg
        grammar = llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema),
            overrides={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
        m = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        nbytes = self.nbytes
        return _FactoryCompiled(lambda: _LlgMatcher(m.deep_copy(), nbytes))

    @staticmethod
    def version() -> str:
        import llguidance

        return llguidance.__version__


# ------------------------------------------------------------------------------- outlines-core

class _OutlinesMatcher(EngineMatcher):
    def __init__(self, g: Any) -> None:
        self.g = g

    def fill(self, bitmask: torch.Tensor) -> None:
        self.g.write_mask_into(bitmask.data_ptr(), bitmask.shape[1], 4)

    def accept(self, token: int) -> bool:
        try:
            self.g.advance(token, return_tokens=False)
            return True
        except ValueError:
            return False

    def accept_eos(self, eos: int) -> bool:
        # The index has no transition on EOS: EOS is allowed exactly in final states.
        return bool(self.g.is_finished())


class Outlines(Engine):
    name = "outlines"
    options = "build_regex_from_schema(default whitespace) + Index + Guide"

    def __init__(self, tok: Tok) -> None:
        super().__init__(tok)
        import outlines_core

        self.oc = outlines_core
        table: dict[bytes, list[int]] = {}
        for i, b in enumerate(tok.token_bytes):
            if b is not None and i not in tok.eos_token_ids:
                table.setdefault(b, []).append(i)
        self.vocab = outlines_core.Vocabulary(tok.eos_token_ids[0], table)

    def compile(self, schema: Any) -> Compiled:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        index = self.oc.Index(regex, self.vocab)
        return _FactoryCompiled(lambda: _OutlinesMatcher(self.oc.Guide(index)))

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("outlines_core")


# ---------------------------------------------------------------------------------- constrain

class Constrain(Engine):
    name = "constrain"
    options = "compile_json_schema(schema, vocab) defaults (+ remote_schemas: the test suite's remotes/)"

    def __init__(self, tok: Tok) -> None:
        super().__init__(tok)
        import constrain

        if not hasattr(constrain, "compile_json_schema"):
            raise ImportError("constrain.compile_json_schema is not there yet")
        self.constrain = constrain
        try:  # a half-landed package fails here, once, rather than as a compile error per schema
            self.compile({"type": "boolean"})
        except ImportError:
            raise
        except Exception:
            pass

    def compile(self, schema: Any) -> Compiled:
        # The test suite's remote documents (http://localhost:1234/ -> remotes/), never fetched.
        cg = self.constrain.compile_json_schema(schema, self.tok.vocab, remote_schemas=suite_remote)
        return _FactoryCompiled(lambda: _StdMatcher(cg.matcher()))

    @staticmethod
    def version() -> str:
        import subprocess

        from bench import REPO_ROOT

        def git(*a: str) -> str:
            return subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()

        try:
            dirty = git("status", "--porcelain", "--", "constrain", "grammars")
            return git("rev-parse", "--short", "HEAD") + (" + uncommitted constrain/grammars changes" if dirty else "")
        except Exception:
            return "?"




ADAPTERS: dict[str, type[Engine]] = {
    "constrain": Constrain, "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines": Outlines,
}
