"""``toolbox eval model=DIR_OR_RUN [experiment=NAME] samples=K [a.b.c=value ...]``: score a model on an eval split.

The experiment config says what to evaluate on: ``task`` (its eval split; a generated toy
task samples ``prompts`` held-out problems), ``reward.spec``, ``rollout.engine`` and
``rollout.sampling``; any field can be overridden as in ``toolbox.run``. With
``model=RUN_DIR`` the run's own ``config.yaml`` is the default experiment and its exported
model (``RUN_DIR/hf``) is evaluated. Eval options (not experiment fields): ``model``,
``samples`` (per prompt, K of pass@K), ``prompts`` (0: the whole split), ``threshold``
(reward that counts as a pass), ``batch`` (rows per generate call), ``out`` (default
``RUN_DIR/eval`` or ``./eval-<time>``). Runs on Ray workers when ``rollout.num_workers > 1``,
in this process otherwise. Writes ``eval.json`` (metrics) and ``eval_samples.jsonl`` (prompt,
responses, rewards per line).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from toolbox.core.errors import ConfigError, WorkerError


class EvalOptions(BaseModel):
    """What ``toolbox.commands.eval`` takes besides the experiment's fields."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field("", description="A Hugging Face model directory, a run directory (its hf/ export) or a hub id; "
                       "empty: the experiment's own model (the untrained base).")
    samples: int = Field(1, ge=1, description="Samples per prompt; pass@K uses K = samples.")
    prompts: int = Field(0, ge=0, description="Prompts to evaluate; 0: the whole eval split (a generated toy task: "
                         "trainer.eval_prompts held-out problems).")
    threshold: float = Field(1.0, description="A sample passes when its reward is at least this.")
    batch: int = Field(64, ge=1, description="Rows (prompt x sample) per generate call.")
    out: str = Field("", description="Output directory; empty: RUN_DIR/eval for a run, else ./eval-<time>.")


def split_args(argv: list[str]) -> tuple[EvalOptions, list[str]]:
    """Eval options (``samples=4``) apart from experiment overrides (``task.name=...``, ``experiment=...``)."""
    mine = {key: raw for key, _, raw in (a.partition("=") for a in argv) if key in EvalOptions.model_fields}
    rest = [a for a in argv if a.partition("=")[0] not in EvalOptions.model_fields]
    try:
        opts = EvalOptions.model_validate(mine)
    except ValidationError as err:
        first = err.errors()[0]
        raise ConfigError(f"{first['loc'][0]}: {first['msg']}") from None
    if opts.model and _is_run_dir(Path(opts.model)) and not any(a.startswith("experiment=") for a in rest):
        rest = [f"experiment={Path(opts.model) / 'config.yaml'}", *rest]
    return opts, rest


def _is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file()


def resolve_model(opts: EvalOptions, cfg: Any) -> str:
    """The directory or hub id to evaluate: ``model=`` (a run directory means its hf/ export; a catalog name its
    fetched copy; with ``model.gguf_file`` a directory holding that GGUF file), else the config's."""
    from toolbox.driver.preflight import check_model_path, resolve_model_path
    from toolbox.models.catalog import resolve_source

    if not opts.model:
        return resolve_model_path(cfg, Path(cfg.trainer.run_root).resolve())
    path = Path(opts.model)
    if (path / "config.json").is_file():
        return str(path)
    if _is_run_dir(path):
        if (path / "hf" / "config.json").is_file():
            return str(path / "hf")
        raise ConfigError(f"model={opts.model}: the run has no exported model ({path / 'hf'}); export it with "
                          f"`toolbox export {path} {path / 'hf'}` (or train with trainer.export=true)")
    resolved = resolve_source(opts.model, cfg.model.gguf_file, field="model")
    if resolved != opts.model:  # a catalog name or a GGUF: a model directory now
        return resolved
    if path.exists():
        raise ConfigError(f"model={opts.model}: neither a model directory (config.json) nor a run directory (config.yaml)")
    check_model_path(opts.model, cfg.model.trust_remote_code)  # a hub id
    return opts.model


