"""A plugin package adds an algorithm without editing toolbox: the example `docs/examples/toolbox_raft`.

The package is installed for real (pip, into a temporary target directory) and found through
its ``toolbox.plugins`` entry point; the run is the real CLI in a subprocess, which starts its
own local Ray whose workers inherit ``PYTHONPATH`` and so import the plugin too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "toolbox_raft"
# Metrics only the raft learner reports (GRPO's learner reports pg_loss / kl / clip_frac instead).
RAFT_METRICS = {"sft_loss", "sft_tokens", "raft_kept_groups", "raft_best_reward"}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin installed with pip into a fresh directory (put it on PYTHONPATH to use it)."""
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(EXAMPLE, work / "src")  # the build writes build/ and *.egg-info beside its sources
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    assert (target / "toolbox_raft" / "__init__.py").exists()
    return target


def _env(plugin: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin), env.get("PYTHONPATH", "")) if p)
    return env


def test_registry_finds_the_plugin_through_its_entry_point(plugin_path: Path) -> None:
    probe = ("from toolbox.algorithms import ALGORITHMS; "
             "print(ALGORITHMS.names()); print(ALGORITHMS.get('raft').config.__module__)")
    out = subprocess.run([sys.executable, "-c", probe], env=_env(plugin_path), capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert "'raft'" in out[0] and "'grpo'" in out[0], out
    assert out[1] == "toolbox_raft.config"
    # Without the package on the path the name is unknown: the entry point, not toolbox, provides it.
    bare = subprocess.run([sys.executable, "-c", "from toolbox.algorithms import ALGORITHMS; print(ALGORITHMS.names())"],
                          capture_output=True, text=True, timeout=120, check=True).stdout
    assert "'raft'" not in bare


def test_raft_runs_three_steps_on_local_ray(plugin_path: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "toolbox.run", "experiment=grpo_tiny", "algorithm.name=raft",
           "algorithm.prompts_per_step=4", "algorithm.group_size=4", "algorithm.min_reward=0.0",
           "trainer.total_steps=3", "trainer.eval_every=0", f"trainer.run_root={tmp_path}", "trainer.run_name=raft",
           "rollout.num_workers=1", "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single",
           "callbacks=[{name: jsonl}]", "ray.num_cpus=2"]
    done = subprocess.run(cmd, env=_env(plugin_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "raft"
    steps = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if r["event"] == "step_end"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for record in steps:
        assert record["metrics"].keys() >= RAFT_METRICS, sorted(record["metrics"])
        assert "pg_loss" not in record["metrics"]  # the raft loop and learner ran, not GRPO's
    # min_reward=0 keeps the best sample of every group, so each step trained on response tokens.
    assert all(r["metrics"]["raft_kept_groups"] == 1.0 and r["metrics"]["sft_tokens"] > 0 for r in steps)
    assert "name: raft" in (run_dir / "config.yaml").read_text()
