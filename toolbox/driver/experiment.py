"""`ExperimentBuilder`: config -> run directory, worker groups, trainer, callbacks (dependency injection).

What is common to every algorithm lives here (run directory, model path, groups,
callbacks, Ray connection); what is particular is the algorithm's wiring in `toolbox.algorithms`.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from toolbox.callbacks import CALLBACKS
from toolbox.callbacks.remote import RemotePublish
from toolbox.config.algorithm import AlgorithmConfig
from toolbox.config.loader import dump_config
from toolbox.config.schema import ExperimentConfig, RolePlacement, TrainerConfig
from toolbox.core.errors import ConfigError
from toolbox.core.events import EventBus
from toolbox.core.storage import RemoteDir, is_remote, staging_root
from toolbox.data.offline import OfflineDataConfig
from toolbox.data.tasks import TASKS
from toolbox.driver.local_ray import LOCAL_DEFAULTS, WORKER_ENV, actor_env, start_local
from toolbox.models.catalog import resolve_source
from toolbox.models.tiny import ensure_tiny_model
from toolbox.trainers.checkpoints import latest_checkpoint, resolve_resume

A = TypeVar("A", bound=AlgorithmConfig)
log = logging.getLogger(__name__)
SELF_HEALING_ROLES = ("rollout", "reward")  # their workers take a `supervisor` (toolbox.actors.supervisor)


def make_run_dir(cfg: ExperimentConfig) -> Path:
    """``run_root/run_name`` (with a remote run_root: its local staging copy under ``trainer.staging_root``); a
    resumed run without a name continues in the local directory it resumes from."""
    t = cfg.trainer
    resume = Path(t.resume_from) if t.resume_from and not is_remote(t.resume_from) else None
    if resume is not None and not t.run_name:
        run_dir = resume if (resume / "checkpoints").is_dir() else resume.parent.parent
        if (run_dir / "config.yaml").exists():
            return run_dir
    name = t.run_name or f"{cfg.experiment}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    remote = is_remote(t.run_root)
    run_dir = (staging_root(t.staging_root) if remote else Path(t.run_root).resolve()) / name
    if not t.run_name:  # two runs started in the same second get their own directories
        n = 1
        while run_dir.exists() or (remote and RemoteDir(f"{t.run_root}/{run_dir.name}").exists("")):
            n += 1
            run_dir = run_dir.with_name(f"{name}-{n}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def resolve_model_path(cfg: ExperimentConfig, run_root: Path) -> str:
    """The directory or hub id to load. A tiny model is built (once, deterministically) when asked for; a catalog
    name is its fetched directory and a ``model.gguf_file`` its converted one (`toolbox.models.catalog`)."""
    model = cfg.model
    if model.tiny is None:
        if not model.path:
            raise ConfigError("model.path is empty and model.tiny is null: name a model directory or hub id")
        return with_cold_start(cfg, resolve_source(model.path, model.gguf_file), run_root)
    task = TASKS.build(cfg.task, inject={"data": cfg.data})
    digest = hashlib.sha1((model.name + model.tiny.model_dump_json() + task.alphabet()).encode()).hexdigest()[:10]
    path = Path(model.path) if model.path else run_root / ".models" / f"tiny-{model.name}-{model.tiny.arch}-{digest}"
    return with_cold_start(cfg, str(ensure_tiny_model(path, model.tiny, task.alphabet(), model.name)), run_root)


def with_cold_start(cfg: ExperimentConfig, base: str, run_root: Path) -> str:
    """``base``, or with ``model.cold_start`` the policy its supervised run exports from it (`toolbox.driver.cold_start`)."""
    if cfg.model.cold_start is None:
        return base
    from toolbox.driver.cold_start import cold_start

    return cold_start(cfg, base, run_root)


def check_model_path(path: str, trust_remote_code: bool = False) -> None:
    """Load the model's config on the driver, so a wrong path fails once, here, before any actor loads it."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path: cannot load a model config from {path!r} (a local directory with "
                          f"config.json, or a hub id): {str(err).splitlines()[0]}") from None


