"""Plain data types shared by the scheduler, the API and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from constrain import CompiledGrammar
from constrain.engine.sampler import SamplingParams

FinishReason = Literal["stop", "length", "error"]

# A transformers causal LM. Its submodules and config fields (``model.model.layers``,
# ``config.hidden_size``) are resolved at run time, per architecture, so the engine reads them
# dynamically rather than through ``torch.nn.Module``'s ``Tensor | Module`` attribute type.
CausalLM = Any


@dataclass
class GenerationRequest:
    """One prompt (as token ids) with its constraint, sampling settings and budget.

    ``stop_token_ids`` end *unconstrained* requests; a constrained request ends when its matcher
    accepts a stop token, which the grammar allows only where the document is complete.
    ``max_tokens`` bounds every token emitted, the stop token included. ``budget_close`` steers
    a constrained request to finish its document within that budget (constrain's budget-aware
    mask) instead of being cut off. ``matcher`` replaces ``grammar`` with a ready matcher object
    that has constrain's ``Matcher`` verbs (benchmarks drive the anchors this way); its masks are
    always filled on the host.
    """

    prompt_ids: list[int]
    grammar: CompiledGrammar | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 256
    stop_token_ids: frozenset[int] = frozenset()
    force_tokens: bool = True
    budget_close: bool = True
    matcher: Any = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class GenerationResult:
    """What one request produced.

    ``token_ids`` are the content tokens (the stop token is not included) and ``text`` their
    bytes decoded as UTF-8. ``finish_reason == "length"`` means the budget ran out first: for a
    constrained request the text is then an incomplete document, and ``valid`` is False.
    ``finish_reason == "error"`` means this request alone failed (a prompt longer than the
    model's context, a constraint that allowed no token or refused one its mask allowed);
    ``error`` says what, and the other requests of the batch were not affected.
    With speculation on, ``draft_tokens`` counts the draft tokens verified for this request
    (forced text riding along a draft not included) and ``accepted_draft_tokens`` those the
    target accepted; ``forced_tokens`` includes forced text emitted inside drafts. ``steps``:
    the decode steps (target forwards) the request took, so ``len(token_ids) / steps`` is its
    mean accepted length.
    """

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int = 0
    forced_tokens: int = 0
    constrained: bool = False
    error: str | None = None
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    steps: int = 0

    @property
    def valid(self) -> bool:
        """True only for complete outputs (finish_reason "stop")."""
        return self.finish_reason == "stop"
