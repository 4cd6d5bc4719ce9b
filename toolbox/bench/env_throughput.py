"""Env steps per second of our env runners beside RLlib's, sampling only and sampling + learning.

``python -m toolbox.bench env_throughput [--envs CartPole-v1,HalfCheetah-v5] [--runners 1,2,4] [--num-envs 8]
[--vectorization sync] [--steps-per-env 64] [--rounds 3] [--iters 16] [--no-rllib] [--plot PNG] [--out FILE]``

For every configuration (env x runners x envs per runner) both sides are built once, then measured in
``--rounds`` rounds that alternate which side goes first: ``--iters`` rollouts of every runner
(sampling only), then ``--iters`` whole PPO training steps (sampling + learning); one warm-up rollout and one
warm-up training step are not counted. A side's figure is the median over rounds of its env steps / seconds; each configuration
prints ``ratio X.XX`` (ours / RLlib, sampling only) and the learning ratio beside it. Each round also
counts the CPU seconds of the side's processes (its actors with their subprocesses, and the driver): env
steps per CPU second compare the sides at equal cores even on a machine whose other load leaves each side
a varying share of them (Ray's own raylet and GCS are not counted, for either side). Run it with the
``bench`` extra installed (``ray[rllib]``; MuJoCo envs need ``gymnasium[mujoco]``). First, in-process and
without Ray, a breakdown of one runner's step for each env (``--breakdown-envs``): the env's own step, the
policy forward, and the rest of the runner's bookkeeping, in microseconds per vector step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolbox.bench._throughput_sides import Point, Side, build, cpu_seconds

GOAL = 2.0  # ours / RLlib, sampling env steps per second at equal runners, envs and cores


@dataclass
class Measure:
    """One round of one side at one configuration: env steps taken in ``seconds``, using ``cpu_s`` CPU seconds."""

    system: str
    point: Point
    mode: str  # "sample" or "learn"
    steps: int
    seconds: float
    cpu_s: float = 0.0  # the driver's and the side's worker processes' (0: not measured)

    @property
    def rate(self) -> float:
        return self.steps / self.seconds

    @property
    def per_cpu_s(self) -> float | None:
        """Env steps per CPU second: the rate at equal cores, whatever share of them the rest of the machine left."""
        return self.steps / self.cpu_s if self.cpu_s > 0 else None

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Measure:
        return Measure(d["system"], Point(**d["point"]), d["mode"], d["steps"], d["seconds"], d.get("cpu_s", 0.0))


def summarize(measures: list[Measure]) -> list[dict[str, Any]]:
    """One row per configuration: each side's median rate per mode (env steps per wall second, and per CPU second
    where measured), and the ours / RLlib ratios of both (None without RLlib)."""
    rows: dict[Point, dict[str, Any]] = {}
    for m in measures:
        row = rows.setdefault(m.point, {**asdict(m.point)})
        row.setdefault(f"{m.system}_{m.mode}", []).append(m.rate)
        if m.per_cpu_s is not None:
            row.setdefault(f"{m.system}_{m.mode}_cpu", []).append(m.per_cpu_s)
    for row in rows.values():
        for key in [k for k, v in row.items() if isinstance(v, list)]:
            row[key] = statistics.median(row[key])
        for mode in ("sample", "learn", "sample_cpu", "learn_cpu"):
            ours, theirs = row.get(f"toolbox_{mode}"), row.get(f"rllib_{mode}")
            row[f"ratio_{mode}"] = ours / theirs if ours and theirs else None
    return list(rows.values())


def measure(sides: list[Side], point: Point, rounds: int, iters: int) -> list[Measure]:
    """Sampling rounds, then learning rounds, each mode after one uncounted warm-up call per side; the order flips
    every round.
    Each round also counts the CPU seconds the side's processes (and the driver) used."""
    out: list[Measure] = []
    pids = {side.name: side.pids() for side in sides}
    for mode in ("sample", "learn"):
        for side in sides:  # a warm-up call per mode: first calls pay one-off costs (env resets, lazy inits)
            side.sample() if mode == "sample" else side.learn()
        for r in range(rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                cpu0 = cpu_seconds(pids[side.name])
                taken = [side.sample() if mode == "sample" else side.learn() for _ in range(iters)]
                out.append(Measure(side.name, point, mode, sum(s for s, _ in taken), sum(t for _, t in taken),
                                   cpu_seconds(pids[side.name]) - cpu0))
    return out


def run_point(point: Point, systems: list[str], args: argparse.Namespace) -> list[Measure]:
    sides: list[Side] = []
    try:
        for name in systems:
            sides.append(build(name, point, args.steps_per_env))
        return measure(sides, point, args.rounds, args.iters)
    finally:
        for side in sides:
            side.close()


def print_rows(rows: list[dict[str, Any]]) -> None:
    """A table, then one ``ratio X.XX`` line per configuration (sampling only; per CPU second and learning beside it)."""
    def fmt(x: float | None, spec: str = ",.0f") -> str:
        return "-" if x is None else format(x, spec)

    columns = {"toolbox_sample": "ours sample/s", "rllib_sample": "rllib sample/s", "toolbox_sample_cpu": "ours /cpu-s",
               "rllib_sample_cpu": "rllib /cpu-s", "toolbox_learn": "ours learn/s", "rllib_learn": "rllib learn/s"}
    print(f"{'configuration':<34} " + " ".join(f"{title:>14}" for title in columns.values()))
    for r in rows:
        point = Point(r["env"], r["runners"], r["envs"], r["vectorization"])
        print(f"{point.label:<34} " + " ".join(f"{fmt(r.get(key)):>14}" for key in columns))
    for r in rows:
        if r["ratio_sample"] is not None:
            point = Point(r["env"], r["runners"], r["envs"], r["vectorization"])
            print(f"{point.label}: ratio {r['ratio_sample']:.2f} (sampling; goal >= {GOAL:g}), "
                  f"per CPU second {fmt(r['ratio_sample_cpu'], '.2f')}, learning ratio {fmt(r['ratio_learn'], '.2f')}")


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Sampling env steps against env runners, one column per env: per wall second (top) and per CPU second of
    the side's processes (bottom, where measured); a line per side and envs per runner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({r["env"] for r in rows})
    panels = [("sample", "env steps/s (sampling)")]
    if any(r.get("toolbox_sample_cpu") for r in rows):
        panels.append(("sample_cpu", "env steps per CPU second (sampling)"))
    fig, axes = plt.subplots(len(panels), len(envs), figsize=(5.5 * len(envs), 4 * len(panels)), squeeze=False)
    for (key, ylabel), ax_row in zip(panels, axes):
        for ax, env in zip(ax_row, envs):
            mine = [r for r in rows if r["env"] == env]
            for system in ("toolbox", "rllib"):
                for n, vec in sorted({(r["envs"], r["vectorization"]) for r in mine}):
                    pts = sorted((r["runners"], r[f"{system}_{key}"]) for r in mine
                                 if (r["envs"], r["vectorization"]) == (n, vec) and r.get(f"{system}_{key}"))
                    if pts:
                        ax.plot(*zip(*pts), marker="o", linestyle="-" if system == "toolbox" else "--",
                                label=f"{system}, {n} envs/runner {vec}")
            ax.set(title=env, xlabel="env runners", ylabel=ylabel, xticks=sorted({r["runners"] for r in mine}))
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m toolbox.bench env_throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="CartPole-v1,HalfCheetah-v5", help="Comma-separated gymnasium ids.")
    parser.add_argument("--runners", default="1,2,4", type=csv_ints, help="Env-runner counts.")
    parser.add_argument("--num-envs", default="8", type=csv_ints, help="Env copies per runner (comma-separated).")
    parser.add_argument("--vectorization", default="sync", choices=["sync", "async"], help="Both sides' vector envs.")
    parser.add_argument("--steps-per-env", type=int, default=64, help="Rollout length per env copy (RLlib's fragment).")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds per configuration (median taken).")
    parser.add_argument("--iters", type=int, default=16, help="Rollouts or training steps per side per round (16 "
                        "rollouts of 64 steps: a whole 1,000-step MuJoCo episode, whose step cost varies with the state).")
    parser.add_argument("--no-rllib", action="store_true", help="Measure our side only.")
    parser.add_argument("--breakdown-envs", default="CartPole-v1,HalfCheetah-v5", help="Envs for the per-step breakdown ('' skips).")
    parser.add_argument("--plot", default="", help="Write the scaling curve (PNG) here.")
    parser.add_argument("--out", default="", help="Also write the rows and every round as JSON here (after each configuration).")
    parser.add_argument("--from-json", default="", help="Measure nothing: report (and plot) the rounds of these --out files.")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    from toolbox.bench._rllib import init_ray, rllib_available
    from toolbox.bench._step_breakdown import print_breakdown

    args = parse(argv)
    if args.from_json:
        return report([Measure.from_dict(m) for path in args.from_json.split(",") if path
                       for m in json.loads(Path(path).read_text())["measures"]], args)
    if args.breakdown_envs:
        print_breakdown([e for e in args.breakdown_envs.split(",") if e], max(args.num_envs), args.steps_per_env)
    systems = ["toolbox"]
    if not args.no_rllib:
        if rllib_available():
            systems.append("rllib")
        else:
            print("ray.rllib is not importable: our side only (pip install -e '.[bench]')")
    points = [Point(env, r, n, args.vectorization) for env in args.envs.split(",") if env
              for n in args.num_envs for r in args.runners]
    init_ray(min_cpus=2 * max(args.runners) + 2)  # logical CPUs: both sides' actors stay up through a configuration
    measures: list[Measure] = []
    try:
        for point in points:
            mine = run_point(point, systems, args)
            measures += mine
            print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
            print_rows(summarize(mine))
            if args.out:  # after every configuration, so a long invocation that fails later keeps what it measured
                Path(args.out).write_text(json.dumps({"measures": [asdict(m) for m in measures]}, indent=1))
    finally:
        import ray

        ray.shutdown()
    return report(measures, args)


def report(measures: list[Measure], args: argparse.Namespace) -> int:
    rows = summarize(measures)
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in os.getloadavg())}; cores: {os.cpu_count()}")
    print_rows(rows)
    if args.plot:
        plot(rows, args.plot)
    return 0
