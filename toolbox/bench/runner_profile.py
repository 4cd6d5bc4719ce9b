"""Where an env runner's CPU goes under Ray, ours beside RLlib's: py-spy on one runner of each side while it samples.

``python -m toolbox.bench runner_profile [--env HalfCheetah-v5] [--runners 4] [--num-envs 8] [--steps-per-env 64]
[--iters 16] [--py-spy PATH]``

Each side is built as `toolbox.bench.env_throughput` builds it (`_throughput_sides`), one side at a time; after two
warm-up rollouts, ``--iters`` rollouts of every runner are timed while ``py-spy record`` samples runner 0's Python
stacks. Printed per side: env steps per second and per CPU second (every runner's process CPU via psutil, and the
driver's), runner 0's CPU per vector step, and how its sampled stacks split between the env (MuJoCo or the env's own
code), gymnasium's wrappers and vector env, the policy forward, RLlib's connectors and episode/metrics objects, the
runner's own bookkeeping, and Ray (actor call, object store, (de)serialisation). Each stack counts for the category
of its innermost frame that names one, so a numpy call inside the policy counts as the policy. py-spy sees Python
threads only: Ray's C++ threads are in the CPU figures but not in the split. Needs ``pip install py-spy`` and
permission to read the runner's memory (ptrace), which containers may deny.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CATEGORIES: list[tuple[str, tuple[str, ...]]] = [  # the first that names a frame wins, innermost frame first
    ("env", ("gymnasium/envs/", "mujoco/")),
    ("gym wrappers + vector env", ("gymnasium/vector", "gymnasium/wrappers", "gymnasium/core", "SnapshotEnv")),
    ("policy forward", ("step_policy", "torch/nn/", "rl_module", "torch/distributions", "core/models",
                        "core/distribution", "models/mlp.py")),
    ("rllib connectors", ("connectors",)),
    ("rllib episodes + metrics", ("single_agent_episode", "metrics", "infinite_lookback")),
    ("runner bookkeeping", ("toolbox/envs/env_runner.py", "single_agent_env_runner.py", "running_stats")),
    ("ray call + object store", ("ray/_private", "_raylet", "serializ", "actors/", "cloudpickle", "ray/util")),
]


def category(stack: str) -> str:
    """The category of a collapsed stack (``outer (file:line);...;inner (file:line)``): its innermost named frame."""
    for frame in reversed(stack.split(";")):
        for name, keys in CATEGORIES:
            if any(key in frame for key in keys):
                return name
    return "other"


def split(raw: str) -> dict[str, float]:
    """py-spy's ``--format raw`` output (a collapsed stack and a sample count per line) -> share per category."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        if line.strip():
            stack, n = line.rsplit(" ", 1)
            counts[category(stack)] += int(n)
    total = sum(counts.values())
    return {name: n / total for name, n in counts.most_common()} if total else {}


def profile_side(name: str, args: argparse.Namespace, py_spy: str) -> None:
    import psutil

    from toolbox.bench._throughput_sides import Point, build, cpu_seconds

    point = Point(args.env, args.runners, args.num_envs)
    side = build(name, point, args.steps_per_env)
    try:
        side.sample(), side.sample()  # warm-up: resets, lazy inits
        pids = side.pids()[: args.runners]  # the env runners (ours also lists its learner)
        out = Path(tempfile.mkdtemp(prefix="runner-profile-")) / f"{name}.txt"
        spy = subprocess.Popen([py_spy, "record", "--pid", str(pids[0]), "--rate", "250", "--format", "raw",
                                "--nonblocking", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches
        runner0 = psutil.Process(pids[0])
        cpu0, mine0, t0 = cpu_seconds(pids), sum(runner0.cpu_times()[:2]), time.perf_counter()
        steps = sum(side.sample()[0] for _ in range(args.iters))
        wall, cpu, mine = time.perf_counter() - t0, cpu_seconds(pids) - cpu0, sum(runner0.cpu_times()[:2]) - mine0
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        vector_steps = steps / args.runners / args.num_envs
        print(f"== {name} {point.label}: {steps / wall:,.0f} env steps/s, {steps / cpu:,.0f} per CPU s; runner 0: "
              f"{mine / vector_steps * 1e6:,.0f} us CPU per vector step of {args.num_envs}; load {os.getloadavg()[0]:.1f}")
        if not out.exists():
            print(f"   py-spy wrote nothing ({err.decode().strip()[-300:]})")
            return
        for cat, share in split(out.read_text()).items():
            print(f"   {cat:<28} {100 * share:5.1f}%   ~{share * mine / vector_steps * 1e6:6,.0f} us per vector step")
    finally:
        side.close()


def main(argv: list[str]) -> int:
    from toolbox.bench._rllib import init_ray, rllib_available

    parser = argparse.ArgumentParser(prog="python -m toolbox.bench runner_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="HalfCheetah-v5", help="Gymnasium id.")
    parser.add_argument("--runners", type=int, default=4, help="Env runners per side.")
    parser.add_argument("--num-envs", type=int, default=8, help="Env copies per runner.")
    parser.add_argument("--steps-per-env", type=int, default=64, help="Rollout length per env copy.")
    parser.add_argument("--iters", type=int, default=16, help="Profiled rollouts of every runner.")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy", help="The py-spy executable.")
    args = parser.parse_args(argv)
    if not shutil.which(args.py_spy):
        print(f"py-spy not found ({args.py_spy}): pip install py-spy")
        return 2
    init_ray(min_cpus=args.runners + 2)
    try:
        for name in ["toolbox", "rllib"] if rllib_available() else ["toolbox"]:
            profile_side(name, args, args.py_spy)
    finally:
        import ray

        ray.shutdown()
    return 0
