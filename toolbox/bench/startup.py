"""``python -m toolbox.bench startup``: launch to the end of step 1 of the default run, phase by phase.

Runs ``python -m toolbox.run`` (``experiment=grpo_tiny`` unless ``--override experiment=...`` says otherwise)
``--rounds`` times as a fresh process, each ``trainer.total_steps=--steps`` with evaluation off (unless an
``--override trainer.eval_every=N`` turns it on: the whole default run is ``--steps 400 --override
trainer.eval_every=25``), and prints for
each run: seconds from the launch to the end of step 1 (the first ``step_end`` in its metrics.jsonl), to the
process's exit, the CPU seconds its process tree (the driver, its local Ray instance and every worker) had spent
when step 1 ended (sampled from outside every 0.2 s, so any commit can be measured the same way), and the start-up
phases it wrote to RUN_DIR/startup.json (`toolbox.driver.startup`); then the medians, and the load average before and
after (the machine's other work shows in every wall-clock figure; the CPU seconds hold up better).

``--tree DIR`` (repeatable) runs the same command with ``PYTHONPATH=DIR`` for each tree in turn, alternating
within every round: a checkout of another commit measured beside this one (a tree without
``toolbox/driver/startup.py`` reports no phases; its launch-to-step-1 time still comes from its metrics). A tree's
``toolbox/actors`` must resolve inside it (a checkout of this repository has ``actors/`` at the top: link it).

``--attached`` adds, alternating within every round, the first tree's run attached to a Ray instance that is
already up (``RAY_ADDRESS``): what a user iterating on a running instance (``ray start --head`` once) waits for. The
bench starts that head itself (token auth, no dashboard, a temp dir of its own) and stops it at the end; its idle
daemons share the machine with the other sides' rounds.

``--floor`` adds, alternating within every round, the same measurement of what any start of the run does before
toolbox's own work: a local Ray instance started as a run starts it and two actors importing torch
(`toolbox.bench._startup_floor`); the last line then puts each tree's median against the floor's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m toolbox.bench startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="runs per tree (median reported)")
    p.add_argument("--steps", type=int, default=1, help="trainer.total_steps of each run")
    p.add_argument("--tree", action="append", default=[], help="a source tree to put first on PYTHONPATH "
                   "(repeatable; default: none, the installed toolbox)")
    p.add_argument("--override", action="append", default=[], help="a dotted config override for every run")
    p.add_argument("--run-root", default="", help="where the runs go (default: a temporary directory)")
    p.add_argument("--floor", action="store_true", help="also measure Ray's start and two actors importing torch, "
                   "the floor of any start (`toolbox.bench._startup_floor`)")
    p.add_argument("--attached", action="store_true", help="also run the first tree attached to a Ray head that is "
                   "already up (the bench starts it once)")
    p.add_argument("--out", default="", help="write every run's figures here as JSON")
    return p.parse_args(argv)


FLOOR = "floor"  # the side `--floor` adds
ATTACHED = "attached"  # the side `--attached` adds


def one_run(tree: str, steps: int, overrides: list[str], run_root: Path, name: str,
            head: tuple[str, int] = ("", 0)) -> dict[str, Any]:
    """One launch of the default run (or with ``tree`` `FLOOR`, of the floor); its wall times and start-up phases.
    With ``head`` (the address and the ``ray start`` PID of `ray_head`) the run attaches to that Ray instance
    (reported as the `ATTACHED` side; its CPU seconds count what the head's processes spent meanwhile)."""
    address, head_pid = head
    env, source = dict(os.environ), "" if tree == FLOOR else tree  # the floor runs the installed toolbox
    if address:
        env.update(RAY_ADDRESS=address, RAY_AUTH_MODE="token")
    if source:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(source).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    if tree == FLOOR:
        cmd = [sys.executable, "-m", "toolbox.bench._startup_floor", str(run_root / name)]
    else:  # an --override can turn evaluation on
        cmd = [sys.executable, "-m", "toolbox.run", f"trainer.total_steps={steps}", "trainer.eval_every=0", *overrides,
               f"trainer.run_root={run_root}", f"trainer.run_name={name}"]
    run_dir, launched = run_root / name, time.time()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=source or None, stdout=subprocess.DEVNULL, stderr=err, text=True)
        cpu_s, head_cpu_s = tree_cpu_until(proc, run_dir / "metrics.jsonl", head_pid)
        code = proc.wait()
        exited = time.time() - launched
        if code != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited with {code}:\n{err.read()[-3000:]}")
    phases_file = run_dir / "startup.json"
    phases = json.loads(phases_file.read_text()) if phases_file.exists() else {}
    side = ATTACHED if address else tree or "installed"
    return {"tree": side, "to_step_1_s": first_step(run_dir / "metrics.jsonl")["time"] - launched, "to_exit_s": exited,
            "tree_cpu_s": cpu_s, **({"head_cpu_s": head_cpu_s} if head_pid else {}), **phases}


