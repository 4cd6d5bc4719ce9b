#!/usr/bin/env bash
# Contract tests against the RELEASED vLLM and SGLang packages (not the fakes CI uses).
#
# vllm and sglang each pin their own torch (vllm 0.33.0 -> torch 2.14.0, sglang 0.5.23 -> torch 2.14.1),
# neither of which is the project's torch==2.13.0, and not each other's: so each engine gets its own
# throwaway venv, the engine is installed first (it brings its torch), then the project with --no-deps
# plus the small pure-Python packages the tests import. Then tests/unit/test_engine_contracts.py runs
# in each venv: the tests that need the real package (importorskip) run there instead of skipping
# (among them the SGLang NCCL round: the learner's sender in a spawned process, SGLang's receiver over gloo).
#
# Needs about 10 GB of disk per venv (CUDA torch wheels; uv's cache hard-links what both share) and
# no GPU: the real receivers run with CUDA mocked.
#
#   scripts/engine_contracts.sh              # both engines, venvs deleted afterwards
#   KEEP_VENVS=1 scripts/engine_contracts.sh vllm     # one engine, keep the venv for another run
#   ENGINES_VENV=/data/ev scripts/engine_contracts.sh # venvs at /data/ev-vllm, /data/ev-sglang
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BASE="${ENGINES_VENV:-/tmp/engines-venv}"
PYTHON="${PYTHON:-python3.11}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$BASE-uv-cache}"
# Imported by the contract tests / the engine modules, besides what the engine brings.
TEST_DEPS=(pytest pytest-timeout "pydantic>=2.8,<3" "transformers>=5.0,<6" tokenizers safetensors pyyaml openai numpy)
ENGINES=("$@")
[ ${#ENGINES[@]} -gt 0 ] || ENGINES=(vllm sglang)

setup() {  # setup NAME PACKAGE_SPEC: a venv with the engine, then the project without deps
    local venv="$BASE-$1"
    if [ ! -x "$venv/bin/uv" ]; then
        "$PYTHON" -m venv "$venv"
        "$venv/bin/pip" install -q uv
    fi
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" "$2"
    # The engine's torch must survive the project install: --no-deps, and the test deps are
    # installed with the engine's torch already satisfying whatever they might ask for.
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" "${TEST_DEPS[@]}"
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps -e "$ROOT"
    "$venv/bin/python" -c "import torch, $1; print('$1', $1.__version__, 'torch', torch.__version__)"
}

status=0
for engine in "${ENGINES[@]}"; do
    case "$engine" in
        vllm) spec="vllm==$VLLM_VERSION" ;;
        sglang) spec="sglang==$SGLANG_VERSION" ;;
        *) echo "unknown engine '$engine' (vllm or sglang)" >&2; exit 2 ;;
    esac
    echo "=== $engine: $spec in $BASE-$engine"
    setup "$engine" "$spec"
    # -rs lists every skip with its reason: a real-package test must not skip here.
    (cd "$ROOT" && "$BASE-$engine/bin/python" -m pytest -q -rs -p no:cacheprovider \
        tests/unit/test_engine_contracts.py) || status=1
done

if [ "${KEEP_VENVS:-0}" != "1" ]; then
    for engine in "${ENGINES[@]}"; do rm -rf "$BASE-$engine"; done
    rm -rf "$UV_CACHE_DIR"
fi
exit $status
