"""Where a run's files may go: a local path, or a URL of any filesystem `fsspec` knows (``s3://``, ``gs://``,
``hf://``, ``memory://`` for tests).

With a remote ``trainer.run_root`` the learner ranks write each checkpoint straight to the store (their shards
through ``torch.distributed.checkpoint``'s fsspec writer, their small per-rank files beside them, see
`toolbox.learner.checkpoint`), into ``checkpoints/step_N`` with no marker: `begin_checkpoint` gives the URL, and
the driver adds its own state and the ``COMPLETE`` marker only after every rank has returned (`commit_checkpoint`),
so a reader that trusts only marked checkpoints never takes a half-written one. A resume reads the marked checkpoint
from the store the same way. The rest of the run directory (config, metrics, samples) is written by the driver to a
local staging directory that `RemoteDir` publishes at every checkpoint and at the end.

Every call of the driver's goes through the one `RetryPolicy` (``trainer.storage_retry``); the ranks' small files
through its defaults, their shards through DCP's writer, whose failure fails the save.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy, transient

log = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
LOCAL_SCHEMES = ("file", "local")
# Filesystems fsspec can read but a run cannot write to, or that wrap another one (not a place of their own).
READ_ONLY = ("http", "https", "github", "zip", "tar", "libarchive", "reference", "jlab", "jupyter", "git", "data",
             "simplecache", "filecache", "blockcache", "cached", "dir")
COMPLETE = "COMPLETE"  # marker file: its presence proves every part of a checkpoint was written (local or remote)


def scheme_of(location: str) -> str:
    """``s3`` for ``s3://bucket/x``; ``""`` for a plain path."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else ""


def is_remote(location: str) -> bool:
    """Whether ``location`` is a URL of a filesystem other than the local one."""
    return scheme_of(location) not in ("", *LOCAL_SCHEMES)


def local_path(location: str) -> str:
    """A local location as a path: ``file:///data/runs`` -> ``/data/runs``; a plain path as it is."""
    return _SCHEME.sub("", location, count=1) if scheme_of(location) in LOCAL_SCHEMES else location


def check_location(field: str, value: str, writable: bool = True) -> str:
    """``value`` as the run will use it (a ``file://`` URL as its path), or a `ConfigError` naming ``field``: a
    scheme fsspec does not know, one whose package is not installed, a read-only one where the run writes, or a
    chained URL (``simplecache::s3://...``)."""
    if "::" in value or ("://" in value and not scheme_of(value)):
        raise ConfigError(f"{field}={value!r}: not a path nor a URL of the form scheme://path (chained fsspec URLs "
                          "are not supported)")
    scheme = scheme_of(value)
    if scheme in ("", *LOCAL_SCHEMES):
        return local_path(value)
    import fsspec

    if scheme not in fsspec.available_protocols():
        raise ConfigError(f"{field}={value!r}: no filesystem is registered for {scheme}:// (fsspec knows s3, gs, "
                          "az, hf, memory, file and more; pass a local path or one of those)")
    if writable and scheme in READ_ONLY:
        raise ConfigError(f"{field}={value!r}: {scheme}:// is read-only for a run; use a local path or a writable "
                          "store (s3://, gs://, az://, hf://)")
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as err:
        raise ConfigError(f"{field}={value!r}: the {scheme}:// filesystem needs a package that is not "
                          f"installed: {err}") from None
    return value.rstrip("/")


