"""Reading what a ``python -m toolbox.run`` subprocess writes while it runs: its metrics records, and waiting for one.

Shared by the tests that kill a run (or a node under it) mid-way and look at what it wrote before and after.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TIMING = ("_s", "per_s", "_gb", "_idle")  # wall-clock, memory and idle-share readings differ between any two runs


def numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics a repeated run must reproduce exactly (timing and memory readings left out)."""
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING)}


def records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``RUN_DIR/metrics.jsonl`` so far (a line being written is skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the last line, half-written
            break
    return out


def steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Step -> metrics of the ``step_end`` records (a later life of a resumed run overwrites an earlier one's)."""
    return {r["step"]: r["metrics"] for r in records(run_dir) if r["event"] == "step_end"}


def wait_until(done: Callable[[], bool], what: str, proc: subprocess.Popen[Any], timeout_s: float,
               poll_s: float = 0.05) -> float:
    """Poll ``done`` until it holds; fails if the run exits first or ``timeout_s`` passes. Returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return time.monotonic()
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before {what}"
        time.sleep(poll_s)
    pytest.fail(f"no {what} within {timeout_s} s")


def wait_for(run_dir: Path, event: str, step: int, proc: subprocess.Popen[Any], timeout_s: float) -> float:
    """Wait until the run has written ``event`` of ``step`` to its metrics."""
    return wait_until(lambda: any(r["event"] == event and r["step"] == step for r in records(run_dir)),
                      f"{event} {step}", proc, timeout_s)
