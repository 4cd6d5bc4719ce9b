"""The driver's end: SIGKILL of ``python -m toolbox.run`` leaves no process of its Ray instance behind, and
SIGTERM stops it promptly (its actors shut down, exit code 143, a message saying so).

Only the processes of the run under test are looked at: the driver's own descendants, listed from /proc
before the signal (other Ray instances on the same machine are never touched).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolbox.driver.watchdog import Proc, _start_time, descendants

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")]


def title(pid: int) -> str:
    """The command line (Ray's processes rewrite theirs: ``ray::DashboardAgent``, ``ray::RolloutWorker.generate``)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def start_run(tmp_path: Path, *overrides: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "toolbox.run", f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0",
            "trainer.total_steps=10000", "rollout.num_workers=1", "reward.num_workers=1", "learner.num_workers=1",
            "learner.strategy=single", "algorithm.prompts_per_step=4", "ray.num_cpus=2", *overrides]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RAY_ADDRESS": ""})


def wait_for(driver: subprocess.Popen[str], titles: set[str], within_s: float = 240.0) -> set[Proc]:
    """The driver's descendants once each of ``titles`` is part of the command line of one of them."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"the run ended early: {driver.communicate()[0][-2000:]}"
        procs = descendants(driver.pid, skip=-1)
        running = [title(pid) for pid, _ in procs]
        if all(any(name in t for t in running) for name in titles):
            return procs
        time.sleep(0.5)
    driver.kill()
    pytest.fail(f"{titles} did not start within {within_s}s")


def survivors(procs: set[Proc], within_s: float) -> set[str]:
    """The titles of ``procs`` still alive after ``within_s`` seconds (polled: empty as soon as all are gone)."""
    deadline = time.monotonic() + within_s
    while True:
        alive = {title(pid) or str(pid) for pid, started in procs if _start_time(pid) == started}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def test_sigkill_of_the_driver_leaves_no_ray_process(tmp_path: Path) -> None:
    driver = start_run(tmp_path)
    procs = wait_for(driver, {"ray::DashboardAgent", "ray::RuntimeEnvAgent", "toolbox.driver.watchdog"})
    time.sleep(3.0)  # the watchdog lists the driver's descendants every 0.5 s (a loaded machine: a few rounds)
    killed = time.monotonic()
    driver.kill()
    driver.wait()
    # Without the watchdog the two agents linger 60 s (they report the raylet's death to a dead GCS).
    assert survivors(procs, within_s=20) == set()
    print(f"figures: SIGKILL of the driver -> its {len(procs)} processes gone in {time.monotonic() - killed:.1f}s")


@pytest.mark.slow
def test_sigterm_stops_the_run_and_its_actors_promptly(tmp_path: Path) -> None:
    driver = start_run(tmp_path)
    procs = wait_for(driver, {"ray::RolloutWorker", "ray::RewardWorker", "ray::LearnerWorker"})
    time.sleep(2.0)  # training under way
    sent = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    assert driver.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert "stopped by SIGTERM" in out
    exited = time.monotonic() - sent
    assert exited < 30, "SIGTERM took more than 30 s to stop the run"
    assert survivors(procs, within_s=20) == set()
    print(f"figures: SIGTERM -> exit 143 in {exited:.1f}s, all {len(procs)} processes gone in "
          f"{time.monotonic() - sent:.1f}s")
