"""engine: model loading, continuous batching, extraction API, CLI and HF integration.

Names are loaded lazily so that ``constrain --help`` and ``constrain compile`` start without
importing torch models they do not need.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "engine.api",
    "Request": "engine.api",
    "ExtractionError": "engine.api",
    "LengthError": "engine.api",
    "GenerationResult": "engine.types",
    "GenerationRequest": "engine.types",
    "SamplingParams": "engine.sampler",
    "Scheduler": "engine.scheduler",
    "load_model": "engine.model",
    "ModelLoadError": "engine.model",
    "ConstrainLogitsProcessor": "engine.hf_processor",
    "build_logits_processor": "engine.hf_processor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
