"""Wall time and env steps for PPO to reach a mean return of 450 on CartPole-v1, against RLlib's PPO.

``python -m toolbox.bench ppo_cartpole [--seeds 0,1,2] [--target 450] [--no-rllib] [--out FILE] [overrides ...]``

Both sides stop on the same kind of figure, the mean return of recent *training*
episodes (RLlib's ``env_runners/episode_return_mean``, smoothed over up to 100
episodes; ours ``episode_return`` over the last 100 with ``algorithm.target_metric=
episode_return``), and both are timed from their first training step (actor start-up
is reported separately). RLlib runs with the settings of its own tuned CartPole
example (``rllib/examples/algorithms/ppo/cartpole_ppo.py``: lr 3e-4, 6 epochs,
vf_loss_coeff 0.01, one 32-unit linear layer shared by policy and value) when
``ray.rllib`` imports (``pip install -e '.[bench]'``). Reported: the median over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from toolbox.bench._rllib import init_ray, rllib_available, train_rllib


@dataclass
class Run:
    """One seed of one system."""

    system: str
    seed: int
    reached: bool
    env_steps: int
    train_s: float
    startup_s: float


def run_toolbox(seed: int, target: float, max_steps: int, overrides: list[str]) -> Run:
    """Our ``ppo_cartpole`` experiment on the running Ray instance, stopped at a training-return mean of ``target``."""
    from toolbox.algorithms.ppo_env.config import PPOEnvConfig
    from toolbox.config import load_config
    from toolbox.driver.experiment import ExperimentBuilder

    base = load_config(["experiment=ppo_cartpole", *overrides])
    if not isinstance(base.algorithm, PPOEnvConfig):
        raise SystemExit(f"algorithm.name must stay ppo_env, got {base.algorithm.name!r}")
    per_step = base.env.num_workers * base.env.num_envs * base.algorithm.steps_per_env
    cfg = load_config(["experiment=ppo_cartpole", f"trainer.run_root={tempfile.mkdtemp(prefix='bench-ppo-')}",
                       "callbacks=[]", "trainer.eval_every=0", f"trainer.seed={seed}",
                       f"trainer.total_steps={max(1, max_steps // per_step)}", f"algorithm.target_return={target}",
                       "algorithm.target_metric=episode_return", *overrides])
    t0 = time.perf_counter()
    builder = ExperimentBuilder(cfg)
    try:
        trainer = builder.build_trainer()
        t1 = time.perf_counter()
        summary = trainer.fit()
    finally:
        builder.shutdown()
    return Run("toolbox", seed, bool(summary["reached_target"]), int(summary["env_steps"]),
               float(summary["train_wall_time_s"]), t1 - t0)


def run_rllib(seed: int, target: float, max_steps: int) -> Run:
    """RLlib's PPO with its tuned CartPole settings, stopped at ``env_runners/episode_return_mean >= target``."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = (
        PPOConfig().environment("CartPole-v1")
        .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True))
        .debugging(seed=seed)
    )
    run = train_rllib(config, max_steps, target)
    return Run("rllib", seed, run.reached, run.env_steps, run.train_s, run.startup_s)


def medians(runs: list[Run]) -> dict[str, float]:
    return {"env_steps": statistics.median(r.env_steps for r in runs), "train_s": statistics.median(r.train_s for r in runs),
            "startup_s": statistics.median(r.startup_s for r in runs), "reached": sum(r.reached for r in runs)}


def report(runs: list[Run], target: float, rllib_note: str = "") -> dict[str, Any]:
    """A rich table per seed and the medians; the ratio to RLlib when it ran."""
    from rich.console import Console
    from rich.table import Table

    systems = sorted({r.system for r in runs}, key=lambda s: s != "toolbox")
    table = Table(title=f"PPO on CartPole-v1 to a mean training return of {target:g}")
    for col in ("system", "seed", "reached", "env steps", "train wall s", "start-up s"):
        table.add_column(col, justify="left" if col == "system" else "right")
    out: dict[str, Any] = {"target": target, "runs": [asdict(r) for r in runs]}
    for system in systems:
        mine = [r for r in runs if r.system == system]
        for r in mine:
            table.add_row(system, str(r.seed), "yes" if r.reached else "no", str(r.env_steps), f"{r.train_s:.1f}",
                          f"{r.startup_s:.1f}")
        m = out[system] = medians(mine)
        table.add_row(f"[bold]{system}[/]", "median", f"{m['reached']}/{len(mine)}", f"[bold]{m['env_steps']:.0f}[/]",
                      f"[bold]{m['train_s']:.1f}[/]", f"{m['startup_s']:.1f}", end_section=True)
    console = Console()
    console.print(table)
    if "rllib" in out:
        ours, theirs = out["toolbox"], out["rllib"]
        out["wall_ratio"] = ours["train_s"] / theirs["train_s"]
        out["steps_ratio"] = ours["env_steps"] / theirs["env_steps"]
        met = out["wall_ratio"] <= 0.5 and out["steps_ratio"] <= 1.0
        console.print(f"toolbox / RLlib: wall time x{out['wall_ratio']:.3f}, env steps x{out['steps_ratio']:.2f} "
                      f"(goal: wall <= 0.5, steps <= 1.0: {'met' if met else 'NOT met'})")
    else:
        console.print(rllib_note, markup=False)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench ppo_cartpole", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds.")
    parser.add_argument("--target", type=float, default=450.0, help="Mean training return to reach.")
    parser.add_argument("--max-steps", type=int, default=500_000, help="Give up after this many env steps.")
    parser.add_argument("--no-rllib", action="store_true", help="Skip RLlib even where it is installed.")
    parser.add_argument("--out", default="", help="Also write the results as JSON here.")
    parser.add_argument("overrides", nargs="*", help="Config overrides for our side, as for toolbox.run.")
    args = parser.parse_args(argv)
    import ray

    seeds = [int(s) for s in args.seeds.split(",")]
    init_ray()  # RLlib's default 2 env runners + its learner must fit
    note = "RLlib skipped (--no-rllib)" if args.no_rllib else ""
    if not note and not rllib_available():
        note = "ray.rllib is not importable: RLlib not run (pip install -e '.[bench]')"
    try:
        runs = [run_toolbox(s, args.target, args.max_steps, args.overrides) for s in seeds]
        if not note:
            runs += [run_rllib(s, args.target, args.max_steps) for s in seeds]
    finally:
        ray.shutdown()
    out = report(runs, args.target, note)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
    return 0
