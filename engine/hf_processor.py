"""Use constrain from Hugging Face ``model.generate`` as a ``LogitsProcessor``.

Why: users who already drive generation through transformers should get guaranteed-valid
output by adding one argument, ``logits_processor=[...]``, without switching engines. The
processor keeps one ``Matcher`` per batch row, feeds it the token HF appended last step, fills
the shared bitmask and applies it (kernels' ``apply_token_bitmask_inplace`` via the sampler).

Works with greedy search and sampling, batched or not. Beam search reorders rows between steps
and is not supported (the matchers would follow the wrong beams).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from constrain import CompiledGrammar, Matcher, Vocabulary, allocate_token_bitmask
from constrain.engine.constraints import Constraint
from constrain.engine.sampler import apply_bitmask

try:
    from transformers import LogitsProcessor
except ImportError:  # pragma: no cover - transformers is an optional extra
    LogitsProcessor = object  # type: ignore[assignment,misc]


class ConstrainLogitsProcessor(LogitsProcessor):  # type: ignore[misc]
    """Masks each row's scores to the tokens its constraint allows.

    ``grammars`` is one ``CompiledGrammar`` for every row or one per row. A processor serves a
    single ``generate`` call: create a new one (or call ``reset``) for the next.
    """

    def __init__(self, grammars: CompiledGrammar | Sequence[CompiledGrammar]) -> None:
        self._grammars = grammars
        self._matchers: list[Matcher] | None = None
        self._prompt_len = 0
        self._bitmask: torch.Tensor | None = None

    def reset(self) -> None:
        self._matchers = None

    def _start(self, batch: int) -> None:
        gs = [self._grammars] * batch if isinstance(self._grammars, CompiledGrammar) else list(self._grammars)
        if len(gs) != batch:
            raise ValueError(f"got {len(gs)} grammars for a batch of {batch} rows")
        self._matchers = [g.matcher() for g in gs]
        self._bitmask = allocate_token_bitmask(batch, gs[0].vocab.vocab_size)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if self._matchers is None:
            self._start(batch)
            self._prompt_len = length
        elif length > self._prompt_len:
            last = input_ids[:, -1].tolist()
            for m, tok in zip(self._matchers, last):
                # After the stop token HF keeps appending padding/EOS to finished rows: ignore it.
                if not m.is_terminated() and not m.accept_token(int(tok)):
                    raise RuntimeError(f"token {tok} violates the constraint: was the processor reused "
                                       "across generate calls, or beam search used?")
        self._prompt_len = length
        assert self._matchers is not None and self._bitmask is not None
        for row, m in enumerate(self._matchers):
            m.fill_next_token_bitmask(self._bitmask, row)
        apply_bitmask(scores, self._bitmask.to(scores.device, non_blocking=True), None)
        return scores

    @property
    def matchers(self) -> list[Matcher]:
        """The per-row matchers. HF stops without showing the processor the final stop token, so
        check ``is_accepting()`` (not ``is_terminated()``) after generation."""
        return list(self._matchers or [])


def build_logits_processor(
    tokenizer: Any,
    *,
    json_schema: Any = None,
    regex: str | None = None,
    grammar: str | None = None,
    choices: Sequence[str] | None = None,
    vocab_size: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> ConstrainLogitsProcessor:
    """Compile one constraint for ``tokenizer`` and wrap it as a processor.

    ``vocab_size`` should be the model's logits width (``model.config.vocab_size``) when it is
    padded past the tokenizer. ``eos_token_ids`` must match what ``generate`` stops on
    (default: the tokenizer's EOS).
    """
    c = Constraint.from_args(json_schema, regex, grammar, choices)
    if c is None:
        raise ValueError("give one of json_schema, regex, grammar, choices")
    vocab = Vocabulary.from_hf(tokenizer, vocab_size=max(vocab_size or 0, len(tokenizer)) or None,
                               eos_tokens=list(eos_token_ids) if eos_token_ids else None)
    return ConstrainLogitsProcessor(c.compile(vocab))
