"""Reads back an offline W&B run from its files, without a server: the ``run-<id>.wandb`` transaction log.

wandb 0.31 ships no Python reader for it (its writer and reader live in the Go ``wandb-core``), so this
parses the documented layout: a 7-byte header (``:W&B``, magic, version), then LevelDB log blocks of
32 KiB whose records (FULL, or FIRST/MIDDLE.../LAST fragments) each hold one serialized
``wandb_internal_pb2.Record``. A test helper: no CRC checks, no partial-write recovery.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER, BLOCK, RECORD_HEADER = 7, 32768, 7
FULL, LAST = 1, 4


@dataclass
class OfflineRun:
    """What the run logged: its config, one dict per history step (keyed by ``_step``), and its files."""

    directory: Path
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, Any]] = field(default_factory=dict)


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    out, pos, pending = [], HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < RECORD_HEADER:  # the block's zero-padded trailer
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + RECORD_HEADER])
        if pos + RECORD_HEADER + length > len(data):  # read while wandb-core writes: the tail is not out yet
            break
        pending += data[pos + RECORD_HEADER:pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def finished_records(log: Path, within_s: float) -> list[Any]:
    """The log's records once its ``exit`` record is in: ``run.finish()`` can return before ``wandb-core`` has
    written an offline run's log out, so poll for it."""
    deadline = time.monotonic() + within_s
    while True:
        found = records(log)
        if any(r.WhichOneof("record_type") == "exit" for r in found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{log}: no exit record after {within_s}s ({len(found)} records)")
        time.sleep(0.2)


def read_offline_run(wandb_parent: Path, within_s: float = 60.0) -> OfflineRun:
    """The one offline run under ``wandb_parent/wandb``, once it is completely written."""
    (directory,) = sorted((wandb_parent / "wandb").glob("offline-run-*"))
    (log,) = directory.glob("run-*.wandb")
    run = OfflineRun(directory)
    for record in finished_records(log, within_s):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            run.config.update({_key(u): json.loads(u.value_json) for u in updates})
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            run.history[int(row["_step"])] = row
    return run
