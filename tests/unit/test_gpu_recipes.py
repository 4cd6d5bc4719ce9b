"""The recipes at real size: each one's dry-run memory plan fits the GPUs it states, and `toolbox deploy render`
asks Kubernetes for exactly those GPUs.

The published architectures stand in for the models (`toolbox.models.architectures`: nothing is downloaded) and the
shipped GSM8K-shaped sample for the full GSM8K (the plan depends on the model and the layout, not the rows).
Not covered: a run on a GPU (tests/gpu, scripts/gpu_checks.sh).
"""

from __future__ import annotations

import pytest

from toolbox.config import load_config
from toolbox.driver.gpu_plan import gpu_plan
from toolbox.driver.model_shape import model_shape
from toolbox.driver.placement import role_bundles

STAND_IN_DATA = "task.path=./configs/data/gsm8k_tiny"
RECIPES = {"grpo_qwen2.5_0.5b_gsm8k": 1, "grpo_qwen2.5_7b_gsm8k": 8, "grpo_qwen2.5_7b_lora_gsm8k": 1}


@pytest.mark.parametrize(("recipe", "gpus"), RECIPES.items())
def test_recipe_plan_fits_its_gpus(recipe: str, gpus: int) -> None:
    cfg = load_config([f"experiment={recipe}", STAND_IN_DATA])
    asked = sum(resources.get("GPU", 0.0) for _, resources in role_bundles(cfg))
    assert asked == gpus
    plan = gpu_plan(cfg, model_shape(cfg), gpu_gib=80)
    assert plan.fits, plan.problems
    assert plan.engine is not None and plan.sequences >= cfg.algorithm.rollouts_per_step // cfg.rollout.num_workers


@pytest.mark.parametrize(("recipe", "gpus"), RECIPES.items())
def test_rendered_rayjob_asks_for_exactly_the_recipes_gpus(recipe: str, gpus: int) -> None:
    from toolbox.commands.deploy import render

    job = render([f"experiment={recipe}", STAND_IN_DATA])
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    offered = sum(int(g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0))
                  * g["replicas"] for g in groups)
    assert offered == gpus
    assert job["spec"]["entrypoint"].startswith("python -m toolbox.run experiment=" + recipe)


def test_recipe_that_does_not_fit_says_why() -> None:
    cfg = load_config(["experiment=grpo_qwen2.5_7b_gsm8k", STAND_IN_DATA, "learner.micro_batch_size=32"])
    assert "training: a learner rank needs" in " ".join(gpu_plan(cfg, model_shape(cfg), gpu_gib=80).problems)
