"""`ExperimentBuilder`: config -> run directory, worker groups, trainer, callbacks (dependency injection).

What is common to every algorithm lives here (run directory, model path, groups,
callbacks, Ray connection); what is particular is the algorithm's wiring in `toolbox.algorithms`.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from toolbox.callbacks import CALLBACKS
from toolbox.config.algorithm import AlgorithmConfig
from toolbox.config.loader import dump_config
from toolbox.config.schema import ExperimentConfig, TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.data.tasks import TASKS
from toolbox.models.tiny import ensure_tiny_model

A = TypeVar("A", bound=AlgorithmConfig)

# Quiet worker processes: transformers' load/save bars would drown the run's own progress.
WORKER_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
              "OMP_NUM_THREADS": "1"}


def make_run_dir(cfg: ExperimentConfig) -> Path:
    """``run_root/run_name``; a resumed run without a name continues in the directory it resumes from."""
    resume = Path(cfg.trainer.resume_from) if cfg.trainer.resume_from else None
    if resume is not None and not cfg.trainer.run_name:
        run_dir = resume if (resume / "checkpoints").is_dir() else resume.parent.parent
        if (run_dir / "config.yaml").exists():
            return run_dir
    name = cfg.trainer.run_name or f"{cfg.experiment}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(cfg.trainer.run_root).resolve() / name
    if not cfg.trainer.run_name:  # two runs started in the same second get their own directories
        n = 1
        while run_dir.exists():
            n += 1
            run_dir = run_dir.with_name(f"{name}-{n}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def resolve_model_path(cfg: ExperimentConfig, run_root: Path) -> str:
    """The directory or hub id to load. A tiny model is built (once, deterministically) when asked for."""
    model = cfg.model
    if model.tiny is None:
        if not model.path:
            raise ConfigError("model.path is empty and model.tiny is null: name a model directory or hub id")
        return model.path
    task = TASKS.build(cfg.task, inject={"data": cfg.data})
    digest = hashlib.sha1((model.tiny.model_dump_json() + task.alphabet()).encode()).hexdigest()[:10]
    path = Path(model.path) if model.path else run_root / ".models" / f"tiny-{model.tiny.arch}-{digest}"
    return str(ensure_tiny_model(path, model.tiny, task.alphabet()))


def check_model_path(path: str, trust_remote_code: bool = False) -> None:
    """Load the model's config on the driver, so a wrong path fails once, here, before any actor loads it."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path: cannot load a model config from {path!r} (a local directory with "
                          f"config.json, or a hub id): {str(err).splitlines()[0]}") from None