def output_dir(opts: EvalOptions, model_path: str) -> Path:
    """``out=``, else the run's ``eval/`` beside its ``hf/`` export, else ``./eval-<time>``."""
    if opts.out:
        return Path(opts.out)
    model = Path(model_path)
    if model.name == "hf" and _is_run_dir(model.parent):
        return model.parent / "eval"
    return Path(f"eval-{dt.datetime.now():%Y%m%d-%H%M%S}")


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 a worker failed, 2 a bad config."""
    from toolbox.commands.run import entry_point

    console, args = entry_point(argv, __doc__ or "")
    if args is None:
        return 0
    from toolbox.config import load_config

    try:
        opts, config_args = split_args(args)
        cfg = load_config(config_args)
        model_path = resolve_model(opts, cfg)
    except ConfigError as err:
        console.print(f"[bold red]config error[/]: {escape(str(err))}")
        return 2
    return evaluate(cfg, opts, model_path, console)


@contextmanager
def eval_groups(cfg: Any, model_path: str) -> Iterator[tuple[Any, Any]]:
    """Rollout and reward groups: Ray actors when ``rollout.num_workers > 1`` (a local Ray instance started unless
    one is reachable), otherwise one rollout and one reward worker in this process."""
    from toolbox.actors.roles import RewardGroup, RolloutGroup

    use_ray = cfg.rollout.num_workers > 1 and not cfg.ray.local_mode
    started = False
    if use_ray:
        import ray

        from toolbox.driver.ray_connect import connect_ray

        if not ray.is_initialized():
            connect_ray(cfg)
            started = True
    groups = []
    try:
        for role in ("rollout", "reward"):
            groups.append(_group(cfg, role, model_path, use_ray))
        yield RolloutGroup(groups[0]), RewardGroup(groups[1])
    finally:
        for group in groups:
            group.shutdown()
        if started:
            ray.shutdown()


def _group(cfg: Any, role: str, model_path: str, use_ray: bool) -> Any:
    """The workers of ``role`` (rollout or reward), built as `toolbox.algorithms.base.policy_plan` declares them."""
    from functools import partial

    import torch

    from toolbox.actors.group import LocalGroup, WorkerGroup
    from toolbox.actors.reward import RewardWorker
    from toolbox.actors.rollout import RolloutWorker
    from toolbox.algorithms.base import build_engine, rollout_dtype
    from toolbox.driver.local_ray import actor_env
    from toolbox.engines import ENGINES

    section = getattr(cfg, role)
    if role == "rollout":
        engine = partial(build_engine, ENGINES, cfg.rollout.engine, model_path, rollout_dtype(cfg),
                         cfg.trainer.seed)
        cls: type = RolloutWorker
        # In this process the engine may use every core torch has (an actor keeps to one).
        kwargs = lambda r: dict(rank=r, build=engine, **({} if use_ray else {"torch_threads": torch.get_num_threads()}))  # noqa: E731
    else:
        cls, kwargs = RewardWorker, lambda r: dict(rank=r, spec=cfg.reward.spec, run=cfg.reward.run, model_path=model_path)  # noqa: E731
    if not use_ray:
        threads = torch.get_num_threads()
        worker = cls(**kwargs(0))
        torch.set_num_threads(threads)  # a RewardWorker pins torch to one thread: right in an actor, not here
        return LocalGroup(role, [worker])
    return WorkerGroup(role, cls, section.num_workers, kwargs, section.timeout_s, section.cpus_per_worker,
                       getattr(section, "gpus_per_worker", 0.0), actor_env(), cfg.ray.placement_timeout_s)


def eval_prompts(cfg: Any, model_path: str, opts: EvalOptions) -> tuple[list[Any], Any]:
    """The eval split's requests (each prompt ``samples`` times) and the tokenizer; a bad dataset fails here."""
    from toolbox.data.prompts import PromptSource
    from toolbox.data.tasks import TASKS
    from toolbox.evaluation.samples import eval_requests
    from toolbox.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    source = PromptSource(TASKS.build(cfg.task, inject={"data": cfg.data}), tokenizer, cfg.trainer.seed)
    return eval_requests(source, opts.prompts, opts.samples, generated=cfg.trainer.eval_prompts), tokenizer


