"""Loss-curve golden files (tests/golden/*.json): compare a short run's metrics, or rewrite them.

Regenerate after a change that is *meant* to move the numbers:
``TOOLBOX_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit -k golden`` and commit the JSON diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"


def run_recipe(tmp_path: Path, *overrides: str) -> list[dict[str, float]]:
    """A few steps of an experiment in-process (local mode, one rank), returning each step's metrics."""
    from toolbox.config import load_config
    from toolbox.driver.experiment import ExperimentBuilder

    cfg = load_config([*overrides, "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
                       "callbacks=[]", "trainer.eval_every=0", f"trainer.run_root={tmp_path}"])
    trainer = ExperimentBuilder(cfg).build_trainer()
    trainer.fit()
    return trainer.history


def check_golden(name: str, history: list[dict[str, float]], keys: list[str], rtol: float = 1e-4,
                 atol: float = 1e-5) -> None:
    """Assert ``history[*][keys]`` matches ``tests/golden/NAME.json`` (or rewrite it under TOOLBOX_REGEN_GOLDEN=1)."""
    path = GOLDEN_DIR / f"{name}.json"
    curves: dict[str, Any] = {k: [m[k] for m in history] for k in keys}
    if os.environ.get("TOOLBOX_REGEN_GOLDEN") == "1":
        path.write_text(json.dumps(curves, indent=1) + "\n")
        pytest.skip(f"rewrote {path}")
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with TOOLBOX_REGEN_GOLDEN=1")
    golden = json.loads(path.read_text())
    for key in keys:
        assert len(curves[key]) == len(golden[key]), f"{name}: {key} has {len(curves[key])} steps, golden {len(golden[key])}"
        for step, (got, want) in enumerate(zip(curves[key], golden[key])):
            assert got == pytest.approx(want, rel=rtol, abs=atol), f"{name}: {key} at step {step + 1}: {got} != golden {want}"
