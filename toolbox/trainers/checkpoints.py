"""Checkpoint directories of a run: staged, marked complete, renamed, pruned, found again.

A checkpoint of step N is written into ``checkpoints/step_N.tmp`` (learner shards, role and driver
state); when every part is written, the driver adds the marker file ``COMPLETE`` and renames the
directory to ``step_N``. A directory without the marker (a ``.tmp`` left by a killed run, or a
``step_N`` copied half-way) is never chosen for a resume. ``trainer.keep_checkpoints`` bounds how
many complete ones stay.

On a remote ``trainer.run_root`` a checkpoint is written on the store instead (`toolbox.core.storage`: the ranks
write into ``checkpoints/step_N`` there, the driver marks it), and a resume reads it from there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy
from toolbox.core.storage import COMPLETE, RemoteDir, is_remote

log = logging.getLogger(__name__)

STAGING_SUFFIX = ".tmp"
_STEP = re.compile(r"^step_(\d+)$")


def step_of(path: Path) -> int | None:
    """N for a directory named ``step_N`` (``None`` for anything else, a ``.tmp`` staging directory included)."""
    match = _STEP.match(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished checkpoint (its ``COMPLETE`` marker exists)."""
    return (path / COMPLETE).is_file()


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete ``step_N`` checkpoints of a run directory, oldest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir() if (step := step_of(p)) is not None and is_complete(p)]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or ``None``."""
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def begin(final: Path) -> Path:
    """A fresh, empty staging directory for the checkpoint that will become ``final`` (a leftover is removed)."""
    staging = final.with_name(final.name + STAGING_SUFFIX)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def commit(staging: Path, final: Path, info: Mapping[str, object]) -> Path:
    """Mark ``staging`` complete and rename it to ``final`` (replacing an older ``final`` of the same step).

    Call only once every writer (all learner ranks, the driver) has finished. The rename is atomic
    on one file system, so a reader sees either the old state or the whole new checkpoint.
    """
    marker = staging / COMPLETE
    with marker.open("w") as f:
        json.dump({**info, "time": time.time()}, f)
        f.flush()
        os.fsync(f.fileno())
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)  # left by a crash in an earlier commit of this step
    if final.exists():  # the same step saved again (a run resumed at its last step): the new one wins
        os.replace(final, old)  # renamed, not deleted, first: a crash here still leaves a complete step_N.old
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def prune(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (``keep`` 0: keep all), and staging
    directories older than the newest complete one; returns what was removed."""
    done = complete_checkpoints(run_dir)
    if not done:
        return []
    removed = done[:-keep] if keep and len(done) > keep else []
    newest = step_of(done[-1]) or 0
    for p in (run_dir / "checkpoints").glob(f"step_*{STAGING_SUFFIX}"):
        step = step_of(p.with_name(p.name.removesuffix(STAGING_SUFFIX)))
        if step is not None and step < newest:
            removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def remote_run(cfg: TrainerConfig, run_dir: Path) -> RemoteDir | None:
    """Where a run on a remote ``trainer.run_root`` lives on the store (its checkpoints, its published files), under
    ``trainer.storage_retry``; ``None`` for a local run_root."""
    return RemoteDir(f"{cfg.run_root}/{run_dir.name}", cfg.storage_retry) if is_remote(cfg.run_root) else None


def newest_checkpoint(run_dir: Path, remote: RemoteDir | None) -> str:
    """The newest complete checkpoint of the run (its URL on a remote run_root), or ``""``."""
    if remote is not None and (done := remote.complete_checkpoints()):
        return f"{remote.url}/checkpoints/{done[-1]}"
    latest = latest_checkpoint(run_dir)
    return str(latest) if latest else ""


