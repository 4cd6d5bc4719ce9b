"""Remote run storage through fsspec's memory filesystem: which locations are refused at start, the marker
published last, pruning, resume from a URL, and a whole in-process SFT run published to and resumed from
``memory://``, exported from and to URLs. (The same against an S3-compatible server: tests/integration/test_storage_s3.py.)"""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.core.retry import RetryPolicy, retry_counts, transient
from toolbox.core.storage import COMPLETE, RemoteDir, check_location, fetch_checkpoint, publish_checkpoint
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.trainers.checkpoints import begin, commit, resolve_resume, resume_command


@pytest.fixture
def memfs() -> fsspec.AbstractFileSystem:
    fs = fsspec.filesystem("memory")
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")
    return fs


def local_checkpoint(run_dir: Path, step: int) -> Path:
    final = run_dir / "checkpoints" / f"step_{step}"
    staging = begin(final)
    (staging / "shard.bin").write_bytes(bytes([step]) * 8)
    return commit(staging, final, {"step": step})


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


def test_a_checkpoint_is_marked_only_after_every_file(tmp_path: Path, memfs: fsspec.AbstractFileSystem) -> None:
    remote = RemoteDir("memory://runs/r")
    written: list[str] = []
    put = remote.put_file
    remote.put_file = lambda local, rel: (written.append(rel), put(local, rel))[1]  # type: ignore[method-assign]
    url = publish_checkpoint(remote, local_checkpoint(tmp_path, 2), keep=2)
    assert url == "memory://runs/r/checkpoints/step_2"
    assert written[-1] == f"checkpoints/step_2/{COMPLETE}" and len(written) == 2
    for step in (4, 6):
        publish_checkpoint(remote, local_checkpoint(tmp_path, step), keep=2)
    assert remote.complete_checkpoints() == ["step_4", "step_6"]


def test_resume_takes_the_newest_complete_remote_checkpoint(tmp_path: Path, memfs: fsspec.AbstractFileSystem) -> None:
    remote = RemoteDir("memory://runs/r")
    for step in (2, 4):
        publish_checkpoint(remote, local_checkpoint(tmp_path / "old", step), keep=0)
    memfs.pipe_file("/runs/r/checkpoints/step_6/shard.bin", b"half")  # an upload cut short: no marker
    here = tmp_path / "new"
    assert resolve_resume("auto", here, remote) == str(here / "checkpoints" / "step_4")
    assert (here / "checkpoints" / "step_4" / "shard.bin").read_bytes() == bytes([4]) * 8
    assert resolve_resume("memory://runs/r/checkpoints/step_2", here) == str(here / "checkpoints" / "step_2")
    with pytest.raises(ConfigError, match=r"resume_from=memory://runs/r/checkpoints/step_6: not a complete checkpoint"):
        resolve_resume("memory://runs/r/checkpoints/step_6", here)
    with pytest.raises(ConfigError, match=r"resume_from=memory://runs/empty: the run has no complete checkpoint"):
        resolve_resume("memory://runs/empty", here)
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


def test_remote_calls_go_under_the_runs_storage_retry(tmp_path: Path, memfs: fsspec.AbstractFileSystem,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A download that drops its connection twice succeeds with three tries, fails with the one try
    ``trainer.storage_retry`` allows."""
    publish_checkpoint(RemoteDir("memory://runs/r"), local_checkpoint(tmp_path / "old", 2), keep=0)
    get, drops = memfs.get, [0]

    def flaky_get(*args: object, **kwargs: object) -> object:
        drops[0] += 1
        if drops[0] % 3:
            raise ConnectionResetError("connection reset by peer")
        return get(*args, **kwargs)

    monkeypatch.setattr(memfs, "get", flaky_get)
    retry = load_config(["trainer.storage_retry={attempts: 1}"]).trainer.storage_retry
    with pytest.raises(ConnectionResetError):
        resolve_resume("memory://runs/r/checkpoints/step_2", tmp_path / "a", policy=retry)
    drops[0] = 0
    retry = load_config(["trainer.storage_retry={attempts: 3, first_pause_s: 0.01}"]).trainer.storage_retry
    assert resolve_resume("memory://runs/r/checkpoints/step_2", tmp_path / "b", policy=retry) == \
        str(tmp_path / "b" / "checkpoints" / "step_2")
    assert drops[0] == 3


def test_a_run_publishes_to_memory_and_resumes_from_its_url(tmp_path: Path, memfs: fsspec.AbstractFileSystem) -> None:
    base = ["experiment=sft_tiny", "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
            "callbacks=[{name: jsonl}]", "trainer.eval_every=0", "trainer.run_root=memory://runs",
            f"trainer.staging_root={tmp_path}", "trainer.total_steps=4", "trainer.keep_checkpoints=0"]
    first = ExperimentBuilder(load_config([*base, "trainer.save_every=2", "trainer.run_name=a",
                                           "trainer.keep_best={metric: loss, mode: min}"])).build_trainer()
    first.fit()
    assert RemoteDir("memory://runs/a").complete_checkpoints() == ["step_2", "step_4"]
    assert memfs.cat_file("/runs/a/checkpoints/best/best.json") == (tmp_path / "a/checkpoints/best/best.json").read_bytes()
    assert memfs.exists(f"/runs/a/checkpoints/best/{COMPLETE}")
    assert memfs.exists("/runs/a/config.yaml") and memfs.exists("/runs/a/metrics.jsonl")
    # resume_from=auto on the remote run_root, from another staging directory (another machine): the newest
    # complete checkpoint comes from the store
    auto = ExperimentBuilder(load_config([*base, "trainer.run_name=a", f"trainer.staging_root={tmp_path / 'other'}",
                                          "trainer.resume_from=auto"]))
    assert auto.resume_from == str(tmp_path / "other" / "a" / "checkpoints" / "step_4")
    assert auto.remote is not None and auto.remote.policy is auto.cfg.trainer.storage_retry
    assert (tmp_path / "other" / "a" / "checkpoints" / "step_4" / COMPLETE).is_file()
    assert resume_command(tmp_path / "a") == (
        f"python -m toolbox.run experiment={tmp_path}/a/config.yaml trainer.run_root=memory://runs "
        f"trainer.staging_root={tmp_path} trainer.run_name=a trainer.resume_from=auto")
    resumed = ExperimentBuilder(load_config([*base, "trainer.run_name=b",
                                             "trainer.resume_from=memory://runs/a/checkpoints/step_2"]))
    assert resumed.resume_from == str(tmp_path / "b" / "checkpoints" / "step_2")
    trainer = resumed.build_trainer()
    trainer.fit()
    assert [m["loss"] for m in trainer.history] == pytest.approx([m["loss"] for m in first.history[2:]], rel=1e-6)
    # toolbox export from the run's URL to another URL: downloaded, exported, uploaded
    from toolbox.commands.export import main as export_main

    assert export_main(["memory://runs/a/checkpoints/step_2", "memory://exports/a"]) == 0
    assert memfs.exists("/exports/a/config.json") and memfs.exists("/exports/a/model.safetensors")
    assert export_main(["memory://runs/a", "memory://exports/a"]) == 2  # a model is there: --force to overwrite
    assert export_main(["memory://runs/a", "memory://exports/a", "--force"]) == 0
