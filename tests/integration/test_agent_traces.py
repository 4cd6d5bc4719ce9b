"""Agent traces from a real run: the tool recipe (`grpo_tool_calc_tiny`, a tiny char model calling the calculator in
episodes of up to 2 turns, after a cold start cut to 40 SFT steps) on a real local Ray records samples whose turns
are typed records that add up to the episode, with the tool calls the environment ran, and ``toolbox traces`` turns
them into chat rows the SFT reader loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import stopped_runs
from toolbox.commands.cli import main as toolbox
from toolbox.data.offline import load_records
from toolbox.tracing.datasets import read_samples

pytestmark = pytest.mark.integration


def test_a_tool_run_records_every_turn_and_call(ray_session: None, tmp_path: Path) -> None:
    stopped_runs.fit(["experiment=grpo_tool_calc_tiny", f"trainer.run_root={tmp_path}", "trainer.run_name=agent",
                      "callbacks=[{name: jsonl}]", "trainer.total_steps=1", "trainer.final_eval=false",
                      "trainer.log_samples_every=1", "trainer.log_samples=4", "rollout.num_workers=1",
                      "reward.num_workers=1", "learner.num_workers=1", "learner.strategy=single",
                      "learner.micro_batch_size=16", "trainer.eval_every=0",
                      "model.cold_start.overrides=[trainer.total_steps=40]"])
    samples = read_samples(tmp_path / "agent" / "samples.jsonl")
    assert len(samples) == 4 * 8  # 4 prompts' groups of 8 episodes
    calls = []
    for s in samples:
        turns = s.outputs.turns
        assert turns and turns[0].who == "model" and turns[0].role == "assistant", s
        assert sum(t.tokens for t in turns) == s.outputs.response_tokens
        assert "".join(t.text for t in turns) == s.outputs.response  # a char model: the pieces spell the response
        assert [t.turn for t in turns if t.who == "model"] == list(range(1, len(turns[::2]) + 1))
        assert all(t.reward is not None for t in turns if t.who == "env")
        for turn, reply in zip(turns[::2], turns[1::2]):
            calls += turn.tool_calls
            if turn.tool_calls:  # the env's reply shows each call's result, as the recipe's template writes it
                assert reply.role == "tool" and reply.text == "".join(f"={c.result};" for c in turn.tool_calls)
    # The calls the env ran (after a 40-step cold start the model writes `sum()` in most episodes: 29 of 32 here):
    # the prompt's numbers injected as the arguments, their sum the result.
    ran = [c for c in calls if c.ok]
    assert len(ran) >= 8, calls
    for call in ran:
        assert call.tool == "sum" and isinstance(call.arguments, dict) and sorted(call.arguments) == ["a", "b"]
        assert call.result == str(sum(call.arguments.values())) and call.seconds >= 0
    out = tmp_path / "sft.jsonl"
    assert toolbox(["traces", str(tmp_path / "agent"), "--to", "sft", "--min-reward", "0", str(out)]) == 0
    records = load_records(out, "sft")
    assert records and all(r["messages"][0]["role"] == "user" and r["messages"][1]["role"] == "assistant"
                           for r in records)
