#!/usr/bin/env bash
# The H200 measurements of the one engine (BENCHMARKS.md, "Engine on the H200 (one scheduler)"),
# one device call per step. Why a script: a call carries at most 64 MiB, so SmolLM2's 98 MB GGUF
# travels in two halves (git-ignored .gguf/part1, .gguf/part2, split here with head -c / tail -c)
# in two calls made back to back on the same warm machine; the first half waits in /tmp.
#   here, once:  python3 bench/engine_gpu.py --prepare ../shared/data --data .bench_data
#   call 1 (carry .whl .whl_anchors .bench_data/schemas.json .bench_data/llama3.json
#           .bench_data/llama3.tiktoken .gguf/part1):  bash bench/engine_h200.sh llama8b
#   call 2 (carry .whl .whl_anchors .bench_data/schemas.json .gguf/part2 .gguf/SHA256):
#           bash bench/engine_h200.sh smollm2
#   (name the files: .bench_data as a whole, with its copy of the corpus, pushes a call over 64 MiB;
#   three sweeps by default: smollm2 ~190 s, llama8b ~280 s; further arguments go to engine_gpu.py,
#   e.g. --modes none,constrain,constrain_defaults)
#     then, with the model joined in /tmp (carry .whl .whl_anchors .bench_data): ... extraction,
#     ... speculative [bench.speculative's flags], ... draft_head [bench.draft_head's flags]
#   no model (carry .whl .whl_anchors .whl_llama .bench_full: a copy of ../shared/data): ... batch_fill
#   (on a fresh machine, stage part 1 first: carry .whl .gguf/part1, bash bench/engine_h200.sh stage)
# .whl* folders hold the packages the device image lacks: .whl (lark, jsonschema, gguf, pydantic...),
# .whl_anchors (xgrammar, apache-tvm-ffi, llguidance's site folder), .whl_llama (llama-models'
# Llama-3 vocabulary); each call carries the ones it needs (a call carries at most 64 MiB).
# Made here with pip download for the device's Python (3.12, manylinux x86_64), for example:
#   DL="python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   $DL -d .whl lark jsonschema jsonschema-specifications referencing rpds-py pydantic pydantic-core \
#       annotated-types typing-inspection typing-extensions gguf nanobind
#   $DL -d .whl_anchors xgrammar apache-tvm-ffi;  $DL -d .whl_llama llama-models
#   mkdir -p .bench_full && cp -a ../shared/data .bench_full/shared_data   (all git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
GGUF=/tmp/smol/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=${OUT:-/tmp/out}

setup() {
    # every carried wheel folder (.whl, .whl_anchors, ...): what this call needs travels, under 64 MiB
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl*/*.whl
    for t in .whl*/*-site.tgz; do if [ -f "$t" ]; then tar xzf "$t" -C /tmp/site; fi; done
    # The folders install as one namespace (pyproject's wheel.packages); here links make it so.
    for d in grammars engine kernels; do ln -sfn "../$d" "constrain/$d"; done
    build_core
    python3 -c "import constrain.token_trie as t; print('constrain._core:', t._core)"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
}

build_core() {  # constrain._core (cpp/, nanobind), the native hot path; without it, the Python twin
    if [ ! -f /tmp/core/done ]; then
        if cmake -S . -B /tmp/core -G Ninja -DSKBUILD_PROJECT_NAME=constrain -DCMAKE_BUILD_TYPE=Release \
            -Dnanobind_DIR="$(python3 -m nanobind --cmake_dir)" -DPython_EXECUTABLE="$(command -v python3)" \
            >/tmp/core.log 2>&1 && cmake --build /tmp/core >>/tmp/core.log 2>&1; then
            touch /tmp/core/done
        else
            tail -5 /tmp/core.log
            return 0
        fi
    fi
    cp /tmp/core/_core*.so constrain/
}

suite() {  # $1: model name, rest: extra arguments
    local name=$1
    shift
    python3 bench/engine_gpu.py --suite graph --models "$name" --data .bench_data --batches 1,16,64,256 \
        --max-tokens 64 --out "$OUT/engine_$name.json" "$@" 2>&1 | tee "$OUT/engine_$name.log"
}

join_gguf() {
    [ -f "$GGUF" ] && return
    [ -f /tmp/gguf.part1 ] || { echo "no /tmp/gguf.part1: this is a fresh machine, run call 1 again first"; exit 3; }
    mkdir -p "$(dirname "$GGUF")"
    cat /tmp/gguf.part1 .gguf/part2 > "$GGUF.tmp"
    [ "$(sha256sum < "$GGUF.tmp" | cut -d' ' -f1)" = "$(cut -d' ' -f1 .gguf/SHA256)" ] || { echo "sha256 mismatch"; exit 4; }
    mv "$GGUF.tmp" "$GGUF"
    echo "joined $GGUF, sha256 ok"
}

set -o pipefail
setup
case "${1:-}" in
    stage)
        cp .gguf/part1 /tmp/gguf.part1 ;;
    llama8b)
        cp .gguf/part1 /tmp/gguf.part1
        suite llama8b "${@:2}" ;;
    smollm2)
        join_gguf
        suite smollm2 --model "$GGUF" "${@:2}" ;;
    extraction)
        join_gguf
        # bench.extraction reads the corpus from ../shared/data beside the checkout.
        mkdir -p ../shared && ln -sfn "$PWD/.bench_data/shared_data" ../shared/data
        python3 -m bench.extraction --device cuda --model "$GGUF" --limit 100 --batch-size 100 \
            --jsonl "$OUT/extraction.jsonl" 2>&1 | tee "$OUT/extraction.log" ;;
    draft_head)
        join_gguf
        mkdir -p ../shared && ln -sfn "$PWD/.bench_data/shared_data" ../shared/data
        python3 -m bench.draft_head --device cuda --model "$GGUF" --out-dir "$OUT" "${@:2}" 2>&1 | tee "$OUT/draft_head.log" ;;
    batch_fill)  # issue 12's batch fill at the host's 16 threads (carry .whl .whl_anchors .whl_llama .bench_full)
        mkdir -p ../shared && ln -sfn "$PWD/.bench_full/shared_data" ../shared/data
        python3 bench/batch_fill.py --tokenizer llama3 --batches 64,256 --threads 16 --schemas 16 "${@:2}" 2>&1 \
            | tee "$OUT/batch_fill.log" ;;
    speculative)
        join_gguf
        mkdir -p ../shared && ln -sfn "$PWD/.bench_data/shared_data" ../shared/data
        python3 -m bench.speculative --device cuda --model "$GGUF" "${@:2}" 2>&1 | tee -a "$OUT/speculative.log" ;;
    *)
        echo "usage: $0 stage|llama8b|smollm2|extraction|draft_head|speculative|batch_fill"; exit 2 ;;
esac
