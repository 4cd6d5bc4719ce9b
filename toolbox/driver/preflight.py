"""What the driver resolves and checks before Ray starts: the run directory, the checkpoint to resume, the model
to load (a tiny model built, a cold start trained) and the specs only building them can check, so a bad config
fails once, here, not inside every worker."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.core.storage import RemoteDir, is_remote, staging_root
from toolbox.data.tasks import TASKS
from toolbox.models.catalog import resolve_source
from toolbox.models.tiny import ensure_tiny_model
from toolbox.trainers.checkpoints import latest_checkpoint


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
        while run_dir.exists() or (remote and RemoteDir(f"{t.run_root}/{run_dir.name}", t.storage_retry).exists("")):
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
    return with_cold_start(cfg, str(ensure_tiny_model(path, model.tiny, task.alphabet(), model.name, apart=True)),
                           run_root)


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


def check_run_root_shared(cfg: ExperimentConfig, nodes: int) -> None:
    """On a cluster of several nodes, every file a worker on one node writes or reads must be where the others and
    the driver reach it: a local run_root must be shared (``trainer.shared_fs``); a remote one needs no shared disk
    (checkpoints and exports go straight to the store) but for what the driver builds on its own disk for the
    workers to read, or they write beside the run directory."""
    trainer = cfg.trainer
    if nodes < 2 or trainer.shared_fs:
        return
    shared = ("a filesystem every node mounts (NFS, a Kubernetes ReadWriteMany volume such as deploy/kuberay/pvc.yaml) "
              "and pass trainer.shared_fs=true")
    if not is_remote(trainer.run_root):
        raise ConfigError(f"trainer.run_root={trainer.run_root!r} is a local path and the Ray cluster has {nodes} "
                          f"nodes: actors on other nodes would write checkpoints to their own disks. Put run_root on "
                          f"{shared}, or use a remote run_root (s3://, gs://, ...).")
    local = {"model.tiny": "the tiny model is built on the driver's disk" if cfg.model.tiny is not None else "",
             "model.cold_start": "the cold-start policy is trained into the driver's staging directory"
             if cfg.model.cold_start is not None else "",
             "model.gguf_file": "the GGUF file is converted on the driver's disk" if cfg.model.gguf_file else "",
             "trainer.profile_steps": "each learner rank writes its trace into its own staging directory"
             if trainer.profile_steps else "",
             "trainer.resume_from": "the checkpoint is on the driver's disk"
             if trainer.resume_from not in ("", "auto") and not is_remote(trainer.resume_from) else ""}
    for field, why in local.items():
        if why:
            raise ConfigError(
                f"{field}: the Ray cluster has {nodes} nodes and {why}, which workers on other nodes cannot read "
                f"(trainer.run_root={trainer.run_root!r} is remote, but trainer.staging_root="
                f"{str(staging_root(trainer.staging_root))!r} is not shared). Put staging_root on {shared}"
                + (", or pass a model every node can load (a hub id)" if field.startswith("model.") else "") + ".")