def score(cfg: Any, groups: tuple[Any, Any], requests: list[Any], batch: int, console: Console) -> tuple[list, list]:
    """Generate and score ``requests`` in waves of one ``batch`` per rollout worker (each wave within the roles'
    timeouts); returns the rollout batches and their rewards."""
    from toolbox.core.pending import wait
    from toolbox.data.prompts import split_groups

    rollout, reward = groups
    shards = split_groups(requests, max(len(rollout), math.ceil(len(requests) / batch)))
    batches, rewards = [], []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("generating and scoring", total=len(requests))
        for first in range(0, len(shards), len(rollout)):
            wave = shards[first : first + len(rollout)]
            generated = rollout.generate(wave, cfg.rollout.sampling)
            scored = reward.score(generated)
            wait(generated, scored)
            batches += generated.result()
            rewards += scored.result()
            progress.advance(task, sum(len(s) for s in wave))
    return batches, rewards


def evaluate(cfg: Any, opts: EvalOptions, model_path: str, console: Console) -> int:
    """Run the evaluation, print the table, write the files; returns the exit code."""
    from toolbox.evaluation.metrics import summarize
    from toolbox.evaluation.samples import collect

    out = output_dir(opts, model_path)
    try:
        requests, tokenizer = eval_prompts(cfg, model_path, opts)
    except (ConfigError, ValueError) as err:  # a bad dataset, an empty split
        console.print(f"[bold red]config error[/]: {escape(str(err))}")
        return 2
    console.print(f"evaluating [bold]{escape(model_path)}[/] on {len(requests) // opts.samples} prompts of task "
                  f"{cfg.task.name!r} with reward {cfg.reward.spec.name!r}, {opts.samples} sample(s) each")
    try:
        with eval_groups(cfg, model_path) as groups:
            batches, rewards = score(cfg, groups, requests, opts.batch, console)
    except WorkerError as err:
        console.print(f"[bold red]worker failure[/]: {escape(str(err))}")
        return 1
    results = collect(batches, rewards, tokenizer)
    metrics = summarize(results, opts.samples, opts.threshold)
    write_results(out, _header(cfg, opts, model_path), metrics, results)
    Console().print(metrics_table(metrics))
    console.print(f"results: {out / 'eval.json'}, {out / 'eval_samples.jsonl'}")
    return 0


def _header(cfg: Any, opts: EvalOptions, model_path: str) -> dict[str, Any]:
    return {"model": model_path, "task": cfg.task.model_dump(mode="json"),
            "reward": cfg.reward.spec.model_dump(mode="json"), "engine": cfg.rollout.engine.model_dump(mode="json"),
            "sampling": cfg.rollout.sampling.model_dump(mode="json"), "samples": opts.samples,
            "threshold": opts.threshold, "seed": cfg.trainer.seed}


def write_results(out: Path, header: dict[str, Any], metrics: dict[str, float], results: list[Any]) -> None:
    """``eval.json`` (what was evaluated, and the metrics) and ``eval_samples.jsonl`` (one prompt per line)."""
    out.mkdir(parents=True, exist_ok=True)
    clean = {k: (None if math.isnan(v) else v) for k, v in metrics.items()}  # JSON has no NaN
    (out / "eval.json").write_text(json.dumps({**header, "metrics": clean}, indent=2) + "\n")
    with (out / "eval_samples.jsonl").open("w") as f:
        for result in results:
            f.write(json.dumps(result.to_json()) + "\n")


def metrics_table(metrics: dict[str, float]) -> Table:
    """The metrics as a two-column rich table (counts as integers)."""
    table = Table(title="eval")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in metrics.items():
        table.add_row(name, str(int(value)) if value.is_integer() else f"{value:.4g}")
    return table


if __name__ == "__main__":
    sys.exit(main())
