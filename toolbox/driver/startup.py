"""Where a run's start-up goes: seconds per phase, from the driver's launch to the end of its first step.

`StartupClock` is started by the entry point (`toolbox.run`) and marks the end of each phase on the driver:

- ``launch``: the process start (its creation time, as the OS recorded it) to ``main()``: the interpreter and the
  entry point's imports;
- ``config``: the config loaded and checked, the run directory made;
- ``ray_init``: ``ray.init`` (a new local instance's head processes, or the connection to a cluster);
- ``actors``: waiting for the worker actors: the algorithm's imports on the driver, placement groups, Ray
  starting the worker processes, their imports and model loads (all roles at once);
- ``process_group``: learner ranks joined in ``torch.distributed`` and each rank's learner built (model, FSDP2),
  as soon as the learner ranks are up (the other roles' actors may still be loading meanwhile: what is left of
  their wait afterwards counts to ``actors`` again);
- ``first_sync``: the trainer's ``prepare`` (resume, the first weight sync to the engines);
- ``first_step``: the first training step.

Each mark is logged (``startup: ray_init 3.10s (6.20s since launch)``); at the end of the first step the phases
go into that step's metrics as ``startup/<phase>_s`` (with ``startup/total_s``: launch to the end of the first
step) and into ``RUN_DIR/startup.json``. A phase the run goes through twice (a learner group started twice) adds up.
With them goes ``startup/cpu_s``: the CPU seconds of the driver's process tree so far, which holds every process
of a local Ray instance (its daemons and workers; steadier than wall time on a busy machine, and on a machine of
N cores the start-up cannot take less than ``startup/cpu_s / N`` of wall time).

Not covered: time spent before the process existed (a shell, ``ray job submit`` handing the job over), and the
split of ``actors`` between Ray's process start and each role's own constructor (Ray's timeline shows it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from toolbox.core.events import Event, EventBus

log = logging.getLogger(__name__)
PREFIX = "startup/"  # metric names end in ``_s``, as every wall-clock reading does (a resumed run's differ)
CPU = PREFIX + "cpu_s"


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its descendants alive now (0.0 without psutil)."""
    try:
        import psutil
    except ImportError:
        return 0.0
    me, total = psutil.Process(), 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        total += times.user + times.system
    return total


def launch_time() -> float:
    """When this process was created (seconds since the epoch), to the clock tick: its start in ticks since boot
    (``/proc/self/stat``) against the seconds since boot (``/proc/uptime``). Not psutil's ``create_time``: that adds
    the ticks to the boot time ``/proc/stat`` gives in whole seconds, up to a second early (the launch phase read
    1.0-1.1 s for a 0.2 s launch). Without ``/proc``: now."""
    try:
        stat = Path("/proc/self/stat").read_text()
        started_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command's ")"
        since_boot = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (since_boot - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class StartupClock:
    """Seconds of each start-up phase, marked in order on the driver (wall clock, so phases of one process and
    the waits on others add up to the launch-to-first-step time)."""

    def __init__(self, launched: float | None = None) -> None:
        self.launched = launch_time() if launched is None else launched
        self.last = self.launched
        self.phases: dict[str, float] = {}
        self.done = False  # the first step ended: later steps and marks add nothing
        self.cpu_s: float | None = None  # `tree_cpu_s` at the end of the first step

    def mark(self, phase: str) -> float:
        """End ``phase`` now: its seconds since the previous mark (added to what it already had). Returns them."""
        now = time.time()
        seconds, self.last = max(0.0, now - self.last), now
        if not self.done:
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds
            log.info("startup: %s %.2fs (%.2fs since launch)", phase, seconds, now - self.launched)
        return seconds

    def total(self) -> float:
        """Launch to the last mark."""
        return self.last - self.launched

    def metrics(self) -> dict[str, float]:
        """``startup/<phase>_s`` for every phase marked, ``startup/total_s``, and ``startup/cpu_s`` once measured."""
        cpu = {} if self.cpu_s is None else {CPU: round(self.cpu_s, 2)}
        return {**{f"{PREFIX}{k}_s": round(v, 3) for k, v in self.phases.items()},
                f"{PREFIX}total_s": round(self.total(), 3), **cpu}

    def summary(self) -> str:
        """One line: the total and each phase, in the order they ran."""
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.phases.items())
        cpu = "" if self.cpu_s is None else f"; {self.cpu_s:.1f} CPU s in the process tree"
        return f"{self.total():.1f}s to the end of step 1 ({parts}){cpu}"

    def attach(self, bus: EventBus, run_dir: Path | None = None) -> None:
        """Mark ``first_sync`` when the loop starts and ``first_step`` when its first step ends; that step's
        metrics get the phases (subscribe before the callbacks that record metrics, so they see them), and
        ``run_dir/startup.json`` is written."""
        def started(_: Event, payload: dict[str, Any]) -> None:
            self.mark("first_sync")

        def stepped(_: Event, payload: dict[str, Any]) -> None:
            if self.done:
                return
            self.mark("first_step")
            self.done, self.cpu_s = True, tree_cpu_s()
            payload["metrics"].update(self.metrics())
            if run_dir is not None:
                (run_dir / "startup.json").write_text(json.dumps(self.metrics(), indent=1))

        bus.subscribe(Event.FIT_START, started)
        bus.subscribe(Event.STEP_END, stepped)
