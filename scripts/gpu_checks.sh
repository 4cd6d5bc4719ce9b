#!/usr/bin/env bash
# The GPU checks (tests/gpu, marker `gpu`) on a CUDA machine that has torch and transformers but no Ray and
# maybe no pydantic: the learner rank on cuda (bf16, activation checkpointing, CPU offload, nccl), the hf
# engine on cuda with a weight sync into it, and -- where vllm / sglang are installed -- their generate,
# sleep/wake and weight-sync rounds. tests/gpu/test_real_size_gpu.py adds, one printed line each: the PPO critic
# under bf16, a single rank's bf16 autocast against fp32, SGLang's wake after a sleep without a weight load, the
# NCCL send after an update still queued on the learner's stream (2 GPUs), the IPC sync's peak memory (one bucket
# in bf16), and three GRPO steps with the hf engine on the learner's GPU (peak memory against the dry run's
# estimate, tokens/s). Without CUDA every test skips; none of them has run on a GPU yet.
#
#   scripts/gpu_checks.sh prepare   # where a registry is reachable: wheels of the small packages the GPU
#                                   # machine lacks, for its Python (GPU_PYTHON, default 3.12), into build/gpu-wheels
#   scripts/gpu_checks.sh           # on the GPU machine, from the repository root (carry build/gpu-wheels):
#                                   # installs those wheels into /tmp/gpu-site, then runs pytest -m gpu tests/gpu
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="$ROOT/build/gpu-wheels"
SITE="${GPU_SITE:-/tmp/gpu-site}"
PYTHON="${PYTHON:-python3}"

if [ "${1:-}" = "prepare" ]; then
    # Versions pinned to what this project's venv runs; pydantic-core is compiled, so it is fetched for the
    # GPU machine's Python and platform, not this one's.
    pins=$("$ROOT/.venv/bin/python" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in
               ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")))
PY
)
    mkdir -p "$WHEELS"
    # shellcheck disable=SC2086
    "$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --implementation cp \
        --python-version "${GPU_PYTHON:-3.12}" --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_28_x86_64 -d "$WHEELS" $pins
    ls -1 "$WHEELS"
    exit 0
fi

if ls "$WHEELS"/*.whl >/dev/null 2>&1 && ! "$PYTHON" -c "import pydantic" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"
# -s shows what the tests print (loss curves, peak memory); -rs the reason of every skip.
cd "$ROOT" && "$PYTHON" -m pytest -q -s -rs -m gpu -p no:cacheprovider tests/gpu "$@"
