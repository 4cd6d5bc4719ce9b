"""`toolbox.commands.run.main` end to end in ``ray.local_mode`` (in-process groups, no Ray): files, checkpoint, resume, exit codes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from toolbox.commands.run import main
from toolbox.driver.local_ray import WORKER_ENV

LOCAL = ["ray.local_mode=true", "learner.num_workers=1", "learner.strategy=single", "callbacks=[{name: jsonl}]"]


@pytest.fixture(autouse=True)
def isolated_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process workers set torch threads and the worker environment; undo both after the test."""
    for key, value in WORKER_ENV.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    rng = torch.get_rng_state()
    yield
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_local_run_then_resume(tmp_path: Path) -> None:
    assert main([*LOCAL, "trainer.total_steps=3", f"trainer.run_root={tmp_path}"]) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert run_dir.name.startswith("grpo_tiny-")

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["trainer"]["total_steps"] == 3 and cfg["ray"]["local_mode"] is True
    assert cfg["callbacks"] == [{"name": "jsonl", "filename": "metrics.jsonl", "samples_filename": "samples.jsonl"}]
    steps = [r for r in records(run_dir) if r["event"] == "step_end"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        m = r["metrics"]
        assert {"loss", "pg_loss", "kl", "grad_norm", "reward", "response_len"} <= m.keys()
        assert all(math.isfinite(m[k]) for k in ("loss", "pg_loss", "kl", "grad_norm"))
    saved = [r for r in records(run_dir) if r["event"] == "checkpoint_saved"]
    assert [r["step"] for r in saved] == [3]
    assert (run_dir / "checkpoints" / "step_3" / ".metadata").exists()

    # Resume from the run directory (its latest checkpoint), writing into the same run directory.
    resume = [*LOCAL, "trainer.total_steps=5", f"trainer.run_root={tmp_path}", f"trainer.run_name={run_dir.name}",
              f"trainer.resume_from={run_dir}"]
    assert main(resume) == 0
    steps = [r["step"] for r in records(run_dir) if r["event"] == "step_end"]
    assert steps == [1, 2, 3, 4, 5]
    assert (run_dir / "checkpoints" / "step_5" / ".metadata").exists()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["total_steps"] == 5


def test_bad_config_exits_2_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["learner.num_workers=3", f"trainer.run_root={tmp_path}"]) == 2
    assert "batch arithmetic" in capsys.readouterr().err
    assert main(["experiment=does_not_exist"]) == 2
    assert main(["algorithm.group_sise=3"]) == 2
    assert main(['algorithm.kl_kind="[bold]k4"']) == 2
    assert "'[bold]k4'" in capsys.readouterr().err  # printed as text, not eaten as rich markup
    assert list(tmp_path.iterdir()) == []  # no run directory for a config that never ran


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    err = capsys.readouterr().err
    assert "[experiment=NAME]" in err and "[a.b.c=value ...]" in err


def test_a_missing_model_path_fails_before_anything_starts(tmp_path: Path) -> None:
    from toolbox.commands.run import main

    assert main(["model.path=/nonexistent/model", "model.tiny=null", f"trainer.run_root={tmp_path}"]) == 2
    assert not list(tmp_path.iterdir())


def test_a_user_model_directory_loads_through_from_pretrained(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The hub-loading path (model.path, model.tiny=null), exercised on a local directory."""
    from toolbox.commands.run import main

    assert main(["ray.local_mode=true", "learner.num_workers=1", "learner.strategy=single", "trainer.total_steps=1",
                 "callbacks=[]", "trainer.eval_every=0", f"model.path={tiny_model_dir}", "model.tiny=null",
                 f"trainer.run_root={tmp_path}"]) == 0
