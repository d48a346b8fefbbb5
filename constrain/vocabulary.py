"""A tokenizer's vocabulary as the compiler sees it: token id -> raw bytes.

Constraints are byte automata, so every tokenizer format (HF, tiktoken, SentencePiece, tekken)
is reduced to one list of bytes per id. Ids that must never appear in content (specials,
control tokens, holes in the id space, logits padding) have no bytes (None).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sentencepiece
    import tiktoken

# Names that mean "stop" in the tokenizers we know; used when a constructor is not told the EOS.
DEFAULT_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "</s>")

PathLike = str | os.PathLike[str]


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Token bytes per id plus the stop tokens; hashable and comparable by `fingerprint`."""

    token_bytes: list[bytes | None] = field(repr=False)
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    special_token_ids: frozenset[int] = frozenset()
    name: str = "vocabulary"

    def __post_init__(self) -> None:
        n = len(self.token_bytes)
        if not isinstance(self.vocab_size, int) or self.vocab_size < n:
            raise ValueError(f"{self.name}: vocab_size {self.vocab_size} is smaller than the {n} tokens it must hold")
        for i, b in enumerate(self.token_bytes):
            if b is not None and (type(b) is not bytes or not b):
                raise ValueError(f"{self.name}: token {i} must be non-empty bytes or None, got {b!r}")
        for kind, ids in (("EOS", self.eos_token_ids), ("special", self.special_token_ids)):
            for i in ids:
                if not isinstance(i, int) or not 0 <= i < self.vocab_size:
                    raise ValueError(f"{self.name}: {kind} token id {i!r} is outside [0, {self.vocab_size})")
                if i < n and self.token_bytes[i] is not None:
                    raise ValueError(f"{self.name}: {kind} token id {i} has content bytes {self.token_bytes[i]!r}")
        if len(set(self.eos_token_ids)) != len(self.eos_token_ids):
            raise ValueError(f"{self.name}: duplicate EOS ids {self.eos_token_ids}")

    def __repr__(self) -> str:
        return (f"Vocabulary(name={self.name!r}, tokens={len(self.token_bytes)}, vocab_size={self.vocab_size}, "
                f"eos_token_ids={self.eos_token_ids}, specials={len(self.special_token_ids)})")

    def bytes_of(self, token_id: int) -> bytes | None:
        """Bytes of one id; None for specials, holes and padding ids past the tokenizer."""
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"{self.name}: token id {token_id} is outside [0, {self.vocab_size})")
        return self.token_bytes[token_id] if token_id < len(self.token_bytes) else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    @cached_property
    def fingerprint(self) -> str:
        """Stable sha256 of token bytes, EOS ids and vocab_size: a cache key for compiled grammars."""
        h = hashlib.sha256(f"constrain-vocab-v1|{self.vocab_size}|{list(self.eos_token_ids)}|".encode())
        h.update(array("q", [-1 if b is None else len(b) for b in self.token_bytes]).tobytes())
        h.update(b"".join(b for b in self.token_bytes if b is not None))
        return h.hexdigest()

    # ----------------------------------------------------------------------------- constructors

    @classmethod
    def from_token_bytes(
        cls,
        token_bytes: Iterable[bytes | None],
        eos_token_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        special_token_ids: Iterable[int] = (),
        name: str = "vocabulary",
    ) -> Vocabulary:
        """Build from bytes per id; EOS and special ids must have None bytes (they carry no content)."""
        tb = list(token_bytes)
        eos = tuple(eos_token_ids)
        size = len(tb) if vocab_size is None else vocab_size
        return cls(tb, size, eos, frozenset(special_token_ids) | set(eos), name)

    @classmethod
    def _build(
        cls,
        tb: list[bytes | None],
        special: Iterable[int],
        eos: Iterable[int],
        vocab_size: int | None,
        name: str,
    ) -> Vocabulary:
        """Shared tail of the format constructors: specials and EOS lose their bytes."""
        eos_t = tuple(dict.fromkeys(eos))
        special_s = frozenset(special) | set(eos_t)
        for i in special_s:
            if i < len(tb):
                tb[i] = None
        return cls(tb, len(tb) if vocab_size is None else vocab_size, eos_t, special_s, name)

    @classmethod
    def from_tiktoken(
        cls,
        source: PathLike | tiktoken.Encoding,
        special_tokens: Mapping[str, int] | None = None,
        eos_tokens: Iterable[str | int] | None = None,
        vocab_size: int | None = None,
        added_tokens: Mapping[str, int] | None = None,
        name: str | None = None,
    ) -> Vocabulary:
        """From a `.tiktoken` file (`base64 rank` lines; id = rank) or a `tiktoken.Encoding`.

        `special_tokens` (name -> id) get None; `added_tokens` (name -> id) are literal UTF-8 text,
        like HF's non-special added tokens. `eos_tokens` are names or ids; by default, whichever
        of DEFAULT_EOS_NAMES are special tokens.
        """
        specials = dict(special_tokens or {})
        tb: list[bytes | None]
        if isinstance(source, (str, os.PathLike)):
            tb = _read_tiktoken_file(Path(source))
            name = name or Path(source).name
        else:
            for s in source.special_tokens_set:
                specials.setdefault(s, source.encode_single_token(s))
            tb = [None] * source.n_vocab
            special_ids = set(specials.values())
            for i in range(source.n_vocab):
                if i not in special_ids:
                    try:
                        tb[i] = source.decode_single_token_bytes(i)
                    except KeyError:  # a hole in the id space (e.g. cl100k 100256)
                        pass
            name = name or source.name
        for label, extra in (("special", specials), ("added", added_tokens or {})):
            for tok, i in extra.items():
                if i < len(tb) and tb[i] is not None:
                    raise ValueError(f"{name}: {label} token {tok!r} id {i} collides with BPE token {tb[i]!r}")
                tb.extend([None] * (i + 1 - len(tb)))
                if label == "added":
                    tb[i] = tok.encode("utf-8")
        eos = _resolve_eos(name, eos_tokens, specials)
        return cls._build(tb, specials.values(), eos, vocab_size, name)

    @classmethod
    def from_sentencepiece(
        cls,
        model: PathLike | sentencepiece.SentencePieceProcessor,
        vocab_size: int | None = None,
        eos_tokens: Iterable[str | int] | None = None,
        name: str | None = None,
    ) -> Vocabulary:
        """From a SentencePiece `.model`: `▁` is a space, `<0xNN>` byte pieces are that byte,
        control/unknown/unused pieces get None. EOS defaults to the model's `eos_id`."""
        import sentencepiece as spm

        if isinstance(model, (str, os.PathLike)):
            name = name or Path(model).name
            sp = spm.SentencePieceProcessor(model_file=os.fspath(model))
        else:
            sp = model
            name = name or "sentencepiece"
        tb: list[bytes | None] = []
        special: list[int] = []
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                tb.append(None)
                special.append(i)
            elif sp.is_byte(i):
                tb.append(bytes([int(piece[3:5], 16)]))
            else:
                tb.append(piece.replace("\u2581", " ").encode("utf-8"))
        names = {sp.id_to_piece(i): i for i in special}
        if eos_tokens is None:
            eos_tokens = [sp.eos_id()] if sp.eos_id() >= 0 else []
        return cls._build(tb, special, _resolve_eos(name, eos_tokens, names), vocab_size, name)

    @classmethod
    def from_tekken(cls, path: PathLike, vocab_size: int | None = None, name: str | None = None) -> Vocabulary:
        """From a mistral-common tekken JSON: ids below `default_num_special_tokens` are special,
        BPE rank r is id r + num_special; EOS is `</s>` (id 2 unless the file says otherwise)."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        cfg = data["config"]
        n_special = int(cfg.get("default_num_special_tokens", 1000))
        n_total = int(cfg.get("default_vocab_size", n_special + len(data["vocab"])))
        ranks = data["vocab"][: n_total - n_special]
        tb: list[bytes | None] = [None] * n_special + [base64.b64decode(t["token_bytes"]) for t in ranks]
        named = {t["token_str"]: t["rank"] for t in data.get("special_tokens") or []}
        eos = [named.get("</s>", 2)]
        return cls._build(tb, range(n_special), eos, vocab_size, name or Path(path).stem)

    @classmethod
    def from_hf(
        cls,
        tokenizer_or_path: Any,
        vocab_size: int | None = None,
        eos_tokens: Iterable[str | int] | None = None,
        name: str | None = None,
    ) -> Vocabulary:
        """From a HF fast tokenizer (transformers object or `tokenizers.Tokenizer`) or a local directory.

        EOS: the tokenizer's `eos_token_id`, plus the ids a local directory's
        `generation_config.json`/`config.json` declare; `eos_tokens` (names or ids) replaces that.
        """
        from constrain._hf_bytes import extract

        tok = tokenizer_or_path
        declared: list[int] = []
        if isinstance(tok, (str, os.PathLike)):
            path = Path(tok)
            if not path.is_dir():
                raise ValueError(f"from_hf expects a tokenizer object or a local directory, got {path}")
            from transformers import AutoTokenizer

            name = name or path.name
            declared = _declared_eos(path)
            tok = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
        backend = getattr(tok, "backend_tokenizer", tok)
        if not hasattr(backend, "get_added_tokens_decoder"):
            raise TypeError(f"from_hf needs a fast (Rust-backed) HF tokenizer, got {type(tok).__name__}")
        extra = frozenset(getattr(tok, "all_special_ids", ()) or ())
        found = extract(backend, extra)
        name = name or getattr(tok, "name_or_path", None) or "hf"
        if eos_tokens is None:
            own = getattr(tok, "eos_token_id", None)
            eos_tokens = ([own] if own is not None else []) + declared
        names = {s: i for s, i in backend.get_vocab(with_added_tokens=True).items() if i in found.special_ids}
        eos = _resolve_eos(name, eos_tokens, names, backend.get_vocab(with_added_tokens=True))
        return cls._build(list(found.token_bytes), found.special_ids, eos, vocab_size, str(name))


def _read_tiktoken_file(path: Path) -> list[bytes | None]:
    """Parse `base64 rank` lines; ranks missing from the file are holes (None)."""
    ranks: dict[int, bytes] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[int(rank)] = base64.b64decode(token, validate=True)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not a tiktoken `base64 rank` line: {line[:60]!r}") from e
    tb: list[bytes | None] = [None] * (max(ranks, default=-1) + 1)
    for i, b in ranks.items():
        tb[i] = b
    return tb


def _resolve_eos(
    name: str,
    eos_tokens: Iterable[str | int] | None,
    specials: Mapping[str, int],
    all_tokens: Mapping[str, int] | None = None,
) -> list[int]:
    """Names or ids -> ids; None means the DEFAULT_EOS_NAMES that are special tokens."""
    if eos_tokens is None:
        return [specials[s] for s in DEFAULT_EOS_NAMES if s in specials]
    lookup = all_tokens or specials
    out = []
    for t in eos_tokens:
        if isinstance(t, str):
            if t not in lookup:
                raise ValueError(f"{name}: EOS token {t!r} is not a token of this vocabulary")
            out.append(lookup[t])
        else:
            out.append(int(t))
    return out


def _declared_eos(path: Path) -> list[int]:
    """EOS ids a model directory declares in generation_config.json / config.json (int or list)."""
    out: list[int] = []
    for fname in ("generation_config.json", "config.json"):
        f = path / fname
        if f.is_file():
            value = json.loads(f.read_text(encoding="utf-8")).get("eos_token_id")
            out += value if isinstance(value, list) else [] if value is None else [value]
    return out
