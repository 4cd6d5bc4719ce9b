"""`early_start_wanted`: a local instance starts before the config loads only where nothing can ask for another."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.driver.local_ray import early_start_wanted


@pytest.fixture(autouse=True)
def no_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_the_default_run_and_plain_overrides_start_early() -> None:
    assert early_start_wanted([])
    assert early_start_wanted(["trainer.total_steps=3", "experiment=dapo_tiny"])  # a base chain without ray:


@pytest.mark.parametrize("args", [["ray.num_cpus=2"], ["ray.local_mode=true"], ["--dry-run"], ["--help"],
                                  ["experiment=does_not_exist"]])
def test_anything_that_may_ask_for_another_cluster_does_not(args: list[str]) -> None:
    assert not early_start_wanted(args)


def test_an_address_in_the_environment_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert not early_start_wanted([])


def test_a_ray_section_anywhere_in_the_base_chain_does_not(tmp_path: Path) -> None:
    (tmp_path / "root.yaml").write_text("ray: {num_cpus: 2}\n")
    (tmp_path / "mid.yaml").write_text(f"base: {tmp_path / 'root.yaml'}\ntrainer: {{total_steps: 2}}\n")
    (tmp_path / "plain.yaml").write_text("base: grpo_tiny\n")
    assert not early_start_wanted([f"experiment={tmp_path / 'mid.yaml'}"])
    assert early_start_wanted([f"experiment={tmp_path / 'plain.yaml'}"])


def test_shutdown_ends_the_autoscaler_monitor_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child running Ray's monitor script (here one that ignores SIGTERM, as the real one blocks in its handler)
    is killed before ``ray.shutdown``; another child is left alone."""
    import subprocess
    import sys

    import ray

    from toolbox.driver.local_ray import MONITOR_SCRIPT, shutdown

    script = tmp_path / MONITOR_SCRIPT
    script.parent.mkdir(parents=True)
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    other = tmp_path / "other.py"
    other.write_text("import time\ntime.sleep(60)\n")
    monitor, bystander = (subprocess.Popen([sys.executable, str(path)]) for path in (script, other))
    seen = []
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append(monitor.poll()))
    try:
        shutdown()
        assert monitor.wait(timeout=10) == -9 and seen and bystander.poll() is None
    finally:
        for proc in (monitor, bystander):
            proc.kill()
            proc.wait()