def check_specs(cfg: ExperimentConfig) -> None:
    """What only building a component or asking its server tells, on the driver before Ray starts: the reward
    builds (a factory that fails would otherwise fail 20 s later inside every reward worker), and a training
    run's engine can take weight updates (the http engine asks its server). A reward factory is expected to
    be light (imports, compiled patterns); one that loads a model should do so on its first call."""
    from toolbox.rewards import REWARDS

    if "reward" in cfg.algorithm.roles:
        try:
            REWARDS.build(cfg.reward.spec)
        except Exception as err:  # any factory failure is a config problem of reward.spec; say which
            raise ConfigError(f"reward.spec: {cfg.reward.spec.name!r} cannot be built: {type(err).__name__}: {err}") \
                from None
    check_training = getattr(cfg.rollout.engine, "check_training", None)
    if "rollout" in cfg.algorithm.roles and check_training is not None:
        check_training(probe=True)


def find_resume(target: str) -> str:
    """A run directory: its newest complete checkpoint (never a partial one); anything else: itself."""
    if not target:
        return ""
    latest = latest_checkpoint(Path(target))
    return str(latest if latest else target)


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
        self.remote = RemoteDir(f"{cfg.trainer.run_root}/{self.run_dir.name}") if is_remote(cfg.trainer.run_root) \
            else None
        if isinstance(cfg.algorithm, OfflineDataConfig) and (cfg.algorithm.dataset or cfg.algorithm.eval_dataset):
            cfg.algorithm.check_rows(cfg.data, self.tokenizer)  # tokenised records, before Ray
        self.resume_from = resolve_resume(cfg.trainer.resume_from, self.run_dir, self.remote)  # fails here, early
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
                                device=lc.device)
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
            check_run_root_shared(self.cfg.trainer, live_nodes())
        bus = EventBus()
        if self.clock is not None:  # first: the first step's metrics get the start-up phases before callbacks see them
            self.clock.attach(bus, self.run_dir)
        inject = {"run_dir": self.run_dir, "total_steps": self.cfg.trainer.total_steps}
        for spec in self.cfg.callbacks:
            CALLBACKS.build(spec, inject=inject).attach(bus)
        if self.remote is not None:  # after the callbacks: what they write at an event is published with it
            RemotePublish(self.remote, self.run_dir, self.cfg.trainer.keep_checkpoints).attach(bus)
        trainer = ALGORITHMS.get(self.cfg.algorithm.name).factory(self, bus)
        self.started()  # a wiring that started groups without waiting and did not wait itself
        return trainer

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


def role_size(cfg: ExperimentConfig, role: str) -> tuple[int, float, float]:
    """(workers, CPUs each, GPUs each) of a role, from its config section (rollout, reward or learner)."""
    section = getattr(cfg, role)
    return section.num_workers, section.cpus_per_worker, getattr(section, "gpus_per_worker", 0.0)


def trial_bundles(cfg: ExperimentConfig, driver_cpus: float = 0.01) -> list[dict[str, float]]:
    """Placement-group bundles for one whole experiment: the driver's, then every role's workers."""
    return [{"CPU": driver_cpus}, *(bundle for _, bundle in role_bundles(cfg))]


def role_bundles(cfg: ExperimentConfig) -> list[tuple[str, dict[str, float]]]:
    """(role, Ray resources) of every actor of a run, in the order of the roles: CPUs, GPUs and the role's
    custom resources (``ray.placement.<role>.resources``)."""
    out = []
    for role in cfg.algorithm.roles:
        n, cpus, gpus = role_size(cfg, role)
        custom = cfg.ray.placement.get(role, RolePlacement()).resources
        out += [(role, {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **custom})] * n
    return out