@contextlib.contextmanager
def ray_head(num_cpus: int = 2) -> Iterator[tuple[str, int]]:
    """A Ray head on this machine for the `ATTACHED` side, up when this yields its address and the PID of its ``ray
    start`` process (the parent of its daemons, and through the raylet of its workers): its own ``ray start
    --block`` (token auth, no dashboard, its own temp dir and ports), stopped by SIGTERM at the end (never ``ray
    stop``, which would stop every Ray instance on the machine)."""
    import shutil
    import signal

    import ray

    from toolbox.core.ports import free_port

    temp, port = tempfile.mkdtemp(prefix="rayb", dir="/tmp"), free_port()  # Ray's socket paths stay short
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_AUTH_MODE": "token"}
    address = f"{ray.util.get_node_ip_address()}:{port}"  # the GCS listens on the node's IP
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--block", "--head",
                             f"--num-cpus={num_cpus}", f"--port={port}", "--include-dashboard=false",
                             f"--temp-dir={temp}", "--disable-usage-stats",
                             f"--dashboard-agent-listen-port={free_port()}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # up once a driver can connect (a job, as a user's earlier runs were) and its daemons have settled
        probe = [sys.executable, "-c", "import ray; ray.init(); ray.shutdown()"]
        if subprocess.run(probe, env=env | {"RAY_ADDRESS": address}, capture_output=True, timeout=300).returncode:
            raise RuntimeError(f"bench startup --attached: no Ray head came up at {address}")
        settle(head.pid)
        yield address, head.pid
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp, ignore_errors=True)


def settle(pid: int, idle_cpu_s: float = 0.05, within_s: float = 60.0) -> None:
    """Until the process tree of ``pid`` spends under ``idle_cpu_s`` CPU seconds in a second (a head whose agents
    are still starting would slow the first run down by seconds), at most ``within_s``."""
    import psutil

    root, deadline = psutil.Process(pid), time.monotonic() + within_s
    last = cpu_readings(root)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = cpu_readings(root)
        if sum(cpu - last.get(key, 0.0) for key, cpu in now.items()) < idle_cpu_s:
            return
        last = now


def with_experiment(overrides: list[str]) -> list[str]:
    """``overrides``, starting with ``experiment=grpo_tiny`` (the default run) unless they name an experiment."""
    return overrides if any(o.startswith("experiment=") for o in overrides) else ["experiment=grpo_tiny", *overrides]


def first_step(metrics: Path) -> dict[str, Any]:
    """The first ``step_end`` record of a metrics.jsonl (``{}`` while there is none)."""
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return next((r for r in map(json.loads, lines) if r.get("event") == "step_end"), {})


def cpu_readings(root: Any) -> dict[tuple[int, float], float]:
    """CPU seconds of a ``psutil.Process`` and its descendants, by (pid, creation time); ``{}`` once it is gone."""
    import psutil

    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    out = {}
    for p in tree:
        try:
            times = p.cpu_times()
            out[(p.pid, p.create_time())] = times.user + times.system
        except psutil.Error:
            continue
    return out


def tree_cpu_until(proc: subprocess.Popen[str], metrics: Path, head: int = 0) -> tuple[float, float]:
    """CPU seconds of ``proc`` and its descendants (each process's latest reading, summed) sampled every 0.2 s
    until ``metrics`` records a step or ``proc`` exits. With ``head`` (the PID of a running Ray head's ``ray
    start``), what that head's process tree (its daemons, the run's workers) spent meanwhile counts too, and is
    the second figure returned (0 without a head)."""
    import psutil

    run, mine = psutil.Process(proc.pid), {}
    cluster = psutil.Process(head) if head else None
    before = cpu_readings(cluster) if cluster else {}  # the head's processes up before the launch count from here
    theirs: dict[tuple[int, float], float] = {}
    while proc.poll() is None and not first_step(metrics):
        mine.update(cpu_readings(run))
        theirs.update(cpu_readings(cluster) if cluster else {})
        time.sleep(0.2)
    head_s = sum(cpu - before.get(key, 0.0) for key, cpu in theirs.items())
    return sum(mine.values()) + head_s, head_s


def median_table(runs: list[dict[str, Any]]) -> list[str]:
    """One line per tree: the median of every figure over its runs."""
    lines = []
    for tree in dict.fromkeys(r["tree"] for r in runs):
        mine = [r for r in runs if r["tree"] == tree]
        keys = [k for k in mine[0] if k != "tree"]
        cells = ", ".join(f"{k.removeprefix('startup/')} {statistics.median(r[k] for r in mine if k in r):.1f}"
                          for k in keys)
        lines.append(f"median of {len(mine)} [{tree}]: {cells}")
    return lines


def against_floor(runs: list[dict[str, Any]]) -> list[str]:
    """With `FLOOR` runs among ``runs``: one line per tree, its median launch-to-step-1 against the floor's."""
    median = {tree: statistics.median(r["to_step_1_s"] for r in runs if r["tree"] == tree)
              for tree in dict.fromkeys(r["tree"] for r in runs)}
    floor = median.pop(FLOOR, None)
    if floor is None:
        return []
    return [f"[{tree}] step 1 at {s:.1f} s: {s / floor:.2f}x the floor (Ray's start and two actors importing torch: "
            f"{floor:.1f} s, {s - floor:.1f} s above it)" for tree, s in median.items()]


def main(argv: list[str]) -> int:
    args = parse(argv)
    overrides = with_experiment(args.override)
    run_root = Path(args.run_root or tempfile.mkdtemp(prefix="toolbox-startup-"))
    trees = [*(args.tree or [""]), *([FLOOR] if args.floor else [])]
    load_before = os.getloadavg()
    runs = []
    with ray_head() if args.attached else contextlib.nullcontext(("", 0)) as head:
        sides: list[tuple[str, tuple[str, int]]] = [(tree, ("", 0)) for tree in trees]
        sides += [(trees[0], head)] if head[0] else []
        for r in range(args.rounds):
            for i, (tree, attach) in enumerate(sides):
                run = one_run(tree, args.steps, overrides, run_root, f"startup-{r}-{i}-{time.time_ns()}", attach)
                runs.append(run)
                print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in run.items()}), flush=True)
    print(*median_table(runs), *against_floor(runs), sep="\n")
    print(f"load average (1, 5, 15 min): before {load_before}, after {os.getloadavg()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "load_before": load_before,
                                              "load_after": os.getloadavg()}, indent=1))
    return 0
