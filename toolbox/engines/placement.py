"""Where rollout engines sit relative to the learner, and which path the weight sync takes because of it.

``rollout.placement``:

- ``split`` (default): each role has its own placement group; a GPU belongs to one role.
- ``colocate``: learner rank i and rollout worker i share bundle i of one placement group, which holds both
  actors' CPUs and GPUs (`colocated_bundle`). With fractional GPUs that add up to at most one (e.g. 0.5 + 0.5)
  the bundle reserves one GPU and Ray gives both actors that device. The online loop then puts the engines to
  sleep while the learner trains (`toolbox.trainers.online.OnlineTrainer`).

`choose_sync_path` picks the weight-sync path from the config and, once the actors run, their nodes:
``shared_memory`` (``hf`` engines on learner rank 0's node, full weights: `toolbox.rl.shared_weights`),
``object_store`` (engines on other nodes, engines that load CPU buckets, LoRA, in-process runs), ``cuda_ipc``
(vLLM / SGLang on the learner's own GPU) or ``nccl`` (both on GPUs of their own, on any nodes: learner rank 0
broadcasts into the engines, `toolbox.engines.nccl_sync`). ``nccl`` runs for vLLM and SGLang; an SGLang engine
with data-parallel replicas (``engine_kwargs.dp_size > 1``, which SGLang's distributed update refuses) falls back
to the object store, and the choice says so (`SyncPath.runs`). `engine_weight_transfer` tells the engine at start
which backend to load (vLLM fixes it then).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from toolbox.core.errors import ConfigError

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig

Placement = Literal["split", "colocate"]
COLOCATED_ROLES = ("rollout", "learner")
# Engines whose sleep() frees GPU memory only when started for it: engine name -> the option that allows it.
SLEEP_OPTIONS = {"vllm": "enable_sleep_mode", "sglang": "enable_memory_saver"}
# Engines that can take weights over CUDA IPC from tensors on their GPU (toolbox.engines.vllm / sglang).
IPC_ENGINES = ("vllm", "sglang")


def check_colocation(cfg: ExperimentConfig) -> None:
    """At config load: what ``rollout.placement: colocate`` needs (one engine per learner rank, engines that can
    sleep, one strategy for the shared placement group), and what ``split`` must not do (`check_split_gpus`)."""
    if cfg.rollout.placement != "colocate":
        check_split_gpus(cfg)
        return
    if "rollout" not in cfg.algorithm.roles or "learner" not in cfg.algorithm.roles:
        raise ConfigError(f"rollout.placement: colocate pairs rollout workers with learner ranks; algorithm "
                          f"{cfg.algorithm.name!r} has the roles {list(cfg.algorithm.roles)}")
    if cfg.rollout.num_workers != cfg.learner.num_workers:
        raise ConfigError(f"rollout.placement: colocate puts rollout worker i with learner rank i, so "
                          f"rollout.num_workers ({cfg.rollout.num_workers}) must equal learner.num_workers "
                          f"({cfg.learner.num_workers})")
    option = SLEEP_OPTIONS.get(cfg.rollout.engine.name)
    if option is not None and not getattr(cfg.rollout.engine, option):
        raise ConfigError(f"rollout.placement: colocate puts the {cfg.rollout.engine.name} engine to sleep while the "
                          f"learner trains; set rollout.engine.{option}: true")
    strategies = {role: cfg.ray.placement[role].strategy for role in COLOCATED_ROLES if role in cfg.ray.placement}
    if len(set(strategies.values())) > 1:
        raise ConfigError(f"rollout.placement: colocate puts rollout and learner in one placement group; "
                          f"ray.placement gives them different strategies {strategies}")


def check_split_gpus(cfg: ExperimentConfig) -> None:
    """``placement: split`` with a fraction of a GPU per NCCL rank: Ray may pack two such actors onto one GPU, and
    NCCL refuses a communicator with two ranks on one device ("Duplicate GPU detected"). The ranks of one
    communicator are the learner's (fsdp2 / ddp on cuda) and, with the NCCL weight sync, learner rank 0 with every
    engine worker."""
    learner, rollout = cfg.learner, cfg.rollout
    fraction = {role: g for role, g in (("learner", learner.gpus_per_worker), ("rollout", rollout.gpus_per_worker))
                if 0 < g < 1}
    if "learner" in fraction and learner.num_workers > 1 and learner.strategy != "single" and learner.device != "cpu":
        raise ConfigError(f"learner.gpus_per_worker: {fraction['learner']:g} with {learner.num_workers} ranks: Ray may "
                          f"put two ranks on one GPU, which NCCL refuses (Duplicate GPU detected); give each rank a "
                          f"whole GPU, or share GPUs with the engines through rollout.placement: colocate")
    if fraction and "rollout" in cfg.algorithm.roles and choose_sync_path(cfg).runs == "nccl":
        role, share = next(iter(fraction.items()))
        raise ConfigError(f"{role}.gpus_per_worker: {share:g} with the NCCL weight sync (rollout.placement: split): "
                          f"Ray may put learner rank 0 and an engine worker on one GPU, which NCCL refuses; give "
                          f"learner ranks and rollout workers whole GPUs, or use rollout.placement: colocate")


def colocated_bundle(cfg: ExperimentConfig) -> tuple[dict[str, float], str]:
    """One bundle (learner rank i + rollout worker i: their CPUs, GPUs and custom resources added up) and the
    strategy of the shared placement group (``ray.placement.learner`` or ``.rollout``, else PACK)."""
    bundle: dict[str, float] = {}
    strategy = "PACK"
    for role in COLOCATED_ROLES:
        section = getattr(cfg, role)
        where = cfg.ray.placement.get(role)
        wants = {"CPU": section.cpus_per_worker, "GPU": section.gpus_per_worker,
                 **(where.resources if where is not None else {})}
        for key, amount in wants.items():
            bundle[key] = bundle.get(key, 0.0) + amount
        strategy = where.strategy if where is not None else strategy
    if not bundle["GPU"]:
        del bundle["GPU"]
    return bundle, strategy


SyncKind = Literal["object_store", "shared_memory", "cuda_ipc", "nccl"]


def shares_learner_node(learner_nodes: list[str | None] | None, rollout_nodes: list[str | None] | None) -> bool:
    """Whether every rollout worker runs on learner rank 0's Ray node (``False`` while the nodes are unknown)."""
    if not learner_nodes or not rollout_nodes or learner_nodes[0] is None:
        return False
    return all(node == learner_nodes[0] for node in rollout_nodes)


