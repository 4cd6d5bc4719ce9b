"""The env-throughput and continuous-control benchmarks' arithmetic (no Ray, no RLlib): medians over rounds,
ours / RLlib ratios, the order sides are measured in, the ``ratio`` lines, and curve milestones."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from toolbox.bench._throughput_sides import Point
from toolbox.bench.env_throughput import Measure, measure, print_rows, summarize
from toolbox.bench.ppo_continuous import at_steps, summary_rows

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
    assert "CartPole-v1 2x8 sync: ratio 2.50 (sampling; goal >= 2), learning ratio -" in capsys.readouterr().out


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

    def close(self) -> None: ...


def test_rounds_alternate_which_side_goes_first_and_learning_has_an_uncounted_warm_up() -> None:
    calls: list[str] = []
    out = measure([FakeSide("toolbox", calls), FakeSide("rllib", calls)], CARTPOLE_2x8, rounds=2, iters=1)
    assert calls == ["toolbox.sample", "rllib.sample", "rllib.sample", "toolbox.sample",
                     "toolbox.learn", "rllib.learn",  # the warm-up step of each, not measured
                     "toolbox.learn", "rllib.learn", "rllib.learn", "toolbox.learn"]
    assert [(m.system, m.mode, m.rate) for m in out[:2]] == [("toolbox", "sample", 20.0), ("rllib", "sample", 20.0)]
    assert len(out) == 8 and {m.rate for m in out if m.mode == "learn"} == {10.0}


def test_continuous_benchmark_reads_each_curve_at_its_milestones() -> None:
    curve = [{"env_steps": s, "wall_s": s / 100, "episode_return": s / 1000} for s in (40_000, 60_000, 120_000)]
    assert at_steps(curve, 50_000) == curve[1] and at_steps(curve, 250_000) is None
    rows = summary_rows({"rllib": curve})
    assert [(r["env_steps"], r["episode_return"]) for r in rows] == [(50_000, 60.0), (100_000, 120.0), (120_000, 120.0)]
    assert rows[-1]["last"] and "last" not in rows[0]


def test_rounds_written_by_out_read_back_the_same() -> None:
    [m] = rounds("rllib", "learn", [250], Point("HalfCheetah-v5", 4, 8, "async"))
    assert Measure.from_dict(json.loads(json.dumps(asdict(m)))) == m
