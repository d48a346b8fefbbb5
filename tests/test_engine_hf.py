"""constrain inside Hugging Face ``model.generate`` (LogitsProcessor), and model-loading errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from support.engine import engine

from constrain.engine.hf_processor import build_logits_processor
from constrain.engine.model import ModelLoadError, load_model, load_vocabulary

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

DATE = r"\d{4}-\d{2}-\d{2}"


def _generate(proc: object, prompt: str, max_new_tokens: int) -> tuple[torch.Tensor, str]:
    loaded = engine().loaded
    ids = torch.tensor([loaded.encode_prompt(prompt)])
    out = loaded.model.generate(ids, max_new_tokens=max_new_tokens, logits_processor=[proc], do_sample=False)
    return out, loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_hf_generate_with_processor_matches_the_regex() -> None:
    loaded = engine().loaded
    proc = build_logits_processor(loaded.tokenizer, regex=DATE, model=loaded.model)
    out, text = _generate(proc, "When did the Berlin wall fall?", 14)
    assert re.fullmatch(DATE, text), text
    assert proc.finish_reasons(out) == ["stop"]
    assert proc.finish_reasons(out) == ["stop"]  # asking twice changes nothing


def test_truncated_output_is_flagged() -> None:
    loaded = engine().loaded
    proc = build_logits_processor(loaded.tokenizer, regex=DATE, model=loaded.model)
    out, text = _generate(proc, "When did the Berlin wall fall?", 3)
    assert not re.fullmatch(DATE, text), text
    assert proc.finish_reasons(out) == ["length"]


def test_reuse_without_reset_raises_and_reset_allows_it() -> None:
    loaded = engine().loaded
    proc = build_logits_processor(loaded.tokenizer, regex=DATE, model=loaded.model)
    _generate(proc, "When did the Berlin wall fall?", 14)
    with pytest.raises(RuntimeError, match=r"call reset\(\)"):
        _generate(proc, "When was the Eiffel tower finished?", 14)
    proc.reset()
    out, text = _generate(proc, "When was the Eiffel tower finished?", 14)
    assert re.fullmatch(DATE, text) and proc.finish_reasons(out) == ["stop"], text


def test_logits_width_mismatch_names_the_fix() -> None:
    loaded = engine().loaded
    proc = build_logits_processor(loaded.tokenizer, regex=DATE, vocab_size=loaded.logits_width + 64)
    with pytest.raises(ValueError, match=f"logits are {loaded.logits_width} wide.*pass model="):
        _generate(proc, "When did the Berlin wall fall?", 4)


def test_model_gives_the_width_and_stop_tokens() -> None:
    loaded = engine().loaded
    proc = build_logits_processor(loaded.tokenizer, choices=["yes", "no"], model=loaded.model)
    vocab = proc.vocab
    assert vocab.vocab_size == loaded.logits_width
    assert set(vocab.eos_token_ids) == {int(loaded.model.generation_config.eos_token_id)}


def test_hf_processor_and_engine_agree_greedy() -> None:
    eng = engine()
    loaded = eng.loaded
    proc = build_logits_processor(loaded.tokenizer, choices=["yes", "no"], model=loaded.model)
    prompt = "Is the sky blue?"
    _, hf_text = _generate(proc, prompt, 4)
    ours = eng.generate(prompt, choices=["yes", "no"], max_tokens=4)
    assert hf_text == ours.text


def test_vocabulary_without_weights_equals_the_engines() -> None:
    assert load_vocabulary() == engine().vocab


def test_load_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "missing")
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(bogus)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
