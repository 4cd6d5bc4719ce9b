"""Remote run storage through fsspec's memory filesystem: which locations are refused at start, the marker
written last, pruning, resume from a URL, and a whole in-process SFT run checkpointed straight to and resumed
straight from ``memory://``, exported from and to URLs. (The same against an S3-compatible server: tests/integration/test_storage_s3.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy, retry_counts, transient
from toolbox.core.storage import (
    COMPLETE,
    RemoteDir,
    begin_checkpoint,
    check_location,
    commit_checkpoint,
    fetch_checkpoint,
)
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.trainers.checkpoints import resolve_resume, resume_command


@pytest.fixture
def memfs() -> fsspec.AbstractFileSystem:
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    return fs


def remote_checkpoint(remote: RemoteDir, step: int, keep: int = 0) -> str:
    """A checkpoint as a run writes it on the store: its files (as the learner ranks would), then the marker."""
    begin_checkpoint(remote, f"step_{step}")
    remote.write_bytes(f"checkpoints/step_{step}/shard.bin", bytes([step]) * 8)
    return commit_checkpoint(remote, f"step_{step}", b"{}", keep)


@pytest.mark.parametrize(("value", "message"), [
    ("foo://x/runs", "trainer.run_root='foo://x/runs': no filesystem is registered for foo://"),
    ("https://example.org/runs", "trainer.run_root='https://example.org/runs': https:// is read-only for a run"),
    ("simplecache::memory://runs", "chained fsspec URLs are not supported"),
    ("az://bucket/runs", "trainer.run_root='az://bucket/runs': the az:// filesystem needs a package that is not "
                         "installed: Install adlfs"),  # (s3fs is in the test extra)
])
def test_an_unusable_run_root_is_refused_at_start(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        load_config([f"trainer.run_root={value}"])


def test_a_file_url_is_its_path_not_a_relative_directory() -> None:
    assert load_config(["trainer.run_root=file:///data/runs"]).trainer.run_root == "/data/runs"
    assert check_location("x", "memory://runs/") == "memory://runs"
    with pytest.raises(ConfigError, match=r"trainer.resume_from='zz://a/step_2': no filesystem is registered"):
        load_config(["trainer.resume_from=zz://a/step_2"])


def test_a_checkpoint_is_marked_only_after_every_file(memfs: fsspec.AbstractFileSystem) -> None:
    remote = RemoteDir("memory://runs/r")
    assert remote_checkpoint(remote, 2, keep=2) == "memory://runs/r/checkpoints/step_2"
    url = begin_checkpoint(remote, "step_2")  # the same step saved again: unmarked while it is rewritten
    assert url == "memory://runs/r/checkpoints/step_2" and remote.complete_checkpoints() == []
    assert not memfs.exists("/runs/r/checkpoints/step_2/shard.bin")  # no file of the old save stays beside the new
    memfs.pipe_file("/runs/r/checkpoints/step_2/shard.bin", b"new")
    commit_checkpoint(remote, "step_2", b"{}", keep=2)
    for step in (4, 6):
        remote_checkpoint(remote, step, keep=2)
    assert remote.complete_checkpoints() == ["step_4", "step_6"]
    assert not memfs.exists("/runs/r/checkpoints/step_2")  # pruned


def test_resume_takes_the_newest_complete_remote_checkpoint(tmp_path: Path, memfs: fsspec.AbstractFileSystem) -> None:
    remote = RemoteDir("memory://runs/r")
    for step in (2, 4):
        remote_checkpoint(remote, step)
    memfs.pipe_file("/runs/r/checkpoints/step_6/shard.bin", b"half")  # a save cut short: no marker
    here = tmp_path / "new"
    assert resolve_resume("auto", here, remote) == "memory://runs/r/checkpoints/step_4"  # read where it is
    assert resolve_resume("memory://runs/r", here) == "memory://runs/r/checkpoints/step_4"
    assert resolve_resume("memory://runs/r/checkpoints/step_2/", here) == "memory://runs/r/checkpoints/step_2"
    assert not here.exists()  # nothing downloaded
    with pytest.raises(ConfigError, match=r"resume_from=memory://runs/r/checkpoints/step_6: not a complete checkpoint"):
        resolve_resume("memory://runs/r/checkpoints/step_6", here)
    with pytest.raises(ConfigError, match=r"resume_from=memory://runs/empty: the run has no complete checkpoint"):
        resolve_resume("memory://runs/empty", here)
    assert resolve_resume("auto", here, RemoteDir("memory://runs/empty")) == ""
    assert fetch_checkpoint("memory://runs/empty", here) is None


def test_transient_errors_are_retried_and_counted() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("reset by peer")
        return "ok"

    before = retry_counts().get("t flaky", 0)
    policy = RetryPolicy(attempts=4, first_pause_s=0.0)
    assert policy.call(flaky, what="t flaky", retryable=transient, sleep=lambda s: None) == "ok"
    assert retry_counts()["t flaky"] == before + 2
    with pytest.raises(FileNotFoundError):  # not retryable: raised at the first try
        policy.call(lambda: (_ for _ in ()).throw(FileNotFoundError("x")), what="t missing", retryable=transient)
    assert "t missing" not in retry_counts()
    assert all(policy.pause(k) <= min(8.0, 0.5 * 2 ** k) for k in range(6) for _ in range(20))


def test_remote_calls_go_under_the_runs_storage_retry(memfs: fsspec.AbstractFileSystem,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A look-up that drops its connection twice succeeds with three tries, fails with the one try
    ``trainer.storage_retry`` allows."""
    remote_checkpoint(RemoteDir("memory://runs/r"), 2)
    exists, drops = memfs.exists, [0]

    def flaky_exists(*args: object, **kwargs: object) -> object:
        drops[0] += 1
        if drops[0] % 3:
            raise ConnectionResetError("connection reset by peer")
        return exists(*args, **kwargs)

    monkeypatch.setattr(memfs, "exists", flaky_exists)
    retry = load_config(["trainer.storage_retry={attempts: 1}"]).trainer.storage_retry
    with pytest.raises(ConnectionResetError):
        resolve_resume("memory://runs/r/checkpoints/step_2", Path("unused"), policy=retry)
    drops[0] = 0
    retry = load_config(["trainer.storage_retry={attempts: 3, first_pause_s: 0.01}"]).trainer.storage_retry
    assert resolve_resume("memory://runs/r/checkpoints/step_2", Path("unused"), policy=retry) == \
        "memory://runs/r/checkpoints/step_2"
    assert drops[0] == 3


