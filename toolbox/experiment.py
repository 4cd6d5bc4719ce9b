"""`ExperimentBuilder`: config -> run directory, worker groups, trainer, callbacks (dependency injection)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from toolbox.callbacks import CALLBACKS
from toolbox.config.loader import dump_config
from toolbox.config.schema import ExperimentConfig
from toolbox.core.events import EventBus
from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.models.loading import load_tokenizer
from toolbox.models.tiny import ensure_tiny_model
from toolbox.trainers import TRAINERS

# Quiet worker processes: transformers' load/save bars would drown the run's own progress.
WORKER_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
              "OMP_NUM_THREADS": "1"}


def make_run_dir(cfg: ExperimentConfig) -> Path:
    name = cfg.trainer.run_name or f"{cfg.experiment}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    run_dir = Path(cfg.trainer.run_root).resolve() / name
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def resolve_model_path(cfg: ExperimentConfig, run_root: Path) -> str:
    """The directory or hub id to load. A tiny model is built (once, deterministically) when asked for."""
    model = cfg.model
    if model.tiny is None:
        if not model.path:
            raise ValueError("model.path is empty and model.tiny is null: name a model directory or hub id")
        return model.path
    task = TASKS.build(cfg.task)
    tiny = model.tiny
    key = f"tiny-{tiny.arch}-h{tiny.hidden_size}-l{tiny.num_layers}-s{tiny.seed}-{abs(hash(tiny.model_dump_json())) % 10**8}"
    path = Path(model.path) if model.path else run_root / ".models" / key
    return str(ensure_tiny_model(path, tiny, task.alphabet()))


class ExperimentBuilder:
    """Builds every object of a run from its config. ``local=True`` uses in-process groups (no Ray)."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        self.run_dir = make_run_dir(cfg)
        dump_config(cfg, self.run_dir / "config.yaml")
        self.model_path = resolve_model_path(cfg, self.run_dir.parent)
        self.groups: list[Any] = []
        self.resume_from = self._find_resume()

    def _find_resume(self) -> str:
        """A run directory resumes from its latest checkpoint; a step_* directory from itself."""
        target = self.cfg.trainer.resume_from
        if not target:
            return ""
        path = Path(target)
        steps = sorted((path / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        return str(steps[-1] if steps else path)

    def build_groups(self) -> tuple[Any, Any, Any]:
        from toolbox.actors.group import LocalGroup, WorkerGroup
        from toolbox.actors.learner import LearnerWorker
        from toolbox.actors.reward import RewardWorker
        from toolbox.actors.rollout import RolloutWorker

        c = self.cfg
        rollout_kwargs = lambda r: dict(rank=r, engine=c.rollout.engine, model_path=self.model_path,  # noqa: E731
                                        dtype=c.model.dtype, seed=c.trainer.seed)
        reward_kwargs = lambda r: dict(rank=r, spec=c.reward.spec, run=c.reward.run, model_path=self.model_path)  # noqa: E731
        learner_kwargs = lambda r: dict(rank=r, world_size=c.learner.num_workers, model_path=self.model_path,  # noqa: E731
                                        dtype=c.model.dtype, learner=c.learner, algo=c.algorithm,
                                        total_steps=c.trainer.total_steps, seed=c.trainer.seed)
        if c.ray.local_mode:
            groups = (LocalGroup("rollout", [RolloutWorker(**rollout_kwargs(r)) for r in range(c.rollout.num_workers)]),
                      LocalGroup("reward", [RewardWorker(**reward_kwargs(r)) for r in range(c.reward.num_workers)]),
                      LocalGroup("learner", [LearnerWorker(**learner_kwargs(0))]))
        else:
            env = {**WORKER_ENV, "TOOLBOX_TORCH_THREADS": str(c.learner.torch_threads)}
            groups = (
                WorkerGroup("rollout", RolloutWorker, c.rollout.num_workers, rollout_kwargs, c.rollout.timeout_s,
                            c.rollout.cpus_per_worker, c.rollout.gpus_per_worker, env, c.ray.placement_timeout_s),
                WorkerGroup("reward", RewardWorker, c.reward.num_workers, reward_kwargs, c.reward.timeout_s,
                            c.reward.cpus_per_worker, 0.0, env, c.ray.placement_timeout_s),
                WorkerGroup("learner", LearnerWorker, c.learner.num_workers, learner_kwargs, c.learner.timeout_s,
                            c.learner.cpus_per_worker, c.learner.gpus_per_worker, env, c.ray.placement_timeout_s),
            )
        self.groups = list(groups)
        learner = groups[2]
        addr, port = learner.call("rendezvous", [()], ranks=[0])[0]
        learner.call("setup", [(addr, port, c.learner.timeout_s)] * len(learner))
        return groups

    def build_callbacks(self, bus: EventBus) -> None:
        inject = {"run_dir": self.run_dir, "total_steps": self.cfg.trainer.total_steps}
        for spec in self.cfg.callbacks:
            CALLBACKS.build(spec, inject=inject).attach(bus)

    def build_trainer(self) -> Any:
        c = self.cfg
        bus = EventBus()
        self.build_callbacks(bus)
        rollout, reward, learner = self.build_groups()
        prompts = PromptSource(TASKS.build(c.task), load_tokenizer(self.model_path), c.trainer.seed)
        trainer_cfg = c.trainer.model_copy(update={"resume_from": self.resume_from})
        return TRAINERS.build(
            {"name": c.algorithm.name},
            inject=dict(cfg=trainer_cfg, bus=bus, algo=c.algorithm, sampling=c.rollout.sampling, prompts=prompts,
                        rollout=rollout, reward=reward, learner=learner, run_dir=self.run_dir, experiment=c.experiment),
        )

    def shutdown(self) -> None:
        for group in self.groups:
            group.shutdown()
        self.groups = []


def ray_init_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    """Connect to ``ray.address`` / RAY_ADDRESS (a cluster, or ray job submit) or start a local instance."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": True,
                              "runtime_env": {"env_vars": WORKER_ENV}}
    if address is None:
        kwargs.update(include_dashboard=False)
        if cfg.ray.num_cpus:
            kwargs["num_cpus"] = cfg.ray.num_cpus
    return kwargs
