"""Shared fixtures: one local Ray instance per test session (integration tests), tiny models in tmp dirs.

Under pytest-xdist (``make test`` runs ``-n 2``) the tests of every module that uses the session's Ray instance
(`ray_session`) are one unit of work (`pytest_xdist_make_scheduler`): one worker runs them one after another with
one instance, as without xdist. tests/realmodel is another unit (its modules share one loaded copy of a real model).
The other worker takes those and the modules that start Ray instances of their own (the CLI, ``ray start``) first,
then the unit tests (those marked slow first); whichever worker is free takes the next module.
"""

from __future__ import annotations

import atexit
import compileall
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolbox  # noqa: F401  (first: transformers' import map comes from its cache, `toolbox.core.import_cache`)

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Each tiny model is built once per pytest run, whatever run root a test gives its run (`toolbox.models.tiny`):
# the runs, the CLI's subprocesses and the Ray workers all inherit the variable.
if not os.environ.get("TOOLBOX_TINY_CACHE"):
    os.environ["TOOLBOX_TINY_CACHE"] = tempfile.mkdtemp(prefix="toolbox-tiny-models-")
    atexit.register(shutil.rmtree, os.environ["TOOLBOX_TINY_CACHE"], ignore_errors=True)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under PYTHONDONTWRITEBYTECODE (set on some CI machines) no process writes the .pyc of toolbox's sources, so each of
# the few hundred processes a test run starts (Ray workers, CLI subprocesses) compiles every module it imports again:
# about 0.1 CPU s each. Byte-compiled here once (0.3 s; compileall skips what is current, writes atomically).
if sys.dont_write_bytecode:
    for package in ("toolbox", "actors"):
        compileall.compile_dir(Path(__file__).resolve().parents[1] / package, quiet=1)


RAY_DIRS = ("integration", "e2e", "realmodel")
SESSION_RAY = "ray"  # the unit of work of the modules that use `ray_session`
REALMODEL = "realmodel"


@functools.cache
def source(module: Path) -> str:
    """The text of the test module at ``module`` ("" where it cannot be read)."""
    try:
        return module.read_text(encoding="utf-8")
    except OSError:
        return ""


def uses_session_ray(module: Path) -> bool:
    """Whether the test module at ``module`` asks for the `ray_session` fixture (read from its source)."""
    return "ray_session" in source(module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N``: the tests of the modules that use `ray_session` are one unit of work, run by one worker one
    after another (one session instance, in collection order), and so are tests/realmodel's; every other module is
    a unit of its own. The session instance's unit goes out first, then the rest of tests/integration, tests/e2e and
    tests/realmodel (each starts processes of its own: the longest units), then the unit tests marked slow (a
    learning test of tens of seconds handed out last would leave the other worker idle that long), then the rest.
    (xdist's own ``--dist loadgroup`` marks do not group under pytest 9.2, whose node ids xdist can no longer
    rename.)"""
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class RayTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            parts = module.split("/")
            if len(parts) > 2 and parts[1] == REALMODEL:
                return REALMODEL
            return SESSION_RAY if uses_session_ray(root / module) else module

        def _assign_work_unit(self, node: Any) -> None:
            def rank(scope: str) -> int:
                if scope == SESSION_RAY:
                    return 0
                parts = scope.split("/")
                if scope == REALMODEL or (len(parts) > 2 and parts[1] in RAY_DIRS):
                    return 1
                return 2 if "pytest.mark.slow" in source(root / scope) else 3

            if self.workqueue and not getattr(self, "_ordered", False):  # once, before the first unit goes out
                self._ordered = True
                for scope in sorted(self.workqueue, key=rank):  # stable: xdist's order (largest first) within a rank
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return RayTestsTogether(config, log)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance, shared by every integration test of the session, started as a run starts its own
    (`toolbox.driver.local_ray.start_local`: the workers inherit the worker env, so the actors take the processes Ray
    starts ahead)."""
    import ray

    from toolbox.driver.local_ray import start_local

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


@pytest.fixture(scope="session")
def tiny_moe_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2MoE (4 experts, top-2, a shared expert) with the tiny model's char tokenizer."""
    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from toolbox.models.loading import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    config = Qwen2MoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                            shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=64, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("models") / "tiny_moe"
    Qwen2MoeForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for the test (tiny networks: a second thread only adds contention, 5-10x slower
    on a loaded 2-core machine); the previous count is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
