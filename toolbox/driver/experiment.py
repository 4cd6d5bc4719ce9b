"""`ExperimentBuilder`: config -> run directory, worker groups, trainer, callbacks (dependency injection).

What is common to every algorithm lives here (worker groups and their start, the learner's process group,
callbacks); what is particular is the algorithm's wiring in `toolbox.algorithms`. The checks before Ray starts are
in `toolbox.driver.preflight`, actor sizes in `toolbox.driver.placement`, the Ray connection in
`toolbox.driver.ray_connect`.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from toolbox.algorithms.plan import AlgorithmPlan, Groups
from toolbox.callbacks import CALLBACKS
from toolbox.callbacks.remote import RemotePublish
from toolbox.config.algorithm import AlgorithmConfig
from toolbox.config.loader import dump_config
from toolbox.config.schema import ExperimentConfig, RolePlacement
from toolbox.config.trainer import TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.data.offline import OfflineDataConfig
from toolbox.driver.local_ray import actor_env
from toolbox.driver.placement import reserve_colocated, role_size
from toolbox.driver.preflight import (
    check_model_path,
    check_run_root_shared,
    check_specs,
    make_run_dir,
    resolve_model_path,
)
from toolbox.driver.ray_connect import live_nodes
from toolbox.driver.weight_sync import open_weight_sync
from toolbox.models.catalog import resolve_source
from toolbox.trainers.checkpoints import remote_run, resolve_resume

A = TypeVar("A", bound=AlgorithmConfig)
log = logging.getLogger(__name__)
SELF_HEALING_ROLES = ("rollout", "reward")  # their workers take a `supervisor` (toolbox.actors.supervisor)


class ExperimentBuilder:
    """Builds every object of a run from its config; ``ray.local_mode`` uses in-process groups."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        self.cfg = cfg
        if cfg.model.tiny is None and cfg.model.path:  # a user's model: fail here, before Ray and the run dir
            # resolving converts a GGUF here, once, so no worker (nor the warm-up thread) waits on it
            check_model_path(resolve_source(cfg.model.path, cfg.model.gguf_file), cfg.model.trust_remote_code)
        check_specs(cfg)
        self.run_dir = make_run_dir(cfg)
        # a remote run_root: where the staged run directory is published (`toolbox.core.storage`)
        self.remote = remote_run(cfg.trainer, self.run_dir)
        if isinstance(cfg.algorithm, OfflineDataConfig) and (cfg.algorithm.dataset or cfg.algorithm.eval_dataset):
            cfg.algorithm.check_rows(cfg.data, self.tokenizer)  # tokenised records, before Ray
        # fails here, early
        self.resume_from = resolve_resume(cfg.trainer.resume_from, self.run_dir, self.remote, cfg.trainer.storage_retry)
        dump_config(cfg, self.run_dir / "config.yaml")
        self.groups: list[Any] = []
        self.placement: Any = None  # a Tune trial's placement group, when its actors must live inside it
        self.first_bundle: dict[str, int] = {}
        self.nodes: dict[str, list[str | None]] = {}  # role -> the Ray node id of each of its actors
        self.starting: list[tuple[str, Any]] = []  # (role, group) made with wait=False, not yet `started`
        self.joining: list[Any] = []  # learner groups made with wait=False, joined into a process group by `started`
        self.clock: Any = None  # the entry point's `toolbox.driver.startup.StartupClock`: marks the start-up phases
        self._colocated_pg: Any = None  # rollout.placement: colocate: the placement group rollout and learner share

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

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The policy's tokenizer in the driver (it tokenises the prompts); loaded once."""
        from toolbox.models.loading import load_tokenizer

        return load_tokenizer(self.model_path)

    def warm_up(self) -> threading.Thread:
        """Start, in a thread, what the driver loads for itself before its first actor call: for an algorithm with
        rollout workers the model path (a tiny model built) and the tokenizer (transformers imported), for every
        algorithm the modules its roles are made of. Meant to run while ``ray.init`` starts a local instance, where
        the driver only waits for Ray's own processes (about 1.5 s of CPU the driver then does not spend after).
        Join it before building the trainer. A failure here is not kept: the main thread meets it again where it
        needs the thing, with the error it always had."""

        def load() -> None:
            try:
                import toolbox.actors.roles  # noqa: F401
                import toolbox.trainers.online  # noqa: F401

                if "rollout" in self.cfg.algorithm.roles:
                    self.tokenizer  # noqa: B018 - the cached property's work is the point
            except Exception:  # noqa: BLE001 - met again by the main thread (see above)
                log.debug("warm-up failed; the driver loads these when it needs them", exc_info=True)

        thread = threading.Thread(target=load, name="toolbox-warm-up", daemon=True)
        thread.start()
        return thread

    def group(self, role: str, cls: type, n: int, make_kwargs: Callable[[int], dict[str, Any]], timeout_s: float,
              cpus: float, gpus: float = 0.0, wait: bool = True) -> Any:
        """N workers of ``cls``: Ray actors in a placement group, or in-process objects in local mode.

        ``wait=False``: return once the actors are created, their constructors (model loading) still running, so
        the next role's actors start meanwhile; `started` waits for every such group."""
        from toolbox.actors.group import LocalGroup, WorkerGroup

        if self.cfg.ray.local_mode:
            group: Any = LocalGroup(role, [cls(**make_kwargs(r)) for r in range(n)])
        else:
            placement = None if self.placement is None else (self.placement, self.first_bundle[role])
            if self.colocated(role):
                placement = (self.colocated_pg(), 0)  # bundle i: rollout worker i and learner rank i
            where = self.cfg.ray.placement.get(role, RolePlacement())
            group = WorkerGroup(role, cls, n, make_kwargs, timeout_s, cpus, gpus, actor_env(),
                                self.cfg.ray.placement_timeout_s, placement, where.resources, where.strategy,
                                max_restarts=self.max_restarts(role), wait=wait)
            if wait:
                self._record_nodes(role, group)
            else:
                self.starting.append((role, group))
        self.groups.append(group)
        return group

    def started(self) -> None:
        """Wait for the groups made with ``wait=False`` (they started in parallel) and record their nodes. Learner
        groups first, each joined into its process group as soon as its ranks are up: the ranks build their
        learners while the other roles' actors are still loading."""
        joining = {id(group) for group in self.joining}
        starting, self.starting, self.joining = self.starting, [], []
        for role, group in sorted(starting, key=lambda rg: id(rg[1]) not in joining):
            self._record_nodes(role, group.started())
            if id(group) in joining:
                self.mark("actors")
                self._join(group)
                self.mark("process_group")
        if starting:
            self.mark("actors")  # the other roles' actors, if some were still loading

    def mark(self, phase: str) -> None:
        """The end of a start-up phase (`toolbox.driver.startup`), when the entry point keeps a clock."""
        if self.clock is not None:
            self.clock.mark(phase)

    def _record_nodes(self, role: str, group: Any) -> None:
        self.nodes[role] = list(group.node_ids)
        (self.run_dir / "nodes.json").write_text(json.dumps(self.nodes, indent=1))

    def colocated(self, role: str) -> bool:
        """Whether ``role``'s actors go into the shared bundles of ``rollout.placement: colocate``."""
        from toolbox.engines.placement import COLOCATED_ROLES

        if self.cfg.rollout.placement != "colocate" or role not in COLOCATED_ROLES:
            return False
        if self.placement is not None:
            raise ConfigError("rollout.placement: colocate is not supported inside a Tune trial (the trial's placement "
                              "group gives every actor a bundle of its own); use placement: split")
        return True

    def colocated_pg(self) -> Any:
        """The shared placement group of a colocated run, reserved by the first of its roles to start."""
        if self._colocated_pg is None:
            self._colocated_pg = reserve_colocated(self.cfg)
        return self._colocated_pg

    def max_restarts(self, role: str) -> int:
        """Ray restarts of a dead worker: rollout and reward workers heal (``<role>.max_restarts``); the others'
        state (learner shards, env episodes) cannot be rebuilt by a restart alone, so their death fails the run."""
        return getattr(self.cfg, role).max_restarts if role in SELF_HEALING_ROLES else 0

    def learner_group(self, build: Callable[[], Any], wait: bool = True) -> Any:
        """The learner ranks, joined into one torch.distributed group, each holding ``build()``.

        ``wait=False``: return once the actors are created; `started` waits for them (and the other roles' actors
        starting meanwhile) and then joins them, so nothing may call the group before `started`."""
        from toolbox.actors.learner import LearnerWorker

        lc = self.cfg.learner
        kwargs = lambda r: dict(rank=r, world_size=lc.num_workers, build=build, distributed=lc.strategy != "single",  # noqa: E731
                                backend=lc.backend, torch_threads=lc.torch_threads, seed=self.cfg.trainer.seed,
                                device=lc.device, traces=self.cfg.trainer.log_samples_every > 0)
        group = self.group("learner", LearnerWorker, lc.num_workers, kwargs, lc.timeout_s, lc.cpus_per_worker,
                           lc.gpus_per_worker, wait=wait or self.cfg.ray.local_mode)
        if wait or self.cfg.ray.local_mode:
            self.mark("actors")
            self._join(group)
            self.mark("process_group")
        else:
            self.joining.append(group)
        return group

    def _join(self, group: Any) -> None:
        lc = self.cfg.learner
        join_process_group(group, lc.timeout_s)
        if not self.cfg.ray.local_mode:  # a dead rank: every rank anew, joined again (`PolicyLearnerGroup.restart`)
            group.max_replacements = lc.max_restarts
            group.on_replace = functools.partial(join_process_group, timeout_s=lc.timeout_s)

    def algorithm(self, cls: type[A]) -> A:
        """The algorithm section as its own config class (what an algorithm's wiring reads)."""
        algo = self.cfg.algorithm
        if not isinstance(algo, cls):
            raise TypeError(f"algorithm {algo.name!r} has a {type(algo).__name__}, its wiring expects a {cls.__name__}")
        return algo

    def trainer_config(self) -> TrainerConfig:
        return self.cfg.trainer.model_copy(update={"resume_from": self.resume_from})

    def build_trainer(self) -> Any:
        from toolbox.algorithms import ALGORITHMS

        if not self.cfg.ray.local_mode:
            check_run_root_shared(self.cfg, live_nodes())
        name = self.cfg.algorithm.name
        plan = ALGORITHMS.get(name).factory(self)
        if not isinstance(plan, AlgorithmPlan):
            raise TypeError(f"algorithm {name!r}: its wiring returned a {type(plan).__name__}, not the AlgorithmPlan "
                            "of toolbox.algorithms.plan that the builder starts (docs/adding-an-algorithm.md)")
        bus = EventBus()
        return plan.loop(self.start(plan, lambda: self.listen(bus)), bus)

    def listen(self, bus: EventBus) -> None:
        """Attach the run's listeners to ``bus``: the start-up clock first (the first step's metrics get the start-up
        phases before callbacks see them), the configured callbacks, then the remote publisher (what the callbacks
        write at an event is published with it)."""
        if self.clock is not None:
            self.clock.attach(bus, self.run_dir)
        inject = {"run_dir": self.run_dir, "total_steps": self.cfg.trainer.total_steps}
        for spec in self.cfg.callbacks:
            CALLBACKS.build(spec, inject=inject).attach(bus)
        if self.remote is not None:
            RemotePublish(self.remote, self.run_dir).attach(bus)

    def start(self, plan: AlgorithmPlan, meanwhile: Callable[[], None] = lambda: None) -> Groups:
        """Carry ``plan`` out: the learner's actors first (its ranks take longest to start, and the actors created
        first take the worker processes Ray started ahead), then each role's in the plan's order, all starting at
        once; the driver's own loading meanwhile (the tokenizer, then ``meanwhile``: the run's callbacks, whose
        libraries take 0.3 CPU s to import for TensorBoard alone, which the actors need not wait for); one wait for
        them all, in which the learner ranks join their process group and build their learners as soon as they are
        up; then the weight-sync path from the learner to the rollout workers. Returns each role's typed group."""
        raw = {"learner": self.learner_group(plan.learner.build, wait=False)}
        for role in plan.roles:
            w = role.workers
            raw[role.name] = raw[role.on] if w is None else self.group(
                role.name, w.cls, w.count, w.kwargs, w.timeout_s, w.cpus, w.gpus, wait=w.wait)
        if "rollout" in raw:
            self.tokenizer  # noqa: B018 - the cached property's work (the driver tokenises the prompts) is the point
        meanwhile()
        self.started()
        groups = {"learner": plan.learner.facade(raw["learner"]), **{r.name: r.facade(raw[r.name]) for r in plan.roles}}
        if "rollout" in groups:
            open_weight_sync(self.cfg, self.nodes, groups["learner"], groups["rollout"])
        return groups

    def shutdown(self) -> None:
        for group in self.groups:
            group.shutdown()
        self.groups = []
        if self._colocated_pg is not None:  # the groups in it do not own it
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._colocated_pg)
            self._colocated_pg = None


def join_process_group(group: Any, timeout_s: float) -> None:
    """Rank 0 picks a free port on its node; every rank joins the process group there and builds its learner."""
    from toolbox.actors.calls import Args
    from toolbox.actors.learner import LearnerWorker

    addr, port = group.call(LearnerWorker.rendezvous, [Args()], ranks=[0])[0]
    group.each(LearnerWorker.setup, addr, port, timeout_s).result()


