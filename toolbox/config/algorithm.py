"""`AlgorithmConfig`: the base of every algorithm's config section, and the rules each one states about itself.

The config union of `ExperimentConfig.algorithm` is built from the algorithm registry
(`toolbox.algorithms.ALGORITHMS`): the ``name`` of the section picks the registered
config class, which validates the rest with ``extra="forbid"``. So a plugin's algorithm
is a first-class config section, and a field the chosen algorithm does not use is an
error that names it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig

DEFAULT_ALGORITHM = "grpo"


class AlgorithmConfig(BaseModel):
    """What every algorithm section has: its ``name``, the worker roles it builds, and its checks."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(DEFAULT_ALGORITHM, description="Algorithm: selects the config, learner, loop and wiring.")
    # The worker roles the algorithm's wiring builds, in the order it builds them (placement bundles follow it).
    # A role is a config section with num_workers / cpus_per_worker (rollout, reward, learner, env).
    roles: ClassVar[tuple[str, ...]] = ("learner",)

    def check(self, exp: ExperimentConfig) -> None:
        """Checks that span sections (batch arithmetic, strategies), run before any actor starts.

        Raise `toolbox.core.errors.ConfigError` naming the fields involved.
        """
        return None
