"""The tokenizers the benchmark runs on: one `Tok` gives every engine the same token bytes, EOS ids
and logits width, plus the tokenizer's own canonical encoder for the labelled instances."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKENIZERS = ("tekken", "llama3")


@dataclass
class Tok:
    name: str
    vocab: Any                              # constrain.Vocabulary
    token_bytes: list[bytes | None]
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    encode: Callable[[str], list[int]]      # canonical tokenization, no BOS/EOS

    def decode(self, ids: list[int]) -> bytes:
        return b"".join(self.token_bytes[i] or b"" for i in ids)


def load(name: str) -> Tok:
    from constrain import tokenizers

    if name == "tekken":
        vocab = tokenizers.tekken()
        tk = tokenizers.tekken_tokenizer()

        def encode(s: str) -> list[int]:
            return list(tk.encode(s, bos=False, eos=False))
    elif name == "llama3":
        vocab = tokenizers.llama3()
        enc = tokenizers.llama3_tokenizer().model   # tiktoken.Encoding with Llama-3's split pattern

        def encode(s: str) -> list[int]:
            return list(enc.encode(s, allowed_special=set(), disallowed_special=()))
    else:
        raise SystemExit(f"unknown tokenizer {name!r}; known: {', '.join(TOKENIZERS)}")
    return Tok(name, vocab, list(vocab.token_bytes), tuple(vocab.eos_token_ids), int(vocab.vocab_size), encode)