@dataclass(frozen=True)
class SyncPath:
    """The weight-sync path the placement calls for (``chosen``), the one that runs (``runs``), why, and why the
    engine cannot take the chosen one (``fallback``, when they differ)."""

    chosen: SyncKind
    runs: SyncKind
    reason: str
    fallback: str = ""

    def describe(self) -> str:
        """One line for the run's log and ``--dry-run``."""
        if self.chosen == self.runs:
            return f"weight sync: {self.chosen} ({self.reason})"
        return f"weight sync: {self.chosen} chosen ({self.reason}); {self.fallback}: falls back to {self.runs}"


def engine_weight_transfer(cfg: ExperimentConfig) -> dict[str, str]:
    """What the engine builder injects so a vLLM engine starts with the backend the sync will use (vLLM fixes its
    weight-transfer backend at start): ``{"weight_transfer": "nccl"}`` when `choose_sync_path` runs nccl, else
    nothing (the engine's default)."""
    return {"weight_transfer": "nccl"} if choose_sync_path(cfg).runs == "nccl" else {}


def choose_sync_path(cfg: ExperimentConfig, learner_nodes: list[str | None] | None = None,
                     rollout_nodes: list[str | None] | None = None) -> SyncPath:
    """The weight-sync path from the config and, when known, the Ray node of each learner rank and rollout worker.

    ``object_store`` and ``cuda_ipc``: the learner exports CPU buckets; with ``cuda_ipc`` the rollout worker (on the
    learner's node and GPU) copies them onto that GPU and hands vLLM / SGLang CUDA IPC handles
    (`toolbox.engines.vllm`). ``nccl``: no CPU buckets; learner rank 0 broadcasts from its GPU into every engine's
    workers (NCCL also spans nodes, as the learner's own FSDP2 does), so the nodes only change the log line.
    """
    engine, learner, rollout = cfg.rollout.engine.name, cfg.learner, cfg.rollout
    if engine == "hf" and shares_learner_node(learner_nodes, rollout_nodes) and learner.lora is None \
            and not cfg.ray.local_mode:
        return SyncPath("shared_memory", "shared_memory", "learner rank 0 and every hf engine on one node")
    if engine not in IPC_ENGINES:
        return SyncPath("object_store", "object_store", f"the {engine} engine loads CPU buckets itself")
    if learner.device == "cpu" or not learner.gpus_per_worker:
        return SyncPath("object_store", "object_store", "the learner runs on the CPU")
    if not rollout.gpus_per_worker:
        return SyncPath("object_store", "object_store", "the rollout workers reserve no GPU")
    if rollout.placement == "colocate":
        if learner.gpus_per_worker + rollout.gpus_per_worker <= 1:
            return SyncPath("cuda_ipc", "cuda_ipc", f"learner rank i and {engine} engine i share one GPU")
        why = "learner rank i and engine i share a node, on different GPUs"
    elif learner_nodes is not None and rollout_nodes is not None and not set(rollout_nodes) <= set(learner_nodes):
        why = "learner and engines on GPUs of their own; some engines on other nodes (NCCL over the network)"
    else:
        why = "learner and engines on GPUs of their own"
    if learner.lora is not None:
        return SyncPath("object_store", "object_store", "LoRA weights are merged or sent as an adapter on the CPU")
    if cfg.ray.local_mode:
        return SyncPath("object_store", "object_store", "ray.local_mode runs learner and engines one call at a time")
    kwargs = getattr(cfg.rollout.engine, "engine_kwargs", {})
    replicas = int(kwargs.get("dp_size", 1)) if engine == "sglang" else 1
    if replicas > 1:
        return SyncPath("nccl", "object_store", why, f"SGLang's update_weights_from_distributed refuses data-parallel "
                        f"replicas (rollout.engine.engine_kwargs.dp_size: {replicas})")
    return SyncPath("nccl", "nccl", why)
