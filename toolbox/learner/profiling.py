"""``trainer.profile_steps``: a ``torch.profiler`` trace of a learner rank over chosen training steps.

Each rank writes ``RUN_DIR/profile/step_N/rank_R.pt.trace.json``, a Chrome trace that Perfetto (ui.perfetto.dev)
and ``chrome://tracing`` open; the ``.pt.trace.json`` ending is what TensorBoard's profiler plugin
(torch-tb-profiler) looks for, so ``tensorboard --logdir RUN_DIR/profile`` lists each step as a run and each rank
as a worker. It records the rank's torch operators on the
CPU (and CUDA kernels where the rank has a GPU), their input shapes and memory. Not covered: the driver and
the rollout workers (the driver's own split of a step is in the step metrics).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class RankProfiler:
    """One rank's profiler: `start` before a step's work, `stop` after it writes the trace."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.active: Any = None
        self.out: Path | None = None

    def start(self, directory: str) -> None:
        from torch.profiler import ProfilerActivity, profile

        if self.active is not None:
            raise RuntimeError(f"learner rank {self.rank}: a profile is already being recorded")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.out = Path(directory) / f"rank_{self.rank}.pt.trace.json"
        self.active = profile(activities=activities, record_shapes=True, profile_memory=True)
        self.active.__enter__()

    def stop(self) -> str:
        """End the recording and write the trace; returns its path."""
        if self.active is None or self.out is None:
            raise RuntimeError(f"learner rank {self.rank}: stop without start")
        self.active.__exit__(None, None, None)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.active.export_chrome_trace(str(self.out))
        self.active = None
        return str(self.out)
