"""Peak memory and CPU time of a process tree: the fair measures when one side is one process and the other many.

TRL trains in one process; toolbox's run is its driver plus the Ray daemons (GCS, raylet) and worker
processes it starts, all descendants of the driver. Summing RSS over processes would count every shared
library page (libtorch) once per process, so the sampler sums PSS (proportional set size: a page shared
by n processes counts 1/n in each), read by psutil from ``/proc/PID/smaps_rollup``. It polls from a
daemon thread; a short peak between two samples can be missed (the period is stated with the figure).
CPU time (user + system, all threads) of the tree (`toolbox.startup.tree_cpu_s`) is the load-robust twin of wall time on a shared machine:
it counts the work done, not the waiting for cores other jobs hold (nor a side's own idle waits).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

import psutil

MIB = 1024.0 * 1024.0


def _tree(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and its live descendants (none when ``root`` itself is gone)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _sum_over_tree(root: psutil.Process, measure: Callable[[psutil.Process], float]) -> float:
    """``measure`` summed over ``root``'s tree; a process that vanishes meanwhile counts 0."""
    total = 0.0
    for proc in _tree(root):
        try:
            total += measure(proc)
        except psutil.Error:
            continue
    return total


def tree_pss_mib(root: psutil.Process) -> float:
    """PSS of ``root`` and all its descendants now, in MiB (processes that vanish meanwhile count 0)."""
    return _sum_over_tree(root, lambda p: p.memory_full_info().pss) / MIB


class PeakTreeMemory:
    """``with PeakTreeMemory() as mem: ...`` then ``mem.peak_mib``: the largest `tree_pss_mib` of this process's
    tree seen, polling every ``period_s`` seconds (and once at the start and the end)."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.peak_mib = 0.0
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="peak-tree-memory", daemon=True)

    def sample(self) -> float:
        now = tree_pss_mib(self._root)
        self.peak_mib = max(self.peak_mib, now)
        return now

    def _poll(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> PeakTreeMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
