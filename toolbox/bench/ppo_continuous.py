"""PPO on a MuJoCo task (default HalfCheetah-v5): training return vs env steps and vs wall time, us beside RLlib.

``python -m toolbox.bench ppo_continuous [--env-steps 1000000] [--seed 0] [--return-window 20] [--no-rllib]
[--no-toolbox] [--rllib-curve FILE] [--toolbox-run DIR] [--rllib-log FILE] [--plot PNG] [--out FILE] [overrides ...]``

Our side is the ``ppo_halfcheetah`` recipe (``--experiment``), its budget cut to ``--env-steps``. RLlib's side
runs PPO with the settings of its own tuned MuJoCo example (``rllib/examples/algorithms/ppo/mujoco_ppo.py``:
MeanStdFilter observations, 2,048-step batches of 512-row minibatches x 10 epochs, lr 3e-4, vf_loss_coeff 1,
entropy 0.01 annealed to 0 over 2M steps, GAE(0.99, 0.95), kl_coeff 0.5, clip 0.2, vf_clip 10, global grad norm
50, separate 256x256 tanh nets with a 256 head, free log-std), with ``--rllib-runners`` env runners of 16 envs
(the example's 4 is a resource setting; on 2 cores, 2 runners). Both sides report the mean return of recent
*training* episodes, the last ``--return-window`` of them (RLlib: ``env_runners/episode_return_mean``, held over
iterations in which no episode ended; ours: ``episode_return``) and are timed from their first training step. A long run can be recorded once (``--rllib-log``) and reported later
(``--rllib-curve``, ``--toolbox-run``).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from toolbox.bench._rllib import init_ray, rllib_available, train_rllib

Curve = list[dict[str, float]]  # per training step/iteration: env_steps, wall_s, episode_return
MILESTONES = (50_000, 100_000, 200_000, 500_000, 1_000_000)


def mean_std_filter(env: Any, spaces: Any = None, device: Any = None) -> Any:
    """RLlib's running mean/std observation filter, the example's ``env_to_module_connector``."""
    from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

    return MeanStdFilter()


def rllib_config(env_id: str, seed: int, num_env_runners: int, return_window: int = 100) -> Any:
    """RLlib's PPO with the settings of its tuned MuJoCo example (see the module docstring); its reported return is
    the mean of the last ``return_window`` finished episodes (RLlib's default: 100)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from torch.nn.init import orthogonal_

    return (
        PPOConfig().environment(env_id)
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=16, rollout_fragment_length=32,
                     env_to_module_connector=mean_std_filter)
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=2048, minibatch_size=512, num_epochs=10, lr=0.0003, vf_loss_coeff=1.0,
                  entropy_coeff=[[0, 0.01], [2_000_000, 0.0]], gamma=0.99, lambda_=0.95, kl_coeff=0.5, clip_param=0.2,
                  vf_clip_param=10.0, grad_clip=50.0, grad_clip_by="global_norm")
        .rl_module(model_config=DefaultModelConfig(
            vf_share_layers=False, fcnet_hiddens=[256, 256], fcnet_kernel_initializer=orthogonal_,
            fcnet_activation="tanh", head_fcnet_hiddens=[256], head_fcnet_activation=None, free_log_std=True))
        .reporting(metrics_num_episodes_for_smoothing=return_window)
        .debugging(seed=seed)
    )


def run_rllib(args: argparse.Namespace) -> Curve:
    log = open(args.rllib_log, "w") if args.rllib_log else None  # noqa: SIM115 (closed below)
    try:
        run = train_rllib(rllib_config(args.env, args.seed, args.rllib_runners, args.return_window), args.env_steps, log=log,
                          max_wall_s=args.max_wall_s)
    finally:
        if log is not None:
            log.close()
    return run.curve


def run_toolbox(args: argparse.Namespace) -> tuple[Curve, Path]:
    """Our recipe on the running Ray instance, its budget cut to ``--env-steps``; its curve from ``metrics.jsonl``."""
    from toolbox.config import load_config
    from toolbox.driver.experiment import ExperimentBuilder

    base = load_config([f"experiment={args.experiment}", *args.overrides])
    per_step = base.env.num_workers * base.env.num_envs * base.algorithm.steps_per_env  # type: ignore[union-attr]
    root = tempfile.mkdtemp(prefix="bench-ppo-continuous-")
    cfg = load_config([f"experiment={args.experiment}", f"trainer.run_root={root}", "trainer.run_name=toolbox",
                       "callbacks=[{name: jsonl}]", f"trainer.seed={args.seed}", "trainer.save_every=0",
                       f"algorithm.return_window={args.return_window}",
                       f"trainer.total_steps={max(1, args.env_steps // per_step)}", *args.overrides])
    builder = ExperimentBuilder(cfg)
    try:
        builder.build_trainer().fit()
    finally:
        builder.shutdown()
    return toolbox_curve(builder.run_dir), builder.run_dir


def toolbox_curve(run_dir: Path) -> Curve:
    """``env_steps``, cumulative ``step_time_s`` and ``episode_return`` of each step of a run's ``metrics.jsonl``."""
    from toolbox.callbacks.plots import read_run

    series, wall, curve = read_run(run_dir), 0.0, []
    for i in range(len(series.steps)):
        wall += series.metrics["step_time_s"][i]
        curve.append({"env_steps": series.metrics["env_steps"][i], "wall_s": wall,
                      "episode_return": series.metrics["episode_return"][i]})
    return curve


