"""`toolbox.core.memory.RunMemory`: the driver's peak over its process tree, its children included."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from toolbox.core.memory import RunMemory

HOLD = "import sys, time; block = bytearray(160 * 1024 * 1024); print('ready', flush=True); time.sleep(30)"


def test_the_peak_counts_a_child_process_and_is_written_to_memory_json(tmp_path: Path) -> None:
    memory = RunMemory(whole_run=True, period_s=0.05).start()
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # a few samples with the child's 160 MiB resident
        line = memory.finish(tmp_path)
    finally:
        child.kill()
        child.wait()
    record = json.loads((tmp_path / "memory.json").read_text())
    assert record["whole_run"] is True and record["peak_pss_mib"] >= 160
    child_rows = [row for row in record["at_peak"] if row["process"].startswith("python") and row["pss_mib"] >= 155]
    assert child_rows, record["at_peak"]
    assert line.startswith(f"peak {record['peak_pss_mib'] / 1024:.2f} GiB PSS over {len(record['at_peak'])} processes")
    assert "all processes of the run" in line


def test_a_run_on_a_cluster_says_the_peak_is_the_drivers_alone(tmp_path: Path) -> None:
    memory = RunMemory(whole_run=False, period_s=0.05).start()
    line = memory.finish(tmp_path)
    memory.stop()  # stopping twice is harmless (the driver's finally stops it again)
    assert "the driver only" in line and json.loads((tmp_path / "memory.json").read_text())["whole_run"] is False
