"""A loss from outside the package: a module that is no part of toolbox registers a policy loss through a
``toolbox.plugins`` entry point, and GRPO trains with it by ``algorithm.loss.name=toy`` (no new algorithm).

The entry point is real metadata (a ``*.dist-info`` directory on ``sys.path``, which is what an installed
distribution is to `importlib.metadata`), found by the registry's own plugin loading.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.golden import run_recipe
from toolbox.config import load_config
from toolbox.core import registry
from toolbox.core.errors import ConfigError
from toolbox.objectives.registry import POLICY_LOSSES

TOY_MODULE = '''
"""A toy policy loss: REINFORCE, -scale * A * log pi per token, no ratio and no clip."""
import torch
from pydantic import Field

from toolbox.objectives.policy import Aggregated, policy_terms
from toolbox.objectives.registry import POLICY_LOSSES, LossTerms, PolicyInputs


class Toy(Aggregated):
    """REINFORCE scaled by ``scale``."""

    scale: float = Field(1.0, gt=0, description="Multiplies the loss.")

    def __call__(self, x: PolicyInputs) -> LossTerms:
        pg_BT = -self.scale * x.adv_BT * x.logp_BT
        terms = policy_terms(self, pg_BT, torch.zeros_like(pg_BT), x)
        terms.metrics["toy_scale"] = self.scale
        return terms


def register() -> None:
    POLICY_LOSSES.register("toy", config=Toy)(Toy)
'''


@pytest.fixture
def toy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``toy_loss`` importable from ``tmp_path`` and advertised by an entry point of a distribution there."""
    (tmp_path / "toy_loss.py").write_text(TOY_MODULE)
    info = tmp_path / "toy_loss-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-loss\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[toolbox.plugins]\ntoy = toy_loss:register\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)  # this process loaded the plugins before the toy existed
    yield
    POLICY_LOSSES.unregister("toy")  # later tests (the generated catalog) see the built-in losses only
    sys.modules.pop("toy_loss", None)


def test_a_plugin_loss_is_a_policy_loss_with_typed_options(toy_plugin: None) -> None:
    loss = load_config(["experiment=grpo_tiny", "algorithm.loss.name=toy", "algorithm.loss.scale=2"]).algorithm.loss
    assert loss.model_dump() == {"name": "toy", "agg": "token-mean", "scale": 2.0}
    with pytest.raises(ConfigError, match=r"algorithm\.loss\.scale: Input should be greater than 0"):
        load_config(["experiment=grpo_tiny", "algorithm.loss.name=toy", "algorithm.loss.scale=-1"])


def test_grpo_trains_two_steps_with_the_plugin_loss(toy_plugin: None, tmp_path: Path) -> None:
    history = run_recipe(tmp_path / "run", "experiment=grpo_tiny", "algorithm.loss.name=toy", "algorithm.loss.scale=0.5",
                         "trainer.total_steps=2", "algorithm.prompts_per_step=4", "trainer.save_every=0")
    assert len(history) == 2
    for step in history:
        assert step["toy_scale"] == 0.5  # the toy's own metric: its loss, not the clipped surrogate, ran
        assert math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
