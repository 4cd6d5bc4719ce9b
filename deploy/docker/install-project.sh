#!/bin/sh
# Installs toolbox into an image whose torch (and engine) are already installed, without ever moving torch:
#   install-project.sh deps      the project's dependencies from ./pyproject.toml except torch, constrained to
#                                the torch already there, so that no requirement can move it
#   install-project.sh project   the repository itself (editable, --no-deps), then a check that torch is unchanged;
#                                its import also writes transformers' import map into the image (the containers'
#                                processes read it instead of parsing transformers' model files: toolbox/core/import_cache.py)
# Every Dockerfile in this folder uses it, so the CPU, GPU, vllm and sglang images install the project one way.
set -eu
torch_now() { python -c "import torch; print(torch.__version__.split('+')[0])"; }
case "${1:-}" in
deps)
    torch_now > /tmp/torch-version
    python - <<'PY' > /tmp/toolbox-requirements.txt
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if re.split(r"[\[=<>~! ;]", d, maxsplit=1)[0] != "torch"))
PY
    echo "torch==$(cat /tmp/torch-version)" > /tmp/torch-constraint.txt
    pip install -r /tmp/toolbox-requirements.txt -c /tmp/torch-constraint.txt
    ;;
project)
    pip install --no-deps -e .
    want=$(cat /tmp/torch-version 2>/dev/null || torch_now)
    test "$(torch_now)" = "$want" || { echo "torch moved from $want to $(torch_now)" >&2; exit 1; }
    python -c "import toolbox, torch, ray, transformers.models; print('toolbox', toolbox.__file__, 'torch', torch.__version__, 'ray', ray.__version__)"
    ;;
*) echo "usage: install-project.sh deps|project" >&2; exit 2 ;;
esac
