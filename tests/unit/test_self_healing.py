"""Without Ray: the supervisor actor's bookkeeping, the driver's watchdog (real processes, SIGKILL), SIGTERM handling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from toolbox.actors.group import LocalGroup
from toolbox.actors.roles import RewardGroup
from toolbox.actors.supervisor import Supervisor, recover

from toolbox.driver.watchdog import _start_time, descendants, kill_survivors

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watchdog reads /proc")


def test_supervisor_hands_back_what_the_rank_loaded() -> None:
    sup = Supervisor()
    assert sup.weights_of(1) is None  # died before loading anything
    sup.loaded(0, ["bucket-a"])
    sup.loaded(0, ["bucket-b"])
    sup.loaded(1, ["bucket-c"])
    assert sup.weights_of(0) == ["bucket-b"]  # its own last load, not another rank's
    assert recover(None, 0) is None  # a group without restarts passes no supervisor


def test_in_process_groups_never_restart() -> None:
    assert RewardGroup(LocalGroup("reward", [object()])).restarts() == 0


def alive(pid: int, started: int | None) -> bool:
    return started is not None and _start_time(pid) == started


@linux
def test_descendants_and_kill_survivors_match_pid_and_start_time() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(sleeps := descendants(shell.pid, skip=-1)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sleeps) == 2
        assert shell.pid in {pid for pid, _ in descendants(os.getpid(), skip=-1)}  # children of children, too
        recycled = {(pid, started + 1) for pid, started in sleeps}  # same pid, another process: untouched
        assert kill_survivors(recycled) == []
        assert sorted(kill_survivors(sleeps)) == sorted(pid for pid, _ in sleeps)
        shell.wait(timeout=10)
    finally:
        shell.kill()


@linux
def test_watchdog_kills_what_a_sigkilled_driver_left(tmp_path: Path) -> None:
    """A stand-in driver starts a long-lived child (as ray.init starts the head) and a grandchild whose parent
    then exits (as the agents are orphaned when the raylet dies), then the watchdog, and is SIGKILLed."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time
        from toolbox.driver.watchdog import start
        child = subprocess.Popen(["sleep", "600"])
        parent = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; sleep 1"], stdout=subprocess.PIPE, text=True)
        orphan = parent.stdout.readline().strip()
        start(interval=0.1, announce=True).stdout.readline()  # its first list of this process's descendants
        parent.wait()  # the grandchild is orphaned: no longer below this process
        time.sleep(0.5)  # a few more rounds of the watchdog's listing
        print(child.pid, orphan, flush=True)
        time.sleep(600)
    """))
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in driver.stdout.readline().split()] if driver.stdout else []
        procs = {pid: _start_time(pid) for pid in pids}
        assert len(procs) == 2 and all(procs.values())
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid, started) for pid, started in procs.items()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid, started in procs.items() if alive(pid, started)] == [], "outlived the driver"
    finally:
        driver.kill()


def test_sigterm_unwinds_the_run_with_exit_code_143(capsys: pytest.CaptureFixture[str]) -> None:
    from toolbox.callbacks.console import stderr_console
    from toolbox.commands.run import SignalStop

    before = signal.getsignal(signal.SIGTERM)
    stop = SignalStop()
    assert signal.getsignal(signal.SIGTERM) == stop._handle  # else the SIGTERM below would end pytest itself
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at the next bytecode
    assert signal.getsignal(signal.SIGTERM) is before  # a second signal gets the default behaviour
    assert stop.report(stderr_console(), Path("runs/x")) == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err


class Counting:
    def __init__(self, restarts: int = 0, can_restart: bool = False) -> None:
        self.count, self.can_restart = restarts, can_restart

    def restarts(self) -> int:
        return self.count

    def restart(self) -> bool:
        if not self.can_restart:
            return False
        self.can_restart, self.count = False, self.count + 1
        return True


class FakeTrainer:
    """What `step_with_restarts` uses of an `OnlineTrainer`: roles that count restarts, a checkpoint to resume."""

    def __init__(self, run_dir: Path, can_restart: bool) -> None:
        from toolbox.config.trainer import TrainerConfig

        self.cfg, self.run_dir = TrainerConfig(), run_dir
        self.rollout, self.reward, self.learner = Counting(2), Counting(), Counting(can_restart=can_restart)
        self.resumed_from: list[str] = []

    def prepare(self) -> int:
        self.resumed_from.append(self.cfg.resume_from)
        return 3


def test_a_dead_learner_rank_restarts_the_group_and_redoes_the_steps_since_the_checkpoint(tmp_path: Path) -> None:
    from toolbox.core.errors import WorkerError
    from toolbox.trainers.checkpoints import COMPLETE
    from toolbox.trainers.healing import step_with_restarts

    for step in (2, 3):
        (tmp_path / "checkpoints" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step_{step}" / COMPLETE).touch()
    (tmp_path / "checkpoints" / "step_4.tmp").mkdir()  # a partial one is never chosen
    trainer, ran = FakeTrainer(tmp_path, can_restart=True), []

    def run_step(step: int) -> dict[str, float]:
        ran.append(step)
        if ran == [5]:
            raise WorkerError("learner", 1, "10.0.0.1", "update_planned died: ActorDiedError")
        return {"loss": float(step)}

    metrics = step_with_restarts(trainer, 5, run_step)  # type: ignore[arg-type]
    assert ran == [5, 3, 4, 5]  # failed, then steps 4 and 5 (indices 3, 4) redone from step_3, then step 6
    assert trainer.resumed_from == [str(tmp_path / "checkpoints" / "step_3")]
    assert metrics == {"loss": 5.0, "rollout_restarts": 2.0, "reward_restarts": 0.0, "learner_restarts": 1.0}


def test_a_learner_rank_dying_in_a_checkpoint_save_redoes_the_steps_since_the_last_complete_one(tmp_path: Path) -> None:
    from toolbox.core.errors import WorkerError
    from toolbox.trainers.checkpoints import COMPLETE
    from toolbox.trainers.healing import with_restarts

    (tmp_path / "checkpoints" / "step_3").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_3" / COMPLETE).touch()
    trainer, ran, saves = FakeTrainer(tmp_path, can_restart=True), [], []

    def save() -> str:  # the save of step 5 (steps 0-4 done): the first try loses a rank
        saves.append(list(ran))
        if len(saves) == 1:
            raise WorkerError("learner", 0, None, "save died: ActorDiedError")
        return "step_5"

    assert with_restarts(trainer, 5, ran.append, save) == "step_5"  # type: ignore[arg-type]
    assert saves == [[], [3, 4]]  # tried again once steps 4 and 5 (indices 3, 4) were redone from step_3
    assert trainer.learner.count == 1


def test_without_learner_restarts_left_or_for_another_role_the_error_stands(tmp_path: Path) -> None:
    from toolbox.core.errors import WorkerError
    from toolbox.trainers.healing import step_with_restarts

    for role, can_restart in (("learner", False), ("rollout", True)):
        def run_step(step: int, role: str = role) -> dict[str, float]:
            raise WorkerError(role, 0, None, "died")

        with pytest.raises(WorkerError, match=f"^{role} rank 0: died"):
            step_with_restarts(FakeTrainer(tmp_path, can_restart), 1, run_step)  # type: ignore[arg-type]


def test_learner_restarts_are_refused_where_no_online_loop_runs() -> None:
    from toolbox.config import load_config
    from toolbox.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"learner.max_restarts=1: only the online loop .* algorithm 'sft'"):
        load_config(["experiment=sft_tiny", "learner.max_restarts=1"])
