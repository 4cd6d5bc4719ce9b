"""Ends what a driver's own local Ray instance leaves behind when the driver dies without cleaning up (SIGKILL).

Why it is needed: ``ray.init()`` starts the head processes (GCS, raylet, log monitor, dashboard) as children of
the driver with ``PR_SET_PDEATHSIG``, so they die with it. The raylet's own children, the dashboard agent and
the runtime-env agent, notice at once that the raylet is gone, but then try to report the unexpected death to
the GCS, which died too, with a 60 s timeout (``ray._private.process_watcher.report_raylet_error_logs``): they
linger a minute after every killed run. No ``ray.init`` option changes that, and no code of the driver runs
after a SIGKILL, so a second process has to.

The watchdog is that process: started by the driver just before ``ray.init``, it adds the driver's
descendants to its list every ``interval`` seconds from ``/proc`` while the driver lives (a process stays
listed after its parent died: the agents are orphaned the moment the raylet dies, which may come a moment
before the watchdog sees the driver gone); once the driver is gone (the watchdog is re-parented) it
SIGKILLs the listed processes still alive (same pid and start time: never a recycled pid) and exits. It ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group: the driver
shuts Ray down itself, then the watchdog finds nothing to do). On a normal exit the driver kills it.

Linux only (``/proc``); elsewhere `start` returns ``None``. Processes the driver started less than
``interval`` before dying may be missed; Ray's agents start with the instance, long before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LISTED_AFTER_S = 30.0  # by then a local instance's own processes (head, agents) have all started
Proc = tuple[int, int]  # (pid, start time in clock ticks since boot): one process; a recycled pid does not match


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22 of proc(5), counted after the command name


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.scandir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(task.path, "children").read_text().split()]
    except OSError:
        pass  # the process (or a thread of it) is gone
    return out


def descendants(root: int, skip: int) -> set[Proc]:
    """Every process below ``root`` (children, theirs, ...) except ``skip`` and what is below it."""
    found: set[Proc] = set()
    todo = [c for c in _children(root) if c != skip]
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None:
            found.add((pid, started))
            todo += [c for c in _children(pid) if c != skip]
    return found


def kill_survivors(procs: set[Proc]) -> list[int]:
    """SIGKILL each listed process that is still the same process; returns the pids killed."""
    killed = []
    for pid, started in procs:
        if _start_time(pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def watch(driver: int, interval: float, announce: bool = False) -> None:
    """Until ``driver`` (this process's parent) is gone, keep a list of its descendants; then kill those left.
    ``announce``: print a line once the first list is made (a test's cue)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    procs: set[Proc] = set()
    started, scans = time.monotonic(), 0
    while os.getppid() == driver:
        # A scan reads every thread's children of every process (Ray's have dozens): 5-10 ms of CPU. The
        # instance's own processes start in its first seconds: after LISTED_AFTER_S, every tenth turn scans.
        if time.monotonic() - started < LISTED_AFTER_S or scans % 10 == 0:
            # Cumulative: a process whose parent died (the agents, once the raylet is gone) is no longer below the
            # driver but still one of its instance's; only the ones that ended are dropped.
            procs = {p for p in procs if _start_time(p[0]) == p[1]} | descendants(driver, skip=os.getpid())
        scans += 1
        if announce:
            print(f"listed {len(procs)}", flush=True)
            announce = False
        time.sleep(interval)
    kill_survivors(procs)


def start(interval: float = 0.5, announce: bool = False) -> subprocess.Popen[bytes] | None:
    """The watchdog of this (driver) process, or ``None`` where there is no ``/proc``. With ``announce`` its
    stdout is a pipe that gets one line when the first list is made."""
    if not sys.platform.startswith("linux"):
        return None
    return subprocess.Popen([sys.executable, "-m", "toolbox.driver.watchdog", str(os.getpid()), str(interval),
                             *(["announce"] if announce else [])],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if announce else None)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), announce=sys.argv[3:] == ["announce"])
