"""The engine images and scripts agree with each other and with pyproject.toml (no Docker needed).

Each engine (vllm, sglang) pins its own torch, so it has its own Dockerfile; all images install the project
through deploy/docker/install-project.sh, whose requirement list must drop torch and nothing else.
Not covered: building the images (needs Docker and the network).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
INSTALL = DOCKER / "install-project.sh"


def _arg(text: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=\"?([^\"\s]+)\"?\s*$", text, re.MULTILINE)
    assert match, f"no `ARG {name}=...`"
    return match.group(1)


def _ray_pin() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in deps if d.startswith("ray["))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_image_matches_contract_script_and_ray_pin(engine: str) -> None:
    text = (DOCKER / f"Dockerfile.{engine}").read_text()
    version = _arg(text, f"{engine.upper()}_VERSION")
    script = (REPO / "scripts" / "engine_contracts.sh").read_text()
    assert f'{engine.upper()}_VERSION="${{{engine.upper()}_VERSION:-{version}}}"' in script
    assert _arg(text, "RAY_VERSION") == _ray_pin()
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-\$\{PYTHON_TAG\}-gpu$", text, re.MULTILINE)
    # The engine (and so its torch) comes first, the project after it.
    assert text.index(f'pip install "{engine}==') < text.index("toolbox-install-project deps")
    assert (DOCKER / f"Dockerfile.{engine}.dockerignore").resolve() == (DOCKER / "Dockerfile.dockerignore")


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.vllm", "Dockerfile.sglang"])
def test_every_image_installs_the_project_one_way(name: str) -> None:
    text = (DOCKER / name).read_text()
    assert "toolbox-install-project deps" in text and "toolbox-install-project project" in text
    assert "pip install -r" not in text, f"{name}: requirements outside install-project.sh could move torch"


def test_install_script_drops_torch_and_nothing_else(tmp_path: Path) -> None:
    snippet = re.search(r"python - <<'PY' > \S+\n(.*?)\nPY\n", INSTALL.read_text(), re.DOTALL)
    assert snippet, "install-project.sh: no requirements snippet"
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    out = subprocess.run([sys.executable, "-c", snippet.group(1)], cwd=tmp_path, capture_output=True, text=True,
                         check=True).stdout.split()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d.replace(" ", "") for d in deps if not d.startswith("torch")] == out
    assert not any(r.startswith("torch") for r in out) and any(r.startswith("ray[") for r in out)