def resolve_resume(target: str, run_dir: Path, remote: RemoteDir | None = None,
                   policy: RetryPolicy | None = None) -> str:
    """The checkpoint directory or URL ``trainer.resume_from`` names, or ``""`` to start fresh.

    ``auto``: the newest complete checkpoint of this run (on its ``remote`` store, else in its directory), or a
    fresh start when there is none. A run directory: its newest complete checkpoint (an error when it has none). A
    ``step_N`` directory: itself, if complete. A URL of either: the same, read from the store where it is (the
    learner ranks load it from there). Errors are `ConfigError`s naming the field and what to pass instead. Remote
    calls go under ``policy`` (``trainer.storage_retry``).
    """
    if not target:
        return ""
    if is_remote(target):
        return _remote_checkpoint(target, policy)
    if target == "auto":
        newest = newest_checkpoint(run_dir, remote)
        if not newest:
            log.info("trainer.resume_from=auto: no complete checkpoint in %s, starting fresh",
                     f"{remote.url}/checkpoints" if remote else run_dir / "checkpoints")
        return newest
    path = Path(target).resolve()
    if (path / "checkpoints").is_dir() or (path / "config.yaml").is_file():
        latest = latest_checkpoint(path)
        if latest is None:
            raise ConfigError(f"trainer.resume_from={target}: the run directory has no complete checkpoint "
                              f"(a checkpoints/step_N with a {COMPLETE} marker); start without resume_from")
        return str(latest)
    if is_complete(path):
        return str(path)
    sibling = latest_checkpoint(path.parent.parent) if path.parent.name == "checkpoints" else None
    hint = f"; the newest complete one is {sibling}" if sibling else ""
    what = "not a complete checkpoint (no COMPLETE marker: it was being written when its run stopped)" \
        if path.is_dir() else "does not exist"
    raise ConfigError(f"trainer.resume_from={target}: {what}{hint}; pass a run directory to resume its newest "
                      "complete checkpoint")


def _remote_checkpoint(url: str, policy: RetryPolicy | None) -> str:
    """A remote ``step_N`` URL if it is complete, or a remote run's newest complete checkpoint."""
    url = url.rstrip("/")
    if _STEP.match(url.rsplit("/", 1)[-1]):
        if not RemoteDir(url, policy).exists(COMPLETE):
            raise ConfigError(f"trainer.resume_from={url}: not a complete checkpoint (no {COMPLETE} marker: missing, "
                              "or it was being written when its run stopped); pass the run's URL to take its newest "
                              "complete one")
        return url
    done = RemoteDir(url, policy).complete_checkpoints()
    if not done:
        raise ConfigError(f"trainer.resume_from={url}: the run has no complete checkpoint (a "
                          f"checkpoints/step_N with a {COMPLETE} marker); start without resume_from")
    return f"{url}/checkpoints/{done[-1]}"


def resume_command(run_dir: Path) -> str | None:
    """The exact command that resumes this run from its newest complete checkpoint (``None`` without one).

    It re-reads the run's own resolved ``config.yaml`` (every override it was started with) and
    pins the run directory, so ``trainer.resume_from=auto`` finds the checkpoint wherever it is run from.
    """
    remote = remote_root(run_dir)
    if not newest_checkpoint(run_dir, RemoteDir(f"{remote}/{run_dir.name}") if remote else None):
        return None
    root, staging = str(run_dir.parent), []
    if remote:  # a remote run: resume from its published checkpoints, staged where it was
        root, staging = remote, [f"trainer.staging_root={run_dir.parent}"]
    args = [f"experiment={run_dir / 'config.yaml'}", f"trainer.run_root={root}", *staging,
            f"trainer.run_name={run_dir.name}", "trainer.resume_from=auto"]
    return "python -m toolbox.run " + " ".join(shlex.quote(a) for a in args)


def remote_root(run_dir: Path) -> str:
    """The remote ``trainer.run_root`` a staged run directory is published to (from its ``config.yaml``); empty for
    a local run."""
    import yaml

    try:
        root = str(yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["run_root"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return ""
    return root if is_remote(root) else ""