class RemoteDir:
    """A directory on an fsspec filesystem, written and read through the one retry policy (a run's:
    ``trainer.storage_retry``)."""

    def __init__(self, url: str, policy: RetryPolicy | None = None) -> None:
        from fsspec.core import url_to_fs

        self.url = url.rstrip("/")
        self.fs, self.root = url_to_fs(self.url)
        self.policy = policy or RetryPolicy()

    def __repr__(self) -> str:
        return f"RemoteDir({self.url!r})"

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}".rstrip("/") if rel else self.root

    def _do(self, what: str, fn: Callable[[], T]) -> T:
        return self.policy.call(fn, what=f"storage {what} {self.url}", retryable=transient)

    def exists(self, rel: str) -> bool:
        return self._do("exists", lambda: bool(self.fs.exists(self.path(rel))))

    def listdir(self, rel: str = "") -> list[str]:
        """Names directly under ``rel`` (empty when it does not exist)."""
        where = self.path(rel)
        if not self.exists(rel):
            return []
        entries = self._do("list", lambda: self.fs.ls(where, detail=False))
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def get_file(self, rel: str, local: Path) -> None:
        self._do("get", lambda: self.fs.get_file(self.path(rel), str(local)))

    def put_file(self, local: Path, rel: str) -> None:
        self._do("put", lambda: self.fs.put_file(str(local), self.path(rel)))

    def write_bytes(self, rel: str, data: bytes) -> None:
        self._do("put", lambda: self.fs.pipe_file(self.path(rel), data))

    def read_bytes(self, rel: str) -> bytes:
        return self._do("get", lambda: bytes(self.fs.cat_file(self.path(rel))))

    def put_tree(self, local: Path, rel: str, last: str = "") -> int:
        """Upload every file under the local directory ``local`` to ``rel`` (the file named ``last`` after all the
        others); returns how many."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name == last)  # stable: the marker goes last, the rest keep their order
        for p in files:
            self.put_file(p, f"{rel}/{p.relative_to(local).as_posix()}".lstrip("/"))
        return len(files)

    def get_tree(self, rel: str, local: Path) -> None:
        """Download the remote directory ``rel`` into ``local`` (created)."""
        local.mkdir(parents=True, exist_ok=True)
        self._do("get", lambda: self.fs.get(self.path(rel) + "/", str(local) + "/", recursive=True))

    def copy_tree(self, rel: str, to: str, skip: str = "") -> None:
        """Every file under the remote directory ``rel`` copied to ``to`` on the store itself (``to`` replaced, its
        files named ``skip`` left out: a marker its caller writes last)."""
        self.remove(to)
        source = self.path(rel)
        for path in self._do("list", lambda: list(self.fs.find(source))):
            if path.rsplit("/", 1)[-1] != skip:
                self._copy(path, self.path(f"{to}/{path[len(source):].lstrip('/')}"))

    def _copy(self, path: str, target: str) -> None:
        self._do("copy", lambda: self.fs.copy(path, target))

    def remove(self, rel: str) -> None:
        if self.exists(rel):
            self._do("remove", lambda: self.fs.rm(self.path(rel), recursive=True))

    def complete_checkpoints(self) -> list[str]:
        """The names of this run's complete remote checkpoints (``step_N`` with a marker), oldest first."""
        steps = [(int(m.group(1)), name) for name in self.listdir("checkpoints")
                 if (m := re.match(r"^step_(\d+)$", name)) and self.exists(f"checkpoints/{name}/{COMPLETE}")]
        return [name for _, name in sorted(steps)]


def join(location: str | Path, *names: str) -> str:
    """``location/name/...`` for a local path or a URL alike."""
    return "/".join([str(location).rstrip("/"), *names])


def write_file(location: str, name: str, data: bytes, policy: RetryPolicy | None = None) -> None:
    """The file ``name`` in the directory ``location`` (a path, created, or a URL), written whole."""
    if is_remote(location):
        RemoteDir(location, policy).write_bytes(name, data)
    else:
        Path(location).mkdir(parents=True, exist_ok=True)
        (Path(location) / name).write_bytes(data)


def has_file(location: str, name: str, policy: RetryPolicy | None = None) -> bool:
    """Whether the directory ``location`` (a path or a URL) holds the file ``name`` (nothing is read)."""
    if not is_remote(location):
        return (Path(location) / name).is_file()
    return RemoteDir(location, policy).exists(name)


