"""The env-throughput and continuous-control benchmarks' arithmetic (no Ray, no RLlib): medians over rounds,
ours / RLlib ratios, the order sides are measured in, the ``ratio`` lines, and curve milestones."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from toolbox.bench._throughput_sides import Point
from toolbox.bench.env_throughput import Measure, measure, print_rows, summarize
from toolbox.bench.ppo_continuous import at_steps, first_return, summary_rows

CARTPOLE_2x8 = Point("CartPole-v1", 2, 8)


def rounds(system: str, mode: str, rates: list[float], point: Point = CARTPOLE_2x8) -> list[Measure]:
    return [Measure(system, point, mode, steps=int(rate * 2), seconds=2.0) for rate in rates]


def test_each_side_is_the_median_over_rounds_and_the_ratio_is_ours_over_rllib() -> None:
    measures = (rounds("toolbox", "sample", [900, 1000, 5000]) + rounds("rllib", "sample", [400, 500, 450])
                + rounds("toolbox", "learn", [300, 100]) + rounds("rllib", "learn", [100, 100]))
    [row] = summarize(measures)
    assert row["toolbox_sample"] == 1000 and row["rllib_sample"] == 450  # one slow round moves nothing
    assert row["ratio_sample"] == pytest.approx(1000 / 450)
    assert row["toolbox_learn"] == 200 and row["ratio_learn"] == pytest.approx(2.0)
    assert (row["env"], row["runners"], row["envs"], row["vectorization"]) == ("CartPole-v1", 2, 8, "sync")


def test_configurations_stay_apart_and_a_missing_side_has_no_ratio() -> None:
    other = Point("CartPole-v1", 4, 8)
    rows = summarize(rounds("toolbox", "sample", [1000]) + rounds("toolbox", "sample", [3000], other)
                     + rounds("rllib", "sample", [500], other))
    by_runners = {r["runners"]: r for r in rows}
    assert by_runners[2]["ratio_sample"] is None and by_runners[2]["toolbox_sample"] == 1000
    assert by_runners[4]["ratio_sample"] == pytest.approx(6.0)


def test_ratio_lines_are_printed_per_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    print_rows(summarize(rounds("toolbox", "sample", [1250]) + rounds("rllib", "sample", [500])))
    assert ("CartPole-v1 2x8 sync: ratio 2.50 (sampling; goal >= 2), per CPU second -, learning ratio -"
            in capsys.readouterr().out)


class FakeSide:
    """Takes 10 env steps per call and records the order it was called in."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def sample(self) -> tuple[int, float]:
        self.calls.append(f"{self.name}.sample")
        return 10, 0.5

    def learn(self) -> tuple[int, float]:
        self.calls.append(f"{self.name}.learn")
        return 10, 1.0

    def pids(self) -> list[int]:
        return [os.getpid()] if self.name == "toolbox" else []

    def close(self) -> None: ...


def test_rounds_alternate_which_side_goes_first_after_an_uncounted_warm_up() -> None:
    calls: list[str] = []
    out = measure([FakeSide("toolbox", calls), FakeSide("rllib", calls)], CARTPOLE_2x8, rounds=2, iters=1)
    assert calls == ["toolbox.sample", "rllib.sample",  # the warm-up rollout of each, not measured
                     "toolbox.sample", "rllib.sample", "rllib.sample", "toolbox.sample",
                     "toolbox.learn", "rllib.learn",  # the warm-up step of each, not measured
                     "toolbox.learn", "rllib.learn", "rllib.learn", "toolbox.learn"]
    assert [(m.system, m.mode, m.rate) for m in out[:2]] == [("toolbox", "sample", 20.0), ("rllib", "sample", 20.0)]
    assert len(out) == 8 and {m.rate for m in out if m.mode == "learn"} == {10.0}
    assert all(m.cpu_s >= 0 for m in out)  # the driver's own CPU time at least (the fakes burn next to none)


def test_steps_per_cpu_second_give_a_ratio_beside_the_wall_clock_one(capsys: pytest.CaptureFixture[str]) -> None:
    ours = [Measure("toolbox", CARTPOLE_2x8, "sample", steps=1000, seconds=2.0, cpu_s=c) for c in (0.5, 1.0, 9.0)]
    theirs = [Measure("rllib", CARTPOLE_2x8, "sample", steps=1000, seconds=1.0, cpu_s=c) for c in (2.0, 3.0, 2.5)]
    unmeasured = Measure("rllib", CARTPOLE_2x8, "sample", steps=1000, seconds=1.0)  # an --out file of before cpu_s
    [row] = summarize([*ours, *theirs, unmeasured])
    assert row["toolbox_sample_cpu"] == 1000 and row["rllib_sample_cpu"] == 400  # medians; unmeasured left out
    assert row["ratio_sample"] == pytest.approx(0.5) and row["ratio_sample_cpu"] == pytest.approx(2.5)
    print_rows([row])
    assert "ratio 0.50 (sampling; goal >= 2), per CPU second 2.50" in capsys.readouterr().out


def test_cpu_seconds_count_the_children_of_a_listed_process() -> None:
    """A shell (the listed pid) whose child burns 0.3 CPU seconds, as an async vector env's subprocess would."""
    import subprocess
    import sys
    import time

    from toolbox.bench._throughput_sides import cpu_seconds

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('burnt', flush=True)\ntime.sleep(30)"
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{burn}"; true'], stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None and shell.stdout.readline().strip() == "burnt"
        assert cpu_seconds([shell.pid]) - time.process_time() >= 0.29
    finally:
        import psutil

        for proc in psutil.Process(shell.pid).children(recursive=True):
            proc.kill()
        shell.kill()
        shell.wait()


