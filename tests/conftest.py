"""Shared fixtures: one local Ray instance per test session (integration tests), tiny models in tmp dirs.

Under pytest-xdist (``make test`` runs ``-n 2``) every test that starts Ray (tests/integration, tests/e2e, and
tests/realmodel, whose modules share one loaded copy of a real model) is one unit of work
(`pytest_xdist_make_scheduler`), so they run one after another in one worker, as without xdist: one Ray instance
at a time, while the other worker runs the unit tests (no Ray).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


RAY_DIRS = ("integration", "e2e", "realmodel")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N``: every test of tests/integration, tests/e2e and tests/realmodel is one unit of work, run by one
    worker one test after another (one Ray instance at a time, in collection order); the unit tests are spread by
    module.
    (xdist's own ``--dist loadgroup`` marks do not group under pytest 9.2, whose node ids xdist can no longer
    rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    class RayTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("/")
            return "ray" if len(parts) > 2 and parts[1] in RAY_DIRS else nodeid.split("::", 1)[0]

    return RayTestsTogether(config, log)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance, shared by every integration test of the session, started as a run starts its own
    (`toolbox.experiment.start_local`: the workers inherit the worker env, so the actors take the processes Ray
    starts ahead)."""
    import ray

    from toolbox.experiment import start_local

    if not ray.is_initialized():  # "local": never a cluster some `ray start` left behind
        start_local({"address": "local", "num_cpus": 4, "include_dashboard": False, "log_to_driver": False})
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 + char tokenizer for the digit_add task, saved as a normal model directory."""
    from toolbox.data.tasks import TASKS
    from toolbox.models.loading import TinyModelConfig
    from toolbox.models.tiny import ensure_tiny_model

    alphabet = TASKS.build({"name": "digit_add"}).alphabet()
    return ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny", TinyModelConfig(), alphabet)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for the test (tiny networks: a second thread only adds contention, 5-10x slower
    on a loaded 2-core machine); the previous count is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
