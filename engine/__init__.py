"""engine: model loading, continuous batching, extraction API, CLI and HF integration.

Names are loaded lazily so that ``constrain --help`` and ``constrain compile`` start without
importing torch models they do not need.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "constrain.engine.api",
    "Request": "constrain.engine.api",
    "ExtractionError": "constrain.engine.api",
    "LengthError": "constrain.engine.api",
    "GenerationResult": "constrain.engine.types",
    "GenerationRequest": "constrain.engine.types",
    "SamplingParams": "constrain.engine.sampler",
    "Scheduler": "constrain.engine.scheduler",
    "load_model": "constrain.engine.model",
    "ModelLoadError": "constrain.engine.model",
    "ConstrainLogitsProcessor": "constrain.engine.hf_processor",
    "build_logits_processor": "constrain.engine.hf_processor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
