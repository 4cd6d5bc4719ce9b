"""Remote run storage against an S3-compatible server: moto's server (``ThreadedMotoServer`` on 127.0.0.1, a free
port) spoken to through s3fs, the endpoint given as users give MinIO's, by ``AWS_ENDPOINT_URL``.

An SFT run with ``trainer.run_root=s3://...`` writes its checkpoints to the bucket (the learner's files, then the
marker), stops after its step-2 checkpoint, and is resumed with ``trainer.resume_from=auto`` from another, empty
staging directory (as on another machine: the checkpoint is read from the bucket); its steps 3-4 repeat an
uninterrupted local run's bit for bit, and its final policy (``trainer.export``) goes to the bucket. Then ``toolbox
export`` reads the run from the bucket and writes the model back to it. The runs are in-process
(``ray.local_mode``), and a real Ray would add only its start-up, three times. Two gloo ranks (no Ray) write one
checkpoint to the bucket and resume from it, each its own shards and files.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
import torch
from moto.server import ThreadedMotoServer

from tests import stopped_runs
from tests.run_files import numbers
from toolbox.commands.export import main as export_main
from toolbox.core.storage import COMPLETE, RemoteDir

pytestmark = pytest.mark.integration  # a server on a local port

BUCKET = "toolbox-runs"
RUN = ["experiment=sft_tiny", "ray.local_mode=true", "learner.strategy=single", "learner.num_workers=1",
       "callbacks=[{name: jsonl}]", "trainer.eval_every=0", "trainer.final_eval=false", "trainer.total_steps=4",
       "trainer.save_every=2", "trainer.keep_checkpoints=0", "algorithm.batch_size=8"]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[s3fs.S3FileSystem]:
    """A moto S3 server on a free local port with one bucket; the endpoint and credentials in the environment, as
    boto (under s3fs) reads them."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # moto's state is per process, not per server: each test starts from an empty store
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).close()
    for name, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()  # a client made before would keep its own endpoint
    fs = s3fs.S3FileSystem()
    fs.mkdir(BUCKET)
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def fit(*overrides: str, stop_at: int = 0) -> list[dict[str, float]]:
    return stopped_runs.fit([*RUN, *overrides], stop_at)


def test_a_run_on_s3_resumes_from_the_bucket_and_exports_to_it(s3: s3fs.S3FileSystem, tmp_path: Path) -> None:
    whole = fit(f"trainer.run_root={tmp_path / 'local'}", "trainer.run_name=whole")
    remote = [f"trainer.run_root=s3://{BUCKET}/runs", "trainer.run_name=a"]
    first = fit(*remote, f"trainer.staging_root={tmp_path / 'first'}", stop_at=2)
    assert len(first) == 2
    run = RemoteDir(f"s3://{BUCKET}/runs/a")
    assert run.complete_checkpoints() == ["step_2"]
    assert s3.exists(f"{BUCKET}/runs/a/config.yaml") and s3.exists(f"{BUCKET}/runs/a/metrics.jsonl")

    # Another machine: an empty staging directory, the checkpoint downloaded from the bucket.
    resumed = fit(*remote, f"trainer.staging_root={tmp_path / 'second'}", "trainer.resume_from=auto",
                  "trainer.export=true", "trainer.keep_best={metric: loss, mode: min}")
    assert not (tmp_path / "second" / "a" / "checkpoints").exists()  # read from the bucket, not downloaded
    assert len(resumed) == 2
    for step, (want, got) in enumerate(zip(whole[2:], resumed), start=3):
        assert numbers(got) == numbers(want), f"step {step} differs after resuming from the bucket"
    assert run.complete_checkpoints() == ["step_2", "step_4"]
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.find(f"{BUCKET}/runs/a/checkpoints/step_4"))
    assert names == [".metadata", COMPLETE, "__0_0.distcp", "extra_rank0.pt", "trainer_state.pt"]
    best = sorted(p.rsplit("/", 1)[-1] for p in s3.find(f"{BUCKET}/runs/a/checkpoints/best"))
    assert best == sorted([*names, "best.json"])  # copied on the store, marker included

    assert s3.exists(f"{BUCKET}/runs/a/hf/model.safetensors")  # trainer.export: published with the run

    assert export_main([f"s3://{BUCKET}/runs/a", f"s3://{BUCKET}/exports/a"]) == 0
    assert s3.exists(f"{BUCKET}/exports/a/config.json") and s3.exists(f"{BUCKET}/exports/a/model.safetensors")


def _rank_writes_and_resumes(rank: int, url: str, out: str) -> None:
    """Two FSDP2 ranks: one AdamW step, a checkpoint written to ``url``; a fresh model and optimizer loaded from it
    equal the saved ones, and this rank's RNG state and extra come back."""
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from toolbox.learner.checkpoint import load_checkpoint, save_checkpoint

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 5), nn.Linear(5, 3))  # 5 rows on 2 ranks: uneven shards
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    model, optim = build()
    model(torch.randn(4, 8)).square().mean().backward()
    optim.step()
    torch.manual_seed(100 + rank)
    save_checkpoint(url, model, optim, {"step": 1, "rank": rank})
    expected_draw = torch.rand(3)
    saved = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in get_state_dict(model, optim)[0].items()}

    fresh, fresh_optim = build()
    extra = load_checkpoint(url, fresh, fresh_optim)
    loaded_sd, loaded_optim = get_state_dict(fresh, fresh_optim)
    loaded = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in loaded_sd.items()}
    assert extra == {"step": 1, "rank": rank}, extra
    assert torch.equal(torch.rand(3), expected_draw)  # this rank's RNG state, restored
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert len(loaded_optim["state"]) == 4  # AdamW's moments of every parameter came back
    if rank == 0:
        torch.save(sorted(saved), out)


def test_two_ranks_write_a_checkpoint_to_the_bucket_and_resume_from_it(s3: s3fs.S3FileSystem, tmp_path: Path) -> None:
    """Each gloo rank writes its shards and its own small file straight to the bucket (DCP's fsspec writer) and
    reads them back (its fsspec reader): no local directory is involved."""
    from tests.unit.learner_steps import spawn_two_gloo_ranks

    url = f"s3://{BUCKET}/runs/ranks/checkpoints/step_1"
    spawn_two_gloo_ranks(_rank_writes_and_resumes, url, tmp_path / "names.pt")
    assert torch.load(tmp_path / "names.pt") == ["0.bias", "0.weight", "1.bias", "1.weight"]
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.find(f"{BUCKET}/runs/ranks/checkpoints/step_1"))
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "extra_rank0.pt", "extra_rank1.pt"]