def test_a_run_publishes_to_memory_and_resumes_from_its_url(tmp_path: Path, memfs: fsspec.AbstractFileSystem) -> None:
    base = ["experiment=sft_tiny", "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
            "callbacks=[{name: jsonl}]", "trainer.eval_every=0", "trainer.run_root=memory://runs",
            f"trainer.staging_root={tmp_path}", "trainer.total_steps=4", "trainer.keep_checkpoints=0"]
    first = ExperimentBuilder(load_config([*base, "trainer.save_every=2", "trainer.run_name=a",
                                           "trainer.keep_best={metric: loss, mode: min}"])).build_trainer()
    first.fit()
    assert RemoteDir("memory://runs/a").complete_checkpoints() == ["step_2", "step_4"]
    assert not (tmp_path / "a" / "checkpoints").exists()  # written to the store, not staged
    best = json.loads(memfs.cat_file("/runs/a/checkpoints/best/best.json"))
    assert best["metric"] == "loss" and best["step"] in (2, 4)
    assert memfs.exists(f"/runs/a/checkpoints/best/{COMPLETE}") and memfs.exists("/runs/a/checkpoints/best/.metadata")
    assert memfs.exists("/runs/a/config.yaml") and memfs.exists("/runs/a/metrics.jsonl")
    # resume_from=auto on the remote run_root, from another staging directory (another machine): the newest
    # complete checkpoint is read from the store
    auto = ExperimentBuilder(load_config([*base, "trainer.run_name=a", f"trainer.staging_root={tmp_path / 'other'}",
                                          "trainer.resume_from=auto"]))
    assert auto.resume_from == "memory://runs/a/checkpoints/step_4"
    assert auto.remote is not None and auto.remote.policy is auto.cfg.trainer.storage_retry
    assert resume_command(tmp_path / "a") == (
        f"python -m toolbox.run experiment={tmp_path}/a/config.yaml trainer.run_root=memory://runs "
        f"trainer.staging_root={tmp_path} trainer.run_name=a trainer.resume_from=auto")
    resumed = ExperimentBuilder(load_config([*base, "trainer.run_name=b",
                                             "trainer.resume_from=memory://runs/a/checkpoints/step_2"]))
    assert resumed.resume_from == "memory://runs/a/checkpoints/step_2"
    trainer = resumed.build_trainer()
    trainer.fit()
    assert [m["loss"] for m in trainer.history] == pytest.approx([m["loss"] for m in first.history[2:]], rel=1e-6)
    # toolbox export from the run's URL to another URL: downloaded, exported, uploaded
    from toolbox.commands.export import main as export_main

    assert export_main(["memory://runs/a/checkpoints/step_2", "memory://exports/a"]) == 0
    assert memfs.exists("/exports/a/config.json") and memfs.exists("/exports/a/model.safetensors")
    assert export_main(["memory://runs/a", "memory://exports/a"]) == 2  # a model is there: --force to overwrite
    assert export_main(["memory://runs/a", "memory://exports/a", "--force"]) == 0
