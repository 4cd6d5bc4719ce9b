"""``toolbox run ... --dry-run``: what a config would start and spend, printed before anything starts.

Four rich tables: the settings that differ from the defaults, the actors per role with their resources and
placement groups (from `toolbox.driver.placement.role_size` / `trial_bundles`, the code that sizes the real groups),
the batch arithmetic per rank, and an estimate of one learner rank's memory.

Starts nothing: no Ray, no run directory, no weights. The model's shape comes from its config alone
(`toolbox.driver.model_shape`); the memory figure is an estimate (`toolbox.driver.memory_estimate`, which says what
it leaves out). On GPUs `toolbox.driver.gpu_plan` adds the engines' reservation and says whether it all fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolbox.config.algorithm import PAIR_ROWS
from toolbox.config.schema import ExperimentConfig
from toolbox.driver.memory_estimate import GiB, memory_lines, rank_device
from toolbox.driver.model_shape import model_shape

# The worker class each role's group starts (`toolbox.actors`), shown in the actors table.
ROLE_ACTORS = {"rollout": "RolloutWorker", "reward": "RewardWorker", "learner": "LearnerWorker",
               "env": "EnvRunnerWorker"}


def changed_settings(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """(path, value) of every leaf that differs from the defaults (the algorithm against its own class's)."""
    from toolbox.algorithms.ppo_env.config import changed_fields

    default = ExperimentConfig()
    leaves = [leaf for name in ExperimentConfig.model_fields if name != "algorithm"
              for leaf in changed_fields(name, getattr(cfg, name), getattr(default, name))]
    if cfg.algorithm.name != default.algorithm.name:
        leaves.append(f"algorithm.name={cfg.algorithm.name!r}")
    leaves += changed_fields("algorithm", cfg.algorithm, type(cfg.algorithm)())
    return [(path, value) for path, _, value in (leaf.partition("=") for leaf in leaves)]


def actor_rows(cfg: ExperimentConfig) -> list[tuple[str, ...]]:
    """Per role, in the order the algorithm builds them: actors, resources each, and their placement group."""
    from toolbox.driver.placement import role_size, trial_bundles
    from toolbox.engines.placement import colocated_bundle

    bundles, first = trial_bundles(cfg)[1:], 0
    rows: list[tuple[str, ...]] = []
    placement = getattr(cfg.ray, "placement", {})
    for role in cfg.algorithm.roles:
        n, cpus, gpus = role_size(cfg, role)
        bundle = bundles[first] if n else {}
        first += n
        strategy = getattr(placement.get(role), "strategy", "PACK")
        where = ("in-process (ray.local_mode)" if cfg.ray.local_mode
                 else f"{n} x {_bundle_text(bundle)}, {strategy}")
        if role == "reward" and not n:
            where = "none: each rollout worker scores its own batches (reward.num_workers: 0)"
        if colocated(cfg, role) and not cfg.ray.local_mode:
            shared, strategy = colocated_bundle(cfg)
            other = "learner rank" if role == "rollout" else "rollout worker"
            where = f"one, with {other} i in bundle i: {n} x {_bundle_text(shared)}, {strategy}"
        each = f"{cpus:g} CPU" + (f", {gpus:g} GPU" if gpus else "")
        rows.append((role, ROLE_ACTORS.get(role, role), str(n), each, where, _role_detail(cfg, role)))
    return rows


def colocated(cfg: ExperimentConfig, role: str) -> bool:
    from toolbox.engines.placement import COLOCATED_ROLES

    return cfg.rollout.placement == "colocate" and role in COLOCATED_ROLES


def _bundle_text(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


def _role_detail(cfg: ExperimentConfig, role: str) -> str:
    lc = cfg.learner
    return {"rollout": f"engine {cfg.rollout.engine.name}", "reward": f"reward {cfg.reward.spec.name}",
            "env": f"{cfg.env.id}, {cfg.env.num_envs} envs each",
            "learner": f"{lc.strategy}, backend {lc.backend}, device {getattr(lc, 'device', 'cpu')}"}.get(role, "")


def batch_rows(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """The batch arithmetic of one training step, as the algorithm describes its batch (`AlgorithmConfig.batch`)."""
    shape, ranks, micro = cfg.algorithm.batch(cfg), cfg.learner.num_workers, cfg.learner.micro_batch_size
    if shape is None:
        return [("batch arithmetic", f"algorithm {cfg.algorithm.name!r} does not describe its batch "
                                     "(AlgorithmConfig.batch)")]
    rows = list(shape.how)
    if shape.rows_per_example == PAIR_ROWS:
        rows.append(("model rows per example", f"{PAIR_ROWS} (a pair: chosen and rejected)"))
    elif shape.rows_per_example > 1:
        rows.append(("model rows per example", str(shape.rows_per_example)))
    unit, minis, epochs = shape.unit, shape.mini_batches, shape.epochs
    per_rank = shape.examples // ranks
    per_mini = per_rank // minis
    rows.append(("per learner rank", f"{shape.examples} / {ranks} ranks = {per_rank} {unit}"))
    if shape.micro_batched:
        rows += [("per optimizer step and rank", f"{per_rank} / {minis} mini-batches = {per_mini} {unit}"),
                 ("micro-batches (grad. accumulation)",
                  f"{per_mini} / micro_batch_size {micro} = {max(1, per_mini // micro)}")]
    rows.append(("optimizer steps per step", f"{epochs} epochs x {minis} mini-batches = {epochs * minis}"))
    return rows


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 100 else f"{n / 1024**2:.2f} MiB"


def print_dry_run(cfg: ExperimentConfig, console: Console | None = None, gpu_gib: float | None = None) -> int:
    """Print the four tables, and for a run on GPUs whether it fits GPUs of ``gpu_gib`` GiB (default 80). Exit code
    0, or 2 when the model's config cannot be read (``model.path``)."""
    from toolbox.core.errors import ConfigError

    console = console or Console()
    try:
        memory = memory_table(cfg)  # first: the one part that can still fail (an unreadable model.path)
    except ConfigError as err:
        Console(stderr=True).print(f"[bold red]config error[/]: {escape(str(err))}", soft_wrap=True)
        return 2
    console.print(_table(f"experiment {cfg.experiment}: settings that differ from the defaults (`toolbox config` "
                         "prints them all)", ("setting", "value"), changed_settings(cfg)))
    console.print(_table("actors that would start (one placement group per role)",
                         ("role", "actor", "count", "each", "placement group", "what"), actor_rows(cfg)))
    cold = cfg.model.cold_start
    if cold is not None:
        console.print(escape(f"model.cold_start: experiment {cold.experiment} {' '.join(cold.overrides)} runs first in "
                             f"the driver's process (local mode, one learner rank) unless {cfg.trainer.run_root}/.models "
                             "holds it from before; this run starts from the policy it exports"), soft_wrap=True)
    if "rollout" in cfg.algorithm.roles:
        from toolbox.engines.placement import choose_sync_path

        console.print(escape(choose_sync_path(cfg).describe() + " (before start: nodes unknown)"), soft_wrap=True)
    console.print(_table("batch arithmetic of one training step", ("quantity", "value"), batch_rows(cfg)))
    console.print(memory)
    if rank_device(cfg) == "cuda" or cfg.rollout.gpus_per_worker and "rollout" in cfg.algorithm.roles:
        from toolbox.driver.gpu_plan import DEFAULT_GPU_GIB, describe, gpu_plan

        for line in describe(gpu_plan(cfg, model_shape(cfg), gpu_gib or DEFAULT_GPU_GIB)):
            console.print(escape(line), soft_wrap=True)
    console.print("[dim]dry run: nothing was started, no run directory was written.[/]")
    return 0


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def memory_table(cfg: ExperimentConfig) -> Any:
    """The memory estimate of one learner rank as a table (or a line saying why there is none)."""
    if cfg.algorithm.models().policy == "mlp":
        return "memory per learner rank: an MLP policy (algorithm.policy.hidden_sizes); negligible, not estimated"
    shape = model_shape(cfg)
    lc = cfg.learner
    lines = memory_lines(cfg, shape)
    rows = [(line.what, _gib(line.bytes), line.where, line.how) for line in lines]
    for where in dict.fromkeys(line.where for line in lines):
        total = sum(line.bytes for line in lines if line.where == where)
        rows.append((f"[bold]total on {where}[/]", f"[bold]{_gib(total)}[/]", where, ""))
    title = (f"memory per learner rank (estimate): {shape.source}, {shape.params / 1e6:,.2f} M parameters, "
             f"{lc.strategy} x {lc.num_workers}, {cfg.model.dtype} parameters, mixed_precision "
             f"{getattr(lc, 'mixed_precision', 'fp32')}, offload {getattr(lc, 'offload', 'none')}")
    return _table(title, ("item", "size", "where", "how"), rows)
