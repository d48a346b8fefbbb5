"""The user-facing engine: load a model once, generate under constraints, extract typed data.

``Engine`` ties the layers together: ``engine.model`` loads the checkpoint, constrain compiles
each constraint against the model's vocabulary (cached), and the one ``Scheduler`` batches every
request in one continuous batch, over CUDA-graph decode steps with the GPU state table where the
model is supported on CUDA (``backend="graph"``), else transformers' own forward (``"eager"``).
Generated JSON follows ``constraints.GENERATION_JSON_OPTIONS`` (declared order, no undeclared
keys unless the schema allows them explicitly); ``json_options=JSON_SCHEMA_SEMANTICS`` gives
full JSON Schema semantics. Results whose budget ran out are never handed back as valid: ``extract``
raises ``ExtractionError`` and ``generate(..., on_length="raise")`` raises ``LengthError``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from constrain import CompiledGrammar, Vocabulary
from constrain.engine.constraints import Constraint, schema_dict
from constrain.engine.generate import run_requests
from constrain.engine.graph_loop import GraphStep
from constrain.engine.graph_runner import GraphRunner
from constrain.engine.model import LoadedModel, load_model
from constrain.engine.runner import EagerStep, ModelRunner
from constrain.engine.sampler import SamplingParams
from constrain.engine.scheduler import Scheduler, StepBackend
from constrain.engine.speculative import SpeculativeConfig
from constrain.engine.static_decoder import supports
from constrain.engine.types import GenerationRequest, GenerationResult

logger = logging.getLogger("constrain")

DEFAULT_INSTRUCTIONS = (
    "Extract the information from the text below. Answer with one JSON object that follows the "
    "schema. Use only facts stated in the text."
)


class LengthError(RuntimeError):
    """A constrained generation hit ``max_tokens`` before the document was complete."""

    def __init__(self, message: str, result: GenerationResult) -> None:
        super().__init__(message)
        self.result = result


class ExtractionError(RuntimeError):
    """``Engine.extract`` could not produce a complete, valid object (``.result`` has the raw output)."""

    def __init__(self, message: str, result: GenerationResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class Request:
    """One prompt with its own constraint and sampling settings (for mixed batches).

    ``prompt`` is user text (wrapped in the chat template when the model has one, unless
    ``chat=False``) or a list of token ids used as is. At most one of ``json_schema``, ``regex``,
    ``grammar`` (Lark text) and ``choices`` may be set; ``json_options`` go to the JSON Schema
    compiler over the generation defaults (``property_order="declared"``,
    ``strict_properties=True``; ``constraints.JSON_SCHEMA_SEMANTICS`` for full JSON Schema
    semantics; ``whitespace=...``).
    """

    prompt: str | list[int]
    json_schema: Any = None
    regex: str | None = None
    grammar: str | None = None
    choices: Sequence[str] | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    system: str | None = None
    chat: bool | None = None
    stop_token_ids: Sequence[int] | None = None
    budget_close: bool = True
    json_options: Mapping[str, Any] | None = None

    def constraint(self) -> Constraint | None:
        return Constraint.from_args(self.json_schema, self.regex, self.grammar, self.choices, self.json_options)


Backend = Literal["auto", "graph", "eager"]


class Engine:
    """A loaded model plus a continuous-batching scheduler. Not thread-safe: one caller at a time.

    ``backend``: ``"graph"`` (CUDA-graph replay of the static decoder, constraint states in the
    GPU state table), ``"eager"`` (transformers' forward, host masks) or ``"auto"``: graph on
    CUDA for the models ``static_decoder.supports``, eager otherwise.

    ``speculative``: draft and verify several tokens per step (``engine.speculative``): "off"
    (the default), "forced" (the grammar's forced text), "lookup" (prompt lookup: spans copied
    from the prompt or output), "forced+lookup" (or True), or a ``SpeculativeConfig``. Output
    follows plain masked sampling exactly (greedy: the same tokens); results count the draft
    tokens proposed and accepted.
    """

    def __init__(self, loaded: LoadedModel, max_batch: int | None = None, backend: Backend = "auto",
                 speculative: SpeculativeConfig | str | bool | None = None) -> None:
        self.loaded = loaded
        self.vocab = Vocabulary.from_hf(
            loaded.tokenizer, vocab_size=loaded.logits_width, eos_tokens=list(loaded.eos_token_ids) or None
        )
        self.max_batch = max_batch or (64 if loaded.device.type == "cuda" else 16)
        if backend == "auto":
            backend = "graph" if loaded.device.type == "cuda" and supports(loaded.model) else "eager"
        if backend not in ("graph", "eager"):
            raise ValueError(f"backend must be 'auto', 'graph' or 'eager', got {backend!r}")
        self.backend = backend
        self.context_len: int | None = getattr(loaded.model.config, "max_position_embeddings", None)
        self._step: EagerStep | GraphStep | None = None
        self.speculative = SpeculativeConfig.parse(speculative)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        max_batch: int | None = None,
        backend: Backend = "auto",
        speculative: SpeculativeConfig | str | bool | None = None,
    ) -> Engine:
        """Load a local model folder or ``.gguf`` file (default: the SmolLM2-135M demo model)."""
        return cls(load_model(path, device=device, dtype=dtype), max_batch=max_batch, backend=backend,
                   speculative=speculative)

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    # -- compilation -------------------------------------------------------------------------
    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compile a constraint against this model's vocabulary (cached by constrain)."""
        return constraint.compile(self.vocab)

    # -- generation --------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def _to_request(self, r: Request) -> GenerationRequest:
        c = r.constraint()
        ids = list(r.prompt) if not isinstance(r.prompt, str) else self.loaded.encode_prompt(r.prompt, r.system, r.chat)
        stops = r.stop_token_ids if r.stop_token_ids is not None else self.loaded.eos_token_ids
        return GenerationRequest(
            prompt_ids=ids,
            grammar=self.compile(c) if c is not None else None,
            sampling=SamplingParams(r.temperature, r.top_p, r.top_k, r.seed),
            max_tokens=r.max_tokens,
            stop_token_ids=frozenset(int(t) for t in stops),
            budget_close=r.budget_close,
        )

    def _scheduler(self, reqs: Sequence[GenerationRequest]) -> Scheduler:
        """A scheduler over this engine's step backend, reallocated only when the KV cache is
        too small (too few slots, or too short for the longest request the context allows)."""
        context = self.context_len or 1 << 30
        need_len = max((min(len(r.prompt_ids) + r.max_tokens, context) for r in reqs
                        if len(r.prompt_ids) < context), default=1)  # others get an error result
        slots = min(self.max_batch, len(reqs))
        step = self._step
        if step is None or step.max_len < need_len or step.max_rows < slots:
            length = -(-max(need_len, step.max_len if step else 0) // 128) * 128
            slots = max(slots, step.max_rows if step else 0)
            self._step = step = None  # free the old cache before allocating the new one
            logger.debug("allocating KV cache: %d slots x %d tokens (%s)", slots, length, self.backend)
            model = self.loaded.model
            if self.backend == "graph":
                step = GraphStep(GraphRunner(model, slots, length), self.vocab.vocab_size)
            else:
                step = EagerStep(ModelRunner(model, slots, length), self.vocab.vocab_size)
            self._step = step
        backend: StepBackend = step
        return Scheduler(backend, self.vocab, self._encode, context_len=self.context_len,
                         speculative=self.speculative)

    def run(
        self,
        requests: Sequence[Request],
        on_result: Callable[[int, GenerationResult], None] | None = None,
    ) -> list[GenerationResult]:
        """Generate for a mixed batch (each request with its own constraint and settings)."""
        if not requests:
            return []
        reqs = [self._to_request(r) for r in requests]
        return run_requests(self._scheduler(reqs), reqs, on_result)

    def generate(
        self,
        prompts: str | Sequence[str],
        *,
        json_schema: Any = None,
        regex: str | None = None,
        grammar: str | None = None,
        choices: Sequence[str] | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        system: str | None = None,
        json_options: Mapping[str, Any] | None = None,
        on_length: Literal["return", "raise"] = "return",
        on_result: Callable[[int, GenerationResult], None] | None = None,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt (returns one result) or a list (returns a list).

        All prompts share the constraint and sampling settings; use ``run`` for mixed batches.
        ``json_options`` are JSON Schema compiler options (see ``constrain.compile_json_schema``).
        With a seed, request ``i`` uses ``seed + i`` so that batched prompts do not all draw the
        same random numbers.
        """
        single = isinstance(prompts, str)
        items: list[str] = [prompts] if isinstance(prompts, str) else list(prompts)
        for i, p in enumerate(items):
            if not isinstance(p, str):
                what = "a Request: pass Request objects to Engine.run" if isinstance(p, Request) else type(p).__name__
                raise TypeError(f"generate() takes a prompt string or a list of them; prompts[{i}] is {what}")
        reqs = [Request(p, json_schema, regex, grammar, choices, max_tokens, temperature, top_p, top_k,
                        None if seed is None else seed + i, system, json_options=json_options)
                for i, p in enumerate(items)]
        results = self.run(reqs, on_result)
        if on_length == "raise":
            for res in results:
                if res.finish_reason == "length" and res.constrained:
                    raise LengthError(f"max_tokens={max_tokens} ran out before the output was complete; "
                                      "raise max_tokens", res)
        return results[0] if single else results

    # -- extraction --------------------------------------------------------------------------
    def extract(
        self,
        text: str | Sequence[str],
        schema: Any,
        instructions: str | None = None,
        max_tokens: int = 512,
        **sampling: Any,
    ) -> Any:
        """Extract an object matching ``schema`` (pydantic model class or JSON Schema dict) from text.

        Returns a validated pydantic instance (or a dict for a dict schema); a list of them when
        ``text`` is a list. Raises ``ExtractionError`` when the budget runs out or validation fails.
        ``sampling`` goes to ``generate`` (``temperature``, ``seed``, ``json_options``...).
        """
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        sd = schema_dict(schema)
        prompts = [
            f"{instructions or DEFAULT_INSTRUCTIONS}\n\nJSON Schema:\n{json.dumps(sd)}\n\nText:\n{t}"
            for t in texts
        ]
        results = self.generate(prompts, json_schema=sd, max_tokens=max_tokens, **sampling)
        out = [_validate(res, schema, sd, max_tokens) for res in results]  # type: ignore[union-attr]
        return out[0] if single else out


def _validate(res: GenerationResult, schema: Any, sd: Any, max_tokens: int) -> Any:
    """Parse and validate one extraction output, or raise ``ExtractionError``."""
    if res.finish_reason == "length":
        raise ExtractionError(
            f"extraction stopped at max_tokens={max_tokens} before the JSON was complete "
            f"(partial output: {res.text[:80]!r}...); raise max_tokens", res)
    try:
        data = json.loads(res.text)
    except json.JSONDecodeError as exc:
        raise ExtractionError(f"output is not JSON ({exc}); this is a bug in the constraint", res) from exc
    if hasattr(schema, "model_validate"):
        try:
            return schema.model_validate(data)
        except Exception as exc:  # pydantic.ValidationError: keywords the schema cannot express
            raise ExtractionError(f"output does not validate against {schema.__name__}: {exc}", res) from exc
    import jsonschema

    try:
        jsonschema.validate(data, sd)
    except jsonschema.ValidationError as exc:
        raise ExtractionError(f"output does not validate against the schema: {exc.message}", res) from exc
    return data