def test_rllib_return_is_read_from_its_new_stack_result_and_is_nan_until_an_episode_ends() -> None:
    """RLlib 2.60 nests runner metrics under ``env_runners`` and logs ``episode_return_mean`` only once an episode
    has ended (HalfCheetah: after 1,000 steps of every env, e.g. 32,768 steps with 2 runners x 16 envs)."""
    from toolbox.bench._rllib import result_point

    before = {"env_runners": {"num_env_steps_sampled_lifetime": 30720.0, "num_episodes_lifetime": 0.0, "num_episodes": 0}}
    after = {"env_runners": {"num_env_steps_sampled_lifetime": 32768.0, "num_episodes_lifetime": 32.0,
                             "episode_return_mean": -299.7, "episode_len_mean": 1000.0}}
    later = {"env_runners": {"num_env_steps_sampled_lifetime": 34816.0, "num_episodes_lifetime": 32.0}}  # none ended
    first = result_point(before, 100.0)
    second = result_point(after, 120.0, first)
    third = result_point(later, 140.0, second)
    assert math.isnan(first["episode_return"]) and first["episodes"] == 0 and first["env_steps"] == 30720
    assert second == {"env_steps": 32768.0, "wall_s": 120.0, "episode_return": -299.7, "episodes": 32.0}
    assert third["episode_return"] == -299.7 and third["env_steps"] == 34816  # held until RLlib reports again
    # RLlib 2.60 also reports the key with a NaN value when no episode ended (what the 1M-step run's log shows)
    nan_key = {"env_runners": {"num_env_steps_sampled_lifetime": 36864.0, "episode_return_mean": math.nan}}
    assert result_point(nan_key, 160.0, third)["episode_return"] == -299.7


def test_a_recorded_rllib_curve_holds_its_last_return_over_iterations_without_one(tmp_path: Path) -> None:
    from toolbox.bench.ppo_continuous import read_curve

    points = [(30720, math.nan), (32768, -299.7), (34816, math.nan), (65536, -199.2), (67584, math.nan)]
    log = tmp_path / "rllib.jsonl"
    log.write_text("".join(json.dumps({"env_steps": s, "wall_s": 1.0, "episode_return": r}) + "\n" for s, r in points))
    returns = [p["episode_return"] for p in read_curve(str(log))]
    assert math.isnan(returns[0]) and returns[1:] == [-299.7, -299.7, -199.2, -199.2]


def test_continuous_benchmark_reads_each_curve_at_its_milestones() -> None:
    curve = [{"env_steps": s, "wall_s": s / 100, "episode_return": s / 1000} for s in (40_000, 60_000, 120_000)]
    assert at_steps(curve, 50_000) == curve[1] and at_steps(curve, 250_000) is None
    rows = summary_rows({"rllib": curve})
    assert [(r["env_steps"], r["episode_return"]) for r in rows] == [(50_000, 60.0), (100_000, 120.0), (120_000, 120.0)]
    assert rows[-1]["last"] and "last" not in rows[0]


def test_rounds_written_by_out_read_back_the_same() -> None:
    [m] = rounds("rllib", "learn", [250], Point("HalfCheetah-v5", 4, 8, "async"))
    assert Measure.from_dict(json.loads(json.dumps(asdict(m)))) == m


def test_continuous_benchmark_says_when_a_return_first_came_or_that_none_did() -> None:
    nan = float("nan")
    curve = [{"env_steps": 30720.0, "wall_s": 300.0, "episode_return": nan},
             {"env_steps": 32768.0, "wall_s": 320.0, "episode_return": -299.7}]
    assert first_return(curve) == "first mean training return at 32,768 env steps (320 s)"
    assert first_return(curve[:1]) == "no episode finished in 30,720 env steps: no return to report"


def test_runner_profile_counts_each_stack_for_its_innermost_named_frame() -> None:
    from toolbox.bench.runner_profile import split

    step = "Worker.main_loop (ray/_private/worker.py:1);EnvRunner.rollout (toolbox/envs/env_runner.py:144)"
    raw = "\n".join([
        f"{step};SyncVectorEnv.step (gymnasium/vector/sync_vector_env.py:283);HalfCheetahEnv.step "
        "(gymnasium/envs/mujoco/half_cheetah_v5.py:231) 6",  # the env, under the vector env and the runner
        f"{step};NumpyStepPolicy.act (toolbox/envs/step_policy.py:110);_sum (numpy/_core/_methods.py:51) 3",
        f"{step} 1",  # the runner's own line
        "SingleAgentEnvRunner._sample (ray/rllib/env/single_agent_env_runner.py:518);ConnectorPipelineV2.__call__ "
        "(ray/rllib/connectors/connector_pipeline_v2.py:60);TorchMLP.forward (ray/rllib/core/models/torch/primitives.py:186) 2",
        "<module> (ray/_private/workers/default_worker.py:323);put (ray/_private/worker.py:900) 4",
        "",
    ])
    assert split(raw) == {"env": 6 / 16, "ray call + object store": 4 / 16, "policy forward": 5 / 16,
                          "runner bookkeeping": 1 / 16}
    assert split("") == {}
