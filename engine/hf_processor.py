"""Use constrain from Hugging Face ``model.generate`` as a ``LogitsProcessor``.

Why: users who already drive generation through transformers should get guaranteed-valid
output by adding one argument, ``logits_processor=[...]``, without switching engines. The
processor keeps one ``Matcher`` per batch row, feeds it the token HF appended last step, fills
the shared bitmask and applies it (kernels' ``apply_token_bitmask_inplace`` via the sampler).

Works with greedy search and sampling, batched or not. Beam search reorders rows between steps
and is not supported (the matchers would follow the wrong beams).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from constrain import CompiledGrammar, Matcher, Vocabulary, allocate_token_bitmask
from constrain.engine.constraints import Constraint
from constrain.engine.sampler import apply_bitmask
from constrain.engine.types import FinishReason

try:
    from transformers import LogitsProcessor
except ImportError:  # pragma: no cover - transformers is an optional extra
    LogitsProcessor = object  # type: ignore[assignment,misc]


class ConstrainLogitsProcessor(LogitsProcessor):
    """Masks each row's scores to the tokens its constraint allows.

    ``grammars`` is one ``CompiledGrammar`` for every row or one per row. A processor serves a
    single ``generate`` call: call ``reset()`` (or build a new one) before the next; a processor
    reused without it raises instead of masking from a finished state. After ``generate``,
    ``finish_reasons(output_ids)`` says which rows completed their document ("stop") and which
    ran out of ``max_new_tokens`` first ("length": the text is cut and does not satisfy the
    constraint).
    """

    def __init__(self, grammars: CompiledGrammar | Sequence[CompiledGrammar]) -> None:
        self._grammars = grammars
        self._matchers: list[Matcher] | None = None
        self._seen: torch.Tensor | None = None  # input_ids of the last call
        self._bitmask: torch.Tensor | None = None

    def reset(self) -> None:
        """Forget the last ``generate`` call's rows, so that the processor can serve another."""
        self._matchers = None

    def _start(self, batch: int, width: int) -> None:
        gs = [self._grammars] * batch if isinstance(self._grammars, CompiledGrammar) else list(self._grammars)
        if len(gs) != batch:
            raise ValueError(f"got {len(gs)} grammars for a batch of {batch} rows")
        size = self.vocab.vocab_size
        if width != size:
            raise ValueError(f"the model's logits are {width} wide but the constraint was compiled for "
                             f"{size} token ids: pass model= (or vocab_size={width}) to build_logits_processor")
        self._matchers = [g.matcher() for g in gs]
        self._bitmask = allocate_token_bitmask(batch, size)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        batch, length = input_ids.shape
        if self._matchers is None:
            self._start(batch, scores.shape[-1])
        elif not self._continues(input_ids):
            raise RuntimeError("this ConstrainLogitsProcessor already served a generate call (these input_ids "
                               "do not extend the last ones by one token): call reset() before reusing it, or "
                               "build a new one; beam search is not supported")
        else:
            self._advance(input_ids[:, -1].tolist())
        self._seen = input_ids
        assert self._matchers is not None and self._bitmask is not None
        for row, m in enumerate(self._matchers):
            m.fill_next_token_bitmask(self._bitmask, row)
        apply_bitmask(scores, self._bitmask.to(scores.device, non_blocking=True), None)
        return scores

    def _continues(self, input_ids: torch.Tensor) -> bool:
        """Whether ``input_ids`` are the last call's plus one token per row (the same generate call)."""
        seen = self._seen
        return seen is not None and input_ids.shape == (seen.shape[0], seen.shape[1] + 1) \
            and torch.equal(input_ids[:, :-1], seen)

    def _advance(self, tokens: Sequence[int]) -> None:
        assert self._matchers is not None
        for row, (m, tok) in enumerate(zip(self._matchers, tokens)):
            # After the stop token HF keeps appending padding/EOS to finished rows: ignore it.
            if not m.is_terminated() and not m.accept_token(int(tok)):
                raise RuntimeError(f"row {row}: token {tok} violates the constraint (was beam search used, or "
                                   "another processor run after this one?)")

    def finish_reasons(self, output_ids: torch.Tensor) -> list[FinishReason]:
        """Per row of ``generate``'s output: "stop" if the constraint's document is complete and
        ended with a stop token, "length" if ``max_new_tokens`` cut it (not a valid output).

        HF never shows a processor the last token it appends; this accepts it first.
        """
        if self._matchers is None or self._seen is None:
            raise RuntimeError("finish_reasons() needs the output of a generate call that used this processor")
        if self._continues(output_ids):
            self._advance(output_ids[:, -1].tolist())
            self._seen = output_ids
        elif not torch.equal(output_ids, self._seen):
            raise ValueError("output_ids are not the output of the generate call that used this processor")
        return ["stop" if m.is_terminated() else "length" for m in self._matchers]

    @property
    def vocab(self) -> Vocabulary:
        """The vocabulary the masks are sized for (its ``vocab_size`` is the logits width)."""
        g = self._grammars
        return (g if isinstance(g, CompiledGrammar) else g[0]).vocab

    @property
    def matchers(self) -> list[Matcher]:
        """The per-row matchers (for the final state, call ``finish_reasons`` first)."""
        return list(self._matchers or [])


def build_logits_processor(
    tokenizer: Any,
    *,
    json_schema: Any = None,
    regex: str | None = None,
    grammar: str | None = None,
    choices: Sequence[str] | None = None,
    json_options: Mapping[str, Any] | None = None,
    model: Any = None,
    vocab_size: int | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> ConstrainLogitsProcessor:
    """Compile one constraint for ``tokenizer`` and wrap it as a processor.

    With ``model``, the masks are sized to its logits width (which may be padded past the
    tokenizer) and the stop tokens are those its ``generation_config`` stops on; ``vocab_size``
    and ``eos_token_ids`` set them by hand (defaults without a model: ``len(tokenizer)`` and the
    tokenizer's EOS). ``json_options`` go to the JSON Schema compiler, over the engine's
    generation defaults (declared order, no undeclared keys).
    """
    c = Constraint.from_args(json_schema, regex, grammar, choices, json_options)
    if c is None:
        raise ValueError("give one of json_schema, regex, grammar, choices")
    if model is not None:
        vocab_size = vocab_size or int(model.get_output_embeddings().weight.shape[0])
        eos_token_ids = eos_token_ids or _generation_eos(model)
    vocab = Vocabulary.from_hf(tokenizer, vocab_size=max(vocab_size or 0, len(tokenizer)),
                               eos_tokens=list(eos_token_ids) if eos_token_ids else None)
    return ConstrainLogitsProcessor(c.compile(vocab))


def _generation_eos(model: Any) -> list[int]:
    """The ids ``model.generate`` stops on (its generation config's ``eos_token_id``, int or list)."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]