def find_resume(target: str) -> str:
    """A run directory resumes from its latest checkpoint; a ``step_*`` directory from itself."""
    if not target:
        return ""
    path = Path(target)
    steps = sorted((path / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return str(steps[-1] if steps else path)


class ExperimentBuilder:
    """Builds every object of a run from its config; ``ray.local_mode`` uses in-process groups."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        if cfg.model.tiny is None and cfg.model.path:  # a user's model: fail here, before Ray and the run dir
            check_model_path(cfg.model.path, cfg.model.trust_remote_code)
        self.run_dir = make_run_dir(cfg)
        dump_config(cfg, self.run_dir / "config.yaml")
        self.groups: list[Any] = []
        self.placement: Any = None  # a Tune trial's placement group, when its actors must live inside it
        self.first_bundle: dict[str, int] = {}

    def use_placement_group(self, pg: Any) -> None:
        """Place every role's actors in bundles of ``pg``, laid out as `trial_bundles` describes."""
        self.placement, offset = pg, 1
        for role in self.cfg.algorithm.roles:
            self.first_bundle[role] = offset
            offset += role_size(self.cfg, role)[0]

    @functools.cached_property
    def model_path(self) -> str:
        """The policy model's directory or hub id, resolved (a tiny model built) only by algorithms that use one."""
        return resolve_model_path(self.cfg, self.run_dir.parent)

    def group(self, role: str, cls: type, n: int, make_kwargs: Callable[[int], dict[str, Any]], timeout_s: float,
              cpus: float, gpus: float = 0.0) -> Any:
        """N workers of ``cls``: Ray actors in a placement group, or in-process objects in local mode."""
        from toolbox.actors.group import LocalGroup, WorkerGroup

        if self.cfg.ray.local_mode:
            group: Any = LocalGroup(role, [cls(**make_kwargs(r)) for r in range(n)])
        else:
            placement = None if self.placement is None else (self.placement, self.first_bundle[role])
            group = WorkerGroup(role, cls, n, make_kwargs, timeout_s, cpus, gpus, WORKER_ENV,
                                self.cfg.ray.placement_timeout_s, placement)
        self.groups.append(group)
        return group

    def learner_group(self, build: Callable[[], Any]) -> Any:
        """The learner ranks, joined into one torch.distributed group, each holding ``build()``."""
        from toolbox.actors.learner import LearnerWorker

        lc = self.cfg.learner
        kwargs = lambda r: dict(rank=r, world_size=lc.num_workers, build=build, distributed=lc.strategy != "single",  # noqa: E731
                                backend=lc.backend, torch_threads=lc.torch_threads, seed=self.cfg.trainer.seed)
        group = self.group("learner", LearnerWorker, lc.num_workers, kwargs, lc.timeout_s, lc.cpus_per_worker,
                           lc.gpus_per_worker)
        addr, port = group.call("rendezvous", [()], ranks=[0])[0]
        group.call("setup", [(addr, port, lc.timeout_s)] * len(group))
        return group

    def algorithm(self, cls: type[A]) -> A:
        """The algorithm section as its own config class (what an algorithm's wiring reads)."""
        algo = self.cfg.algorithm
        if not isinstance(algo, cls):
            raise TypeError(f"algorithm {algo.name!r} has a {type(algo).__name__}, its wiring expects a {cls.__name__}")
        return algo

    def trainer_config(self) -> TrainerConfig:
        return self.cfg.trainer.model_copy(update={"resume_from": find_resume(self.cfg.trainer.resume_from)})

    def build_trainer(self) -> Any:
        from toolbox.algorithms import ALGORITHMS

        bus = EventBus()
        inject = {"run_dir": self.run_dir, "total_steps": self.cfg.trainer.total_steps}
        for spec in self.cfg.callbacks:
            CALLBACKS.build(spec, inject=inject).attach(bus)
        return ALGORITHMS.get(self.cfg.algorithm.name).factory(self, bus)

    def shutdown(self) -> None:
        for group in self.groups:
            group.shutdown()
        self.groups = []


def role_size(cfg: ExperimentConfig, role: str) -> tuple[int, float, float]:
    """(workers, CPUs each, GPUs each) of a role, from its config section (rollout, reward or learner)."""
    section = getattr(cfg, role)
    return section.num_workers, section.cpus_per_worker, getattr(section, "gpus_per_worker", 0.0)


def trial_bundles(cfg: ExperimentConfig, driver_cpus: float = 0.01) -> list[dict[str, float]]:
    """Placement-group bundles for one whole experiment: the driver's, then every role's workers."""
    bundles = [{"CPU": driver_cpus}]
    for role in cfg.algorithm.roles:
        n, cpus, gpus = role_size(cfg, role)
        bundles += [{"CPU": cpus, **({"GPU": gpus} if gpus else {})}] * n
    return bundles


def ray_init_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    """Connect to ``ray.address`` / RAY_ADDRESS (a cluster, or ray job submit) or start a local instance."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"address": address, "runtime_env": {"env_vars": WORKER_ENV}}
    if address is None:
        kwargs["include_dashboard"] = False
        if cfg.ray.num_cpus:
            kwargs["num_cpus"] = cfg.ray.num_cpus
    return kwargs
