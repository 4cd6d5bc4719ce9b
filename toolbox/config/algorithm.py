"""`AlgorithmConfig`: the base of every algorithm's config section, and what each one states about itself.

The config union of `ExperimentConfig.algorithm` is built from the algorithm registry
(`ALGORITHMS`, here, below the algorithms that fill it): the ``name`` of the section picks the
registered config class, which validates the rest with ``extra="forbid"``. So a plugin's
algorithm is a first-class config section, and a field the chosen algorithm does not use is
an error that names it. The built-in algorithms register when `toolbox.algorithms.builtin`
is imported, which the registry does on its first lookup, as it loads plugins.

An algorithm describes itself here (`models`, `batch`), so the tools that plan or export a run
(``--dry-run``, `toolbox.commands.export`) read its description instead of telling algorithms apart by their classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from toolbox.core.registry import Registry

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig

DEFAULT_ALGORITHM = "grpo"
PolicyKind = Literal["causal_lm", "sequence_classifier", "mlp"]
PAIR_ROWS = 2  # a preference pair is two rows through the model: chosen, then rejected


@dataclass(frozen=True)
class TrainedModels:
    """The models one learner rank of the algorithm holds.

    ``policy``: ``causal_lm`` (exports as a Hugging Face causal LM), ``sequence_classifier`` (the base model with a
    scalar head), ``mlp`` (an environment policy: no Hugging Face form, no language-model memory estimate).
    ``load``: how the learner and `toolbox.commands.export` load a policy that is not a plain causal LM from the base model,
    ``(model_path, dtype) -> model``. ``reference``: a frozen copy of the initial policy (no gradients).
    ``critic``: a value model of the policy's body, trained beside it.
    """

    policy: PolicyKind = "causal_lm"
    load: Callable[[str, str], Any] | None = None
    reference: bool = False
    critic: bool = False


@dataclass(frozen=True)
class BatchShape:
    """One training step's batch as the algorithm's learner ranks take it.

    ``examples`` per step over all ranks, each one ``unit`` (rollouts, pairs, records, env steps) that puts
    ``rows_per_example`` rows through the model (2 for a preference pair: chosen and rejected). ``mini_batches``
    optimizer steps per epoch, ``epochs`` passes. ``max_length``: a row's tokens when the data fixes it (offline),
    ``None`` for a prompt and its sampled response. ``micro_batched``: ``learner.micro_batch_size`` splits a rank's
    mini-batch (gradient accumulation). ``how``: where the examples come from, as (quantity, arithmetic) lines.
    """

    examples: int
    unit: str
    rows_per_example: int = 1
    mini_batches: int = 1
    epochs: int = 1
    max_length: int | None = None
    micro_batched: bool = True
    how: tuple[tuple[str, str], ...] = ()


class AlgorithmConfig(BaseModel):
    """What every algorithm section has: its ``name``, the worker roles it builds, its checks and its description."""

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

    def models(self) -> TrainedModels:
        """The models a learner rank holds (default: a causal-LM policy alone)."""
        return TrainedModels()

    def batch(self, exp: ExperimentConfig) -> BatchShape | None:
        """One step's batch; ``None``: the algorithm does not say (a dry run then prints no batch arithmetic)."""
        return None


# The entries' factories are the algorithms' wirings (`toolbox.algorithms.base.Wiring`: the builder in, an
# `AlgorithmPlan` out); their types live above this layer, so the registry holds them untyped.
ALGORITHMS: Registry[Any] = Registry("algorithm", builtins="toolbox.algorithms.builtin")
F = TypeVar("F", bound=Callable[..., Any])


def register_algorithm(name: str, config: type[AlgorithmConfig]) -> Callable[[F], F]:
    """Decorator on an algorithm's wiring: ``@register_algorithm("grpo", GRPOConfig)``.

    ``config.name`` must default to ``name`` (a ``Literal[name]`` field), so a section that
    names the algorithm validates into this class.
    """
    default = config.model_fields["name"].default
    if default != name:
        raise ValueError(f"algorithm {name!r}: {config.__name__}.name defaults to {default!r}; make it "
                         f"`name: Literal[{name!r}] = {name!r}`")
    register = ALGORITHMS.register(name, config=config)

    def deco(wiring: F) -> F:
        register(wiring)
        return wiring

    return deco