def read_curve(path: str) -> Curve:
    """A curve written by ``--rllib-log`` (one JSON point per line); a return missing from a point (a log written
    before `result_point` held the last one) is held from the point before, as `train_rllib` now does."""
    curve: Curve = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            point = json.loads(line)
            if math.isnan(point["episode_return"]) and curve:
                point["episode_return"] = curve[-1]["episode_return"]
            curve.append(point)
    return curve


def at_steps(curve: Curve, env_steps: float) -> dict[str, float] | None:
    """The first point at or past ``env_steps`` (None if the curve stops short of it)."""
    return next((p for p in curve if p["env_steps"] >= env_steps), None)


def first_return(curve: Curve) -> str:
    """When a curve's first mean training return came, or why it has none: both sides report returns of
    *finished* episodes only (HalfCheetah's end after 1,000 steps of every env copy, on the time limit)."""
    p = next((p for p in curve if not math.isnan(p["episode_return"])), None)
    if p is not None:
        return f"first mean training return at {int(p['env_steps']):,} env steps ({p['wall_s']:.0f} s)"
    last = int(curve[-1]["env_steps"]) if curve else 0
    return f"no episode finished in {last:,} env steps: no return to report"


def summary_rows(curves: dict[str, Curve]) -> list[dict[str, Any]]:
    """Per system and milestone (env steps it reached): training return and wall seconds there; then its last point."""
    rows = []
    for system, curve in curves.items():
        for m in MILESTONES:
            p = at_steps(curve, m)
            if p is not None:
                rows.append({"system": system, "env_steps": m, "episode_return": p["episode_return"], "wall_s": p["wall_s"]})
        if curve:
            last = curve[-1]
            rows.append({"system": system, "env_steps": int(last["env_steps"]), "episode_return": last["episode_return"],
                         "wall_s": last["wall_s"], "last": True})
    return rows


def plot(curves: dict[str, Curve], path: str, title: str) -> None:
    """Training return vs env steps and vs wall time, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_wall) = plt.subplots(1, 2, figsize=(11, 4))
    for system, curve in curves.items():
        pts = [p for p in curve if not math.isnan(p["episode_return"])]
        by_steps.plot([p["env_steps"] for p in pts], [p["episode_return"] for p in pts], label=system)
        by_wall.plot([p["wall_s"] / 60 for p in pts], [p["episode_return"] for p in pts], label=system)
    by_steps.set(xlabel="env steps", ylabel="mean training return")
    by_wall.set(xlabel="wall time (min)", ylabel="mean training return")
    for ax in (by_steps, by_wall):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(curves: dict[str, Curve], title: str) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.table import Table

    rows = summary_rows(curves)
    table = Table(title=title)
    for col in ("system", "env steps", "training return", "wall s"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for r in rows:
        table.add_row(r["system"], f"{r['env_steps']:,}" + (" (last)" if r.get("last") else ""),
                      f"{r['episode_return']:.0f}", f"{r['wall_s']:.0f}")
    Console().print(table)
    for system, curve in curves.items():
        print(f"{system}: {first_return(curve)}")
    return rows


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench ppo_continuous", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah-v5", help="Gymnasium id (RLlib's side; ours is the experiment's).")
    parser.add_argument("--experiment", default="ppo_halfcheetah", help="Our recipe under configs/experiments.")
    parser.add_argument("--env-steps", type=int, default=1_000_000, help="Env steps per side (shorten for a quick look).")
    parser.add_argument("--max-wall-s", type=float, default=math.inf, help="Stop RLlib after this many training seconds.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rllib-runners", type=int, default=2, help="RLlib env runners (16 envs each).")
    parser.add_argument("--return-window", type=int, default=20, help="Finished episodes both sides' training return "
                        "averages (ours: algorithm.return_window; RLlib: metrics_num_episodes_for_smoothing).")
    parser.add_argument("--no-rllib", action="store_true", help="Skip RLlib.")
    parser.add_argument("--no-toolbox", action="store_true", help="Skip our side.")
    parser.add_argument("--rllib-log", default="", help="Write RLlib's curve here as it trains (JSONL).")
    parser.add_argument("--rllib-curve", default="", help="Report this recorded RLlib curve instead of running RLlib.")
    parser.add_argument("--toolbox-run", default="", help="Report this finished run directory instead of running ours.")
    parser.add_argument("--plot", default="", help="Write the two-panel PNG here.")
    parser.add_argument("--out", default="", help="Also write the curves and the table as JSON here.")
    parser.add_argument("overrides", nargs="*", help="Config overrides for our side, as for toolbox.run.")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    curves: dict[str, Curve] = {}
    need_ray = (not args.no_toolbox and not args.toolbox_run) or (not args.no_rllib and not args.rllib_curve)
    if not args.no_rllib and not args.rllib_curve and not rllib_available():
        print("ray.rllib is not importable: RLlib not run (pip install -e '.[bench]')")
        args.no_rllib = True
    if need_ray:
        init_ray()
    try:
        if args.toolbox_run:
            curves["toolbox"] = toolbox_curve(Path(args.toolbox_run))
        elif not args.no_toolbox:
            curves["toolbox"], run_dir = run_toolbox(args)
            print(f"our run: {run_dir}")
        if args.rllib_curve:
            curves["rllib"] = read_curve(args.rllib_curve)
        elif not args.no_rllib:
            curves["rllib"] = run_rllib(args)
    finally:
        if need_ray:
            import ray

            ray.shutdown()
    title = f"PPO on {args.env}: mean training return"
    rows = report(curves, title)
    if args.plot:
        plot(curves, args.plot, title)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "curves": curves}, indent=1))
    return 0
