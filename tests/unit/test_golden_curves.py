"""Loss-curve regression for the policy trainers: a fixed seed, a few steps, compared with tests/golden/.

A change that should not move the numbers must reproduce these curves; one that should,
rewrites them with ``TOOLBOX_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit -k golden``.
(SFT and DPO have theirs beside their learner tests.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.golden import check_golden, run_recipe

CASES = {
    "grpo_tiny_fsdp2": (["trainer.total_steps=4", "algorithm.prompts_per_step=8"], ["loss", "kl", "reward", "grad_norm"]),
    "dapo_tiny": (["trainer.total_steps=4", "algorithm.prompts_per_step=8"], ["loss", "reward", "grad_norm"]),
    "ppo_tiny": (["trainer.total_steps=4", "algorithm.prompts_per_step=32"], ["loss", "vf_loss", "reward", "grad_norm"]),
    "online_dpo_tiny": (["trainer.total_steps=4", "algorithm.prompts_per_step=8"], ["dpo_loss", "reward", "pairs"]),
    "ppo_cartpole": (["trainer.total_steps=3", "env.num_workers=1", "algorithm.target_return=null"], ["loss", "value_loss", "entropy"]),
}


@pytest.mark.parametrize("experiment", sorted(CASES))
def test_curve_matches_golden(experiment: str, tmp_path: Path) -> None:
    overrides, keys = CASES[experiment]
    history = run_recipe(tmp_path, f"experiment={experiment}", *overrides)
    check_golden(experiment, history, keys)