def read_file(location: str, name: str, policy: RetryPolicy | None = None) -> bytes | None:
    """The bytes of the file ``name`` in the directory ``location`` (a path or a URL); ``None`` when it is not
    there."""
    if not has_file(location, name, policy):
        return None
    if not is_remote(location):
        return (Path(location) / name).read_bytes()
    return RemoteDir(location, policy).read_bytes(name)


def begin_checkpoint(remote: RemoteDir, name: str) -> str:
    """The URL the learner ranks write the checkpoint ``name`` (``step_N``) to, straight into the run's remote
    ``checkpoints/``. A checkpoint is temporary there until `commit_checkpoint` marks it. An older one of the same
    name (the same step saved again, or a save cut short) is removed first, its marker before the rest, so no reader
    takes it while it is rewritten and no file of it (a rank the new save does not have) stays beside the new one."""
    remote.remove(f"checkpoints/{name}/{COMPLETE}")
    remote.remove(f"checkpoints/{name}")
    return f"{remote.url}/checkpoints/{name}"


def commit_checkpoint(remote: RemoteDir, name: str, info: bytes, keep: int) -> str:
    """Mark the remote checkpoint ``name`` complete (its ``COMPLETE`` marker holds ``info``), once every writer has
    finished; then remote checkpoints beyond the newest ``keep`` (0: keep all) are removed. Returns its URL."""
    remote.write_bytes(f"checkpoints/{name}/{COMPLETE}", info)
    done = remote.complete_checkpoints()
    for old in done[:-keep] if keep and len(done) > keep else []:
        remote.remove(f"checkpoints/{old}")
    return f"{remote.url}/checkpoints/{name}"


def publish_run(remote: RemoteDir, run_dir: Path) -> int:
    """Upload the run directory but its checkpoints (published one by one) and staging leftovers; returns the
    number of files."""
    count = 0
    for entry in sorted(run_dir.iterdir()):
        if entry.name == "checkpoints":
            continue
        if entry.is_dir():
            count += remote.put_tree(entry, entry.name)
        elif entry.is_file():
            remote.put_file(entry, entry.name)
            count += 1
    return count


def fetch_checkpoint(url: str, run_dir: Path, field: str = "trainer.resume_from",
                     policy: RetryPolicy | None = None) -> Path | None:
    """The checkpoint ``url`` names, downloaded into ``run_dir/checkpoints/step_N``: a complete ``step_N`` itself,
    or a run directory's newest complete one (``None`` when it has none). An incomplete checkpoint is a
    `ConfigError` naming ``field``. Every call under ``policy`` (`trainer.storage_retry`; unset: its defaults)."""
    remote = RemoteDir(url, policy)
    name = url.rstrip("/").rsplit("/", 1)[-1]
    if re.match(r"^step_\d+$", name):
        if not remote.exists(COMPLETE):
            raise ConfigError(f"{field}={url}: not a complete checkpoint (no {COMPLETE} marker: missing, or it "
                              "was being uploaded when its run stopped); pass the run's URL to take its newest "
                              "complete one")
        source, rel = RemoteDir(url.rstrip("/").rsplit("/", 2)[0], policy), f"checkpoints/{name}"
    else:
        done = remote.complete_checkpoints()
        if not done:
            return None
        source, rel, name = remote, f"checkpoints/{done[-1]}", done[-1]
    local = run_dir / "checkpoints" / name
    if not (local / COMPLETE).is_file():
        log.info("downloading checkpoint %s/%s to %s", source.url, rel, local)
        staging = local.with_name(name + ".download")
        shutil.rmtree(staging, ignore_errors=True)
        source.get_tree(rel, staging)
        shutil.rmtree(local, ignore_errors=True)  # an unmarked local copy (an interrupted download) is replaced
        os.replace(staging, local)
    return local


def staging_root(configured: str) -> Path:
    """The local directory a remote run is staged in: ``configured``, else ``<tmp>/toolbox-staging``."""
    import tempfile

    return Path(configured or Path(tempfile.gettempdir()) / "toolbox-staging").resolve()
