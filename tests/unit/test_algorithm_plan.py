"""An algorithm's wiring returns an `AlgorithmPlan` and starts nothing; the builder refuses anything else, naming the
algorithm and what to return (no Ray: the builder is only constructed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from toolbox.algorithms import ALGORITHMS
from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder


def test_a_wiring_that_returns_a_trainer_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(["experiment=grpo_tiny", "ray.local_mode=true", f"trainer.run_root={tmp_path}", "callbacks=[]"])
    builder = ExperimentBuilder(cfg)
    started: list[str] = []
    monkeypatch.setattr(builder, "group", lambda *a, **k: started.append("group"))
    monkeypatch.setattr(ALGORITHMS, "get", lambda name: SimpleNamespace(factory=lambda b: "a trainer"))
    with pytest.raises(TypeError, match=r"algorithm 'grpo': its wiring returned a str, not the AlgorithmPlan"):
        builder.build_trainer()
    assert started == []  # nothing was started for it
