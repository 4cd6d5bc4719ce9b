"""``reward.num_workers: 0``: each rollout worker scores its own batches in its process (the default run's layout).
The same numbers as a reward worker's, no reward actor planned, and a clear refusal where no reward is held."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from toolbox.actors.reward import RewardWorker
from toolbox.actors.rollout import RolloutWorker

from tests.unit.golden import run_recipe
from toolbox.config import load_config
from toolbox.driver.dry_run import actor_rows
from toolbox.driver.placement import role_bundles
from toolbox.rewards.runner import RewardRunConfig
from toolbox.rl.batch import RolloutBatch


def test_the_default_run_starts_no_reward_actor() -> None:
    cfg = load_config([])
    assert cfg.reward.num_workers == 0
    assert [role for role, _ in role_bundles(cfg)] == ["rollout", "learner"]
    rows = {row[0]: row for row in actor_rows(cfg)}
    assert rows["reward"][2] == "0" and "each rollout worker scores its own batches" in rows["reward"][4]


def test_scores_equal_a_reward_workers(tiny_model_dir: Path) -> None:
    tokens = torch.tensor([[5, 3, 6, 14], [5, 3, 6, 14]])
    batch = RolloutBatch(tokens, torch.ones_like(tokens), tokens[:, :2], torch.ones(2, 2, dtype=torch.long),
                         torch.zeros(2, 2), torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                         [{"answer": "1"}, {"answer": "3"}])
    kwargs = dict(rank=0, spec={"name": "math", "which": "first"}, run=RewardRunConfig(), model_path=str(tiny_model_dir))
    threads = torch.get_num_threads()
    try:
        hosting = RolloutWorker(0, build=lambda r: None, torch_threads=threads, scorer=partial(RewardWorker, **kwargs))
        assert torch.get_num_threads() == threads  # the reward's own thread setting does not stick
        hosted, alone = hosting.score(batch), RewardWorker(**kwargs).score(batch)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(hosted.values_B, alone.values_B) and torch.equal(hosted.status_B, alone.status_B)
    assert hosted.values_B.tolist() == [1.0, 0.0]  # both responses read "1+": right for the first row only
    with pytest.raises(RuntimeError, match="rollout worker 0 holds no reward"):
        RolloutWorker(0, build=lambda r: None, torch_threads=threads).score(batch)


def test_a_run_learns_the_same_with_either_layout(tmp_path: Path) -> None:
    """In-process, three steps of the default run: the rewards and losses do not depend on who scores."""
    runs = [run_recipe(tmp_path / str(n), f"reward.num_workers={n}", "trainer.total_steps=3") for n in (0, 1)]
    for key in ("reward", "loss"):
        assert [m[key] for m in runs[0]] == [m[key] for m in runs[1]]


def test_roles_sharing_a_group_ask_for_its_restarts_once(tmp_path: Path) -> None:
    """With the reward hosted by the rollout workers, one question to their group per step answers for both."""
    from toolbox.actors.group import LocalGroup
    from toolbox.actors.roles import RewardGroup, RolloutGroup

    from toolbox.trainers.healing import step_with_restarts

    class Counting(LocalGroup):
        asked = 0

        def restarts(self) -> int:
            Counting.asked += 1
            return 2

    shared = Counting("rollout", [object()])
    trainer = SimpleNamespace(rollout=RolloutGroup(shared), reward=RewardGroup(shared),
                              learner=SimpleNamespace(restarts=lambda: 0))
    metrics = step_with_restarts(trainer, 0, lambda step: {"loss": 1.0})  # type: ignore[arg-type]
    assert Counting.asked == 1
    assert metrics == {"loss": 1.0, "rollout_restarts": 2.0, "reward_restarts": 2.0, "learner_restarts": 0.0}


def test_a_task_prompt_is_tokenised_once() -> None:
    from tests.unit.test_trainer import CharTokenizer
    from toolbox.data.prompts import PromptSource
    from toolbox.data.tasks import TASKS

    calls: list[str] = []

    class Counting(CharTokenizer):
        def __call__(self, text: str, **kwargs: Any) -> Any:
            calls.append(text)
            return super().__call__(text, **kwargs)

    source, plain = (PromptSource(TASKS.build({"name": "digit_add"}), tok, seed=0) for tok in (Counting(), CharTokenizer()))
    for step in range(20):
        assert [r.ids for r in source.step(step, 16, 2)] == [r.ids for r in plain.step(step, 16, 2)]
    assert len(calls) == len(set(calls)) == len(source.text_ids) <= 25  # digit_add's operands 0-4: 25 prompts
