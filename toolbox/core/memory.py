"""Peak memory and CPU time of a process tree: the fair measures when one side is one process and the other many.

TRL trains in one process; toolbox's run is its driver plus the Ray daemons (GCS, raylet) and worker
processes it starts, all descendants of the driver. Summing RSS over processes would count every shared
library page (libtorch) once per process, so the sampler sums PSS (proportional set size: a page shared
by n processes counts 1/n in each), read by psutil from ``/proc/PID/smaps_rollup``. It polls from a
daemon thread; a short peak between two samples can be missed (the period is stated with the figure).
Reading ``smaps_rollup`` walks a process's page tables: about 11 ms for a worker that maps torch (measured
with cProfile on a default run's driver), so a tree of 12 processes read every second would cost the poller
an eighth of a core. Each poll therefore reads the cheap RSS (``/proc/PID/statm``) of every process and reads
PSS only when the tree's summed RSS is 1% above its highest so far: the PSS peak rides on the RSS peak, since
the shared pages PSS divides stay mapped for a process's life.
CPU time (user + system, all threads) of the tree (`toolbox.driver.startup.tree_cpu_s`) is the load-robust twin of wall time on a shared machine:
it counts the work done, not the waiting for cores other jobs hold (nor a side's own idle waits).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
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


def _label(proc: psutil.Process) -> str:
    """A process as a person names it: Ray's title (``ray::RolloutWorker.generate``, ``raylet``), ``python -m
    MODULE``, or the program and its script (``python dashboard.py``)."""
    words = proc.cmdline() or [proc.name()]
    head = words[0].rsplit("/", 1)[-1]
    if "-m" in words[1:-1]:
        return f"{head} -m {words[words.index('-m') + 1]}"
    script = next((w.rsplit("/", 1)[-1] for w in words[1:] if w.endswith(".py")), "")
    return f"{head} {script}".strip()[:60]


def tree_pss_by_process(root: psutil.Process) -> list[tuple[str, float]]:
    """(label, PSS MiB) of each live process of ``root``'s tree, largest first."""
    found = []
    for proc in _tree(root):
        try:
            found.append((_label(proc), proc.memory_full_info().pss / MIB))
        except psutil.Error:
            continue
    return sorted(found, key=lambda row: -row[1])


class PeakTreeMemory:
    """``with PeakTreeMemory() as mem: ...`` then ``mem.peak_mib``: the largest `tree_pss_mib` of this process's
    tree seen, polling every ``period_s`` seconds (and once at the start and the end; PSS read at each new high of
    the summed RSS, as the module says); ``mem.at_peak`` holds
    each process's share at that moment (`tree_pss_by_process`), which says where the memory goes."""

    def __init__(self, period_s: float = 1.0) -> None:
        self.period_s = period_s
        self.peak_mib = 0.0
        self.at_peak: list[tuple[str, float]] = []
        self._rss_high = 0.0  # the tree's summed RSS when PSS was last read
        self._root = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="peak-tree-memory", daemon=True)

    def sample(self) -> None:
        """PSS of the tree, where its summed RSS reached a new high (1% over the last one read)."""
        rss = _sum_over_tree(self._root, lambda p: p.memory_info().rss)
        if rss <= self._rss_high * 1.01:
            return
        self._rss_high = rss
        rows = tree_pss_by_process(self._root)
        now = sum(mib for _, mib in rows)
        if now > self.peak_mib:
            self.peak_mib, self.at_peak = now, rows

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


class RunMemory:
    """A run's peak memory, as the driver sees it: `PeakTreeMemory` over the driver's process tree from the end of
    the start-up's config phase to the end of the run, reported in one line and in ``RUN_DIR/memory.json``.

    ``whole_run``: the driver started a local Ray instance, so its tree holds every process of the run (Ray's
    daemons and every actor) and the peak is the run's; otherwise (a cluster) it is the driver's alone, and the
    line says so. Polling once a second costs the driver well under a millisecond per process each time (RSS; PSS at new highs)."""

    def __init__(self, whole_run: bool, period_s: float = 1.0) -> None:
        self.whole_run = whole_run
        self.peak = PeakTreeMemory(period_s)
        self._running = False

    def start(self) -> RunMemory:
        self.peak.__enter__()
        self._running = True
        return self

    def stop(self) -> None:
        if self._running:
            self._running = False
            self.peak.__exit__(None, None, None)

    def finish(self, run_dir: Path) -> str:
        """Stop sampling, write ``run_dir/memory.json``, and say the peak and its three largest processes."""
        self.stop()
        scope = "all processes of the run" if self.whole_run else "the driver only: Ray runs elsewhere"
        at_peak = [{"process": label, "pss_mib": round(mib, 1)} for label, mib in self.peak.at_peak]
        record = {"peak_pss_mib": round(self.peak.peak_mib, 1), "whole_run": self.whole_run, "at_peak": at_peak}
        (run_dir / "memory.json").write_text(json.dumps(record, indent=1))
        largest = ", ".join(f"{row['process']} {row['pss_mib']:.0f}" for row in at_peak[:3])
        return (f"peak {self.peak.peak_mib / 1024:.2f} GiB PSS over {len(at_peak)} processes ({scope}; largest, MiB: "
                f"{largest}; RUN_DIR/memory.json)")
