"""constrain inside Hugging Face ``model.generate`` (LogitsProcessor), and model-loading errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from support.engine import engine

from constrain.engine.hf_processor import build_logits_processor
from constrain.engine.model import ModelLoadError, load_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_hf_generate_with_processor_matches_the_regex() -> None:
    loaded = engine().loaded
    pattern = r"\d{4}-\d{2}-\d{2}"
    proc = build_logits_processor(loaded.tokenizer, regex=pattern, vocab_size=loaded.logits_width)
    ids = torch.tensor([loaded.encode_prompt("When did the Berlin wall fall?")])
    out = loaded.model.generate(ids, max_new_tokens=14, logits_processor=[proc], do_sample=False)
    text = loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert re.fullmatch(pattern, text), text
    assert proc.matchers[0].is_accepting()


def test_hf_processor_and_engine_agree_greedy() -> None:
    eng = engine()
    loaded = eng.loaded
    proc = build_logits_processor(loaded.tokenizer, choices=["yes", "no"], vocab_size=loaded.logits_width)
    prompt = "Is the sky blue?"
    ids = torch.tensor([loaded.encode_prompt(prompt)])
    out = loaded.model.generate(ids, max_new_tokens=4, logits_processor=[proc], do_sample=False)
    hf_text = loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    ours = eng.generate(prompt, choices=["yes", "no"], max_tokens=4)
    assert hf_text == ours.text


def test_load_model_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "missing")
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(bogus)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
