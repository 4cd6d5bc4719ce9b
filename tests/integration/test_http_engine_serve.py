"""GRPO on local Ray whose rollouts come from our own server (`python -m toolbox.commands.serve`) via the http engine.

The server runs as a subprocess on a free 127.0.0.1 port with its admin token set, on the same tiny model
directory the run trains. After every step the rollout worker has pushed the learner's weights
(``POST /v1/toolbox/weights``), so the server's weight digest equals the learner's at every step end; after
the run, the server samples with the learner's log-probs; and the run learns as the hf-engine run does
(grpo_tiny with one worker per role for 40 steps: the mean reward of steps 31-40 is above that of steps 1-10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from toolbox.actors.learner import LearnerWorker

from toolbox.config import load_config
from toolbox.core.events import Event
from toolbox.driver.experiment import ExperimentBuilder
from toolbox.driver.local_ray import WORKER_ENV
from toolbox.driver.preflight import resolve_model_path
from toolbox.engines.base import SamplingConfig
from toolbox.engines.http import HTTPEngine, HTTPEngineConfig
from toolbox.models.loading import load_causal_lm
from toolbox.models.logprobs import response_logprobs
from toolbox.rl.batch import PromptRequest
from toolbox.serving.background import free_port
from toolbox.serving.weights import state_digest

pytestmark = pytest.mark.integration

TOKEN_ENV = "TOOLBOX_SERVE_ADMIN_TOKEN"
TOKEN = "integration-admin-token"
STEPS = 40
NO_PROXY = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - a 127.0.0.1 URL built here
        return dict(json.loads(response.read()))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model grpo_tiny trains, built once the way a run builds it (`resolve_model_path`)."""
    return resolve_model_path(load_config([]), tmp_path_factory.mktemp("models"))


@pytest.fixture
def served(model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``python -m toolbox.commands.serve`` on ``model_dir``, weight updates on; yields its base URL (.../v1)."""
    yield from serve(model_dir, tmp_path, monkeypatch, "max_batch_size=128", "log_level=warning")


@pytest.fixture
def busy(model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The same running 8 choices and holding 8 more (a block of the default run sends 256 at once, 4 a request),
    its access log on. This small, so that the queue fills on a loaded machine too, where requests reach the server
    more slowly (room for 32 and 32 fills on an idle host, not always under the suite's load)."""
    yield from serve(model_dir, tmp_path, monkeypatch, "max_batch_size=8", "max_queue=8", "log_level=info")


def serve(model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *options: str) -> Iterator[str]:
    for var in NO_PROXY:
        monkeypatch.delenv(var, raising=False)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in NO_PROXY} | {TOKEN_ENV: TOKEN}
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", "toolbox.commands.serve", f"model={model_dir}", "engine=hf", "host=127.0.0.1",
             f"port={port}", *options], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"toolbox.commands.serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if get_json(f"{base}/toolbox/info")["weight_update"] is True:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"toolbox.commands.serve did not answer on {base} in 120 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def learner_digest(trainer: Any, model: torch.nn.Module) -> str:
    """The server's digest recipe over the learner's weights (loaded into a model like the served one)."""
    model.load_state_dict(trainer.learner.group.each(LearnerWorker.full_state_dict).result()[0], strict=True)
    return state_digest(model)


def test_grpo_through_our_server_syncs_every_step_and_learns(
        ray_session: None, served: str, model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rollout actors read the token from their environment; the config names only the variable.
    monkeypatch.setitem(WORKER_ENV, TOKEN_ENV, TOKEN)
    # A checkpoint after every step keeps the next step's calls from going out before this step's end
    # (`OnlineTrainer._submits_next`): at each step's end the server holds exactly that step's weights.
    cfg = load_config(["experiment=grpo_tiny_fsdp2", f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0",
                       "trainer.save_every=1", f"model.path={model_dir}", "model.tiny=null",
                       f"rollout.engine={{name: http, base_url: '{served}', max_retries: 0, max_concurrency: 128}}",
                       "rollout.num_workers=1", "reward.num_workers=1", "learner.num_workers=1",
                       "learner.strategy=single", f"trainer.total_steps={STEPS}"])
    builder = ExperimentBuilder(cfg)
    probe = load_causal_lm(model_dir)
    initial = state_digest(probe)
    mismatches: list[int] = []
    versions: list[int] = []

    def check_sync(_: Event, payload: dict[str, Any]) -> None:
        server = get_json(f"{served}/toolbox/weights/digest")
        versions.append(int(server["version"]))
        if server["sha256"] != learner_digest(trainer, probe):
            mismatches.append(int(payload["step"]))

    try:
        trainer = builder.build_trainer()
        trainer.bus.subscribe(Event.STEP_END, check_sync)
        summary = trainer.fit()
        assert summary["steps"] == STEPS
        assert TOKEN not in (builder.run_dir / "config.yaml").read_text()
    finally:
        builder.shutdown()

    # prepare() pushes the initial weights once; then each step pushes once.
    assert versions == list(range(2, STEPS + 2)), f"one weight push per step: server versions {versions}"
    assert mismatches == [], f"server weights differ from the learner's after steps {mismatches}"
    assert get_json(f"{served}/toolbox/weights/digest")["sha256"] != initial, "the learner did not train"

    # The server samples from those weights: its log-probs are the learner's log_softmax(logits / T).
    sampler = HTTPEngine(model_dir, config=HTTPEngineConfig(base_url=served, max_retries=0, push_weights=False))
    prompts = [PromptRequest(list(sampler.tokenizer.encode(f"{a}+{b}=", add_special_tokens=False)), i)
               for i, (a, b) in enumerate([(1, 2), (3, 4), (0, 0), (4, 1)])]
    batch = sampler.generate(prompts, SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4))
    with torch.no_grad():
        learner_logp = response_logprobs(probe, batch, 1.0)
    mask = batch.response_mask_BR.bool()
    assert torch.allclose(batch.logprobs_BR[mask], learner_logp[mask], atol=1e-4)

    # hf engine, same config, trainer.seed 0/1/2: mean reward 0.030/0.027/0.029 over steps 1-10 and
    # 0.164/0.138/0.069 over steps 31-40; a run that does not learn stays at 0.03 +- 0.01.
    rewards = [m["reward"] for m in trainer.history]
    early, late = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert late > early + 0.025, f"reward did not rise as in the hf-engine run: {early:.3f} -> {late:.3f}"


def test_the_default_run_waits_out_a_full_server_queue(ray_session: None, busy: str, model_dir: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The default layout (blocks of 2 steps, 128 requests in flight) against a server with room for 16 choices:
    the server answers 429, the engine sends those requests again, and the run completes (one block: its first
    burst is what fills the queue)."""
    monkeypatch.setitem(WORKER_ENV, TOKEN_ENV, TOKEN)
    cfg = load_config([f"trainer.run_root={tmp_path}", "callbacks=[]", "trainer.eval_every=0", "trainer.total_steps=2",
                       f"model.path={model_dir}", "model.tiny=null",
                       f"rollout.engine={{name: http, base_url: '{busy}', max_retries: 0, max_concurrency: 128}}"])
    builder = ExperimentBuilder(cfg)
    try:
        summary = builder.build_trainer().fit()
    finally:
        builder.shutdown()
    assert summary["steps"] == 2
    refused = (tmp_path / "serve.log").read_text().count(" 429 ")
    assert refused > 0, "the server never refused: the test did not exercise a full queue"
