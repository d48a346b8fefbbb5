"""Token id -> raw bytes for Hugging Face `tokenizers` models.

HF vocabularies store token *strings*, not bytes. How a string maps to bytes depends on the
decoder: byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM2) stores each byte as a printable stand-in
character (GPT-2's `bytes_to_unicode`), while SentencePiece-style models store `▁` for a space
and `<0xNN>` for byte-fallback pieces. Masks work on bytes, so we undo that encoding here.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: stand-in character -> byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass(frozen=True)
class HFTokenBytes:
    """What `extract` found: bytes per id, the special ids, and the mapping style used."""

    token_bytes: list[bytes | None]
    special_ids: frozenset[int]
    style: str  # "byte_level" | "sentencepiece"


def _decoder_types(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Flatten a (possibly nested Sequence) decoder / pre-tokenizer JSON into its parts."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        inner = node.get("decoders") or node.get("pretokenizers") or []
        return [part for sub in inner for part in _decoder_types(sub)]
    return [node]


def _style(spec: dict[str, Any]) -> tuple[str, str, bool]:
    """Return (style, space replacement char, byte_fallback) from the tokenizer JSON."""
    decoders = _decoder_types(spec.get("decoder"))
    pre = _decoder_types(spec.get("pre_tokenizer"))
    kinds = {d.get("type") for d in decoders}
    model = spec.get("model") or {}
    if "ByteLevel" in kinds or (not decoders and any(p.get("type") == "ByteLevel" for p in pre)):
        return "byte_level", "", False
    replacement = "▁"
    for part in decoders + pre:
        if part.get("type") == "Metaspace":
            replacement = part.get("replacement", replacement)
        elif part.get("type") == "Replace" and part.get("content") == " ":
            replacement = (part.get("pattern") or {}).get("String", replacement)
    sentencepiece = bool(kinds & {"Metaspace", "ByteFallback", "Replace"}) or model.get("type") == "Unigram"
    if not sentencepiece:
        raise ValueError(
            f"unsupported HF tokenizer (model {model.get('type')!r}, decoder {sorted(map(str, kinds))}): "
            "only byte-level BPE and SentencePiece-style (Metaspace/ByteFallback) vocabularies map to bytes"
        )
    byte_fallback = bool(model.get("byte_fallback")) or "ByteFallback" in kinds
    return "sentencepiece", replacement, byte_fallback


def _unk_id(model: dict[str, Any], vocab: dict[str, int]) -> int | None:
    if model.get("type") == "Unigram":
        return model.get("unk_id")
    unk = model.get("unk_token")
    return vocab.get(unk) if unk is not None else None


def extract(backend: Any, extra_special_ids: frozenset[int] = frozenset()) -> HFTokenBytes:
    """Map every id of a `tokenizers.Tokenizer` to its bytes (None for specials and holes).

    Added tokens not marked special are literal UTF-8 text, whatever the model's style.
    """
    spec = json.loads(backend.to_str())
    style, replacement, byte_fallback = _style(spec)
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False)
    added = backend.get_added_tokens_decoder()
    size = max([*vocab.values(), *added.keys(), -1]) + 1
    out: list[bytes | None] = [None] * size
    if style == "byte_level":
        inverse = unicode_to_byte()
        for piece, i in vocab.items():
            try:
                out[i] = bytes(inverse[ch] for ch in piece)
            except KeyError as e:
                raise ValueError(f"token {i} ({piece!r}) has a character outside the byte-level alphabet: {e}") \
                    from None
    else:
        for piece, i in vocab.items():
            m = _BYTE_PIECE.fullmatch(piece) if byte_fallback else None
            out[i] = bytes([int(m.group(1), 16)]) if m else piece.replace(replacement, " ").encode("utf-8")
    special = set(extra_special_ids)
    unk = _unk_id(spec.get("model") or {}, vocab)
    if unk is not None:
        special.add(unk)
    for i, tok in added.items():
        if tok.special:
            special.add(i)
        else:
            out[i] = tok.content.encode("utf-8")
    for i in special:
        if i < size:
            out[i] = None
    return HFTokenBytes(out, frozenset(special), style)
