"""`python -m toolbox.bench default_run`'s pieces that run without TRL or Ray: the TRL side's settings read off the
experiment, one run's figures, the report's ratio."""

from __future__ import annotations

import pytest

from toolbox.bench.default_run import figures, report, trl_spec
from toolbox.bench.startup import FLOOR, against_floor, with_experiment


def test_trl_side_takes_the_experiments_hyper_parameters() -> None:
    spec = trl_spec(with_experiment(["algorithm.kl_coef=0.1"]), steps=7)
    assert spec["steps"] == 7 and spec["task"]["name"] == "digit_add" and spec["reward"]["name"] == "math"
    assert spec["sizes"] == {"prompts": 16, "group": 8, "new_tokens": 4, "lr": 2e-3}
    s = spec["settings"]
    assert (s["per_device_train_batch_size"], s["gradient_accumulation_steps"]) == (128, 1)  # grpo_tiny: one micro-batch
    assert (s["beta"], s["epsilon"], s["epsilon_high"]) == (0.1, 0.2, 0.28)
    assert (s["lr_scheduler_type"], s["warmup_steps"], s["generation_kwargs"]) == ("constant_with_warmup", 5, {})
    fsdp2 = trl_spec(with_experiment(["experiment=grpo_tiny_fsdp2"]), steps=1)["settings"]
    assert (fsdp2["per_device_train_batch_size"], fsdp2["gradient_accumulation_steps"]) == (32, 4)


def test_figures_and_the_ratio_of_launch_to_exit_times() -> None:
    fast = figures("toolbox", 100.0, 30.0, [110.0, 111.0, 112.0], [0.0] * 9 + [1.0] * 1)
    assert fast["to_step_1_s"] == 10.0 and fast["train_after_step_1_s"] == 2.0 and fast["s_per_step"] == 1.0
    assert (fast["reward_first_10pct"], fast["reward_last_10pct"]) == (0.0, 1.0)
    slow = figures("trl", 0.0, 45.0, [5.0, 6.0], [0.5, 0.5])
    lines = report([{**fast, "peak_pss_mib": 1400.0}, {**slow, "peak_pss_mib": 900.0}])
    assert lines[-1].startswith("ratio 1.50")
    assert "peak_pss_mib 1400.000" in lines[-3] and "peak_pss_mib 900.000" in lines[-2]
    with pytest.raises(RuntimeError, match="the trl side ended 1 steps"):
        figures("trl", 0.0, 1.0, [0.5], [0.0])


def test_each_tree_is_put_against_the_floor_measured_beside_it() -> None:
    runs = [{"tree": "a", "to_step_1_s": s} for s in (8.0, 9.0, 10.0)] + [{"tree": FLOOR, "to_step_1_s": s}
                                                                          for s in (4.0, 6.0)]
    assert against_floor(runs) == ["[a] step 1 at 9.0 s: 1.80x the floor (Ray's start and two actors importing "
                                   "torch: 5.0 s, 4.0 s above it)"]
    assert against_floor(runs[:3]) == []  # no --floor: no line