def live_nodes() -> int:
    """How many nodes of the connected Ray cluster are alive."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check_run_root_shared(trainer: TrainerConfig, nodes: int) -> None:
    """On a cluster of several nodes, learner ranks elsewhere write checkpoints under run_root: it must be shared."""
    if nodes > 1 and not trainer.shared_fs:
        raise ConfigError(
            f"trainer.run_root={trainer.run_root!r} is a local path and the Ray cluster has {nodes} nodes: actors on "
            "other nodes would write checkpoints to their own disks. Put run_root on a filesystem every node mounts "
            "(NFS, a Kubernetes ReadWriteMany volume such as deploy/kuberay/pvc.yaml) and pass trainer.shared_fs=true.")


def ray_init_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    """Connect to ``ray.address`` / RAY_ADDRESS (a cluster, or ray job submit) or start a new local instance.

    Without an address the instance is always a new one (``address="local"``): ``None`` would join whatever
    cluster /tmp/ray/ray_current_cluster names, someone else's, or a dead one that hangs start-up forever. Its
    workers inherit `WORKER_ENV` from the raylet (`connect_ray`) rather than from a job runtime env, which would
    keep Ray from handing the worker processes it starts ahead to our actors.
    """
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS") or "local"
    if address != "local":
        return {"address": address, "runtime_env": {"env_vars": WORKER_ENV}}
    kwargs = dict(LOCAL_DEFAULTS)
    if cfg.ray.num_cpus:
        kwargs["num_cpus"] = cfg.ray.num_cpus
    return kwargs


# Ray's own knob for how many times (about one a second) a driver tries to reach the GCS before giving up.
GCS_ATTEMPTS_ENV = "RAY_gcs_server_port_wait_time_s"


def connect_ray(cfg: ExperimentConfig, **overrides: Any) -> None:
    """``ray.init`` as `ray_init_kwargs` says (``overrides`` on top), bounded by ``ray.connect_timeout_s``.

    A given address must accept a connection within the timeout, or `ConfigError` names it and what to do;
    then Ray makes one attempt to reach its GCS (it would otherwise retry for many minutes).
    """
    import ray

    kwargs = {**ray_init_kwargs(cfg), **overrides}
    address = str(kwargs["address"])
    if address == "local":
        start_local(kwargs)
        return
    field = f"ray.address={address}" if cfg.ray.address else f"RAY_ADDRESS={address}"
    timeout = cfg.ray.connect_timeout_s
    advice = ("start the cluster (`ray start --head`) or fix the address; leave ray.address and RAY_ADDRESS unset to "
              "start a local instance")
    problem = unreachable(address, timeout)
    if problem:
        raise ConfigError(f"{field}: no Ray cluster answers within {timeout:g}s (ray.connect_timeout_s): {problem}; "
                          f"{advice}")
    previous = os.environ.get(GCS_ATTEMPTS_ENV)
    os.environ.setdefault(GCS_ATTEMPTS_ENV, "1")
    try:
        ray.init(**kwargs)
    except ConnectionError as err:
        raise ConfigError(f"{field}: something listens there but Ray could not connect ({err}); {advice}") from None
    finally:
        if previous is None:
            os.environ.pop(GCS_ATTEMPTS_ENV, None)


def unreachable(address: str, timeout_s: float) -> str:
    """Why nothing accepts a TCP connection at ``address`` (``host:port``, ``ray://host:port`` or ``auto``) within
    ``timeout_s``, retrying twice a second (a head may be starting); empty when something does."""
    host, port, problem = _host_port(address)
    if problem:
        return problem
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return ""
        except OSError as err:
            problem = f"{host}:{port}: {err.strerror or err}"
        if time.monotonic() + 0.5 >= deadline:
            return problem
        time.sleep(0.5)


def _host_port(address: str) -> tuple[str, int, str]:
    """``(host, port, "")``, or ``("", 0, why)`` when ``address`` names no host."""
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            found = canonicalize_bootstrap_address(address)
        except ConnectionError as err:
            return "", 0, str(err)
        if not found:
            return "", 0, "address=auto found no running cluster on this machine"
        address = found
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or (10001 if parts.scheme == "ray" else 6379)
    except ValueError as err:
        return "", 0, f"not a host:port address ({err})"
    if not parts.hostname:
        return "", 0, "not a host:port address"
    return parts.hostname, port, ""


def reserve_colocated(cfg: ExperimentConfig) -> Any:
    """The shared placement group of a colocated run: ``learner.num_workers`` bundles of `colocated_bundle`
    (bundle i: learner rank i and rollout worker i), scheduled within ``ray.placement_timeout_s``."""
    import ray

    from toolbox.actors.group import reserve
    from toolbox.engines.placement import colocated_bundle

    bundle, strategy = colocated_bundle(cfg)
    n, timeout = cfg.learner.num_workers, cfg.ray.placement_timeout_s
    return reserve(bundle, n, strategy, timeout, lambda: ConfigError(
        f"rollout.placement: colocate: a placement group of {n} x {bundle} (learner rank + rollout worker per "
        f"bundle) was not scheduled within {timeout:g}s (ray.placement_timeout_s); free now: "
        f"{ {k: ray.available_resources().get(k, 0.0) for k in bundle} }. Lower learner/rollout cpus_per_worker "
        "or gpus_per_worker, or add nodes"))
