"""``toolbox traces``: a run's samples.jsonl -> SFT rows (rejection sampling) or DPO pairs (best vs worst of a group),
read back by the project's own SFT / preference dataset readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.commands.cli import main as toolbox
from toolbox.core.errors import ConfigError
from toolbox.data.offline import load_records
from toolbox.tracing.datasets import dpo_rows, read_samples, sft_rows
from toolbox.tracing.entries import SampleInputs, SampleOutputs, SampleTrace

# (step, group, prompt, response, reward or None for an error)
ROWS = [
    (1, 0, "1+1=", "2", 1.0), (1, 0, "1+1=", "3", 0.0), (1, 0, "1+1=", "22", 0.5),
    (1, 1, "2+2=", "5", 0.0), (1, 1, "2+2=", "6", 0.0),  # a tie: no pair, no SFT row above 0
    (2, 0, "3+3=", "6", 1.0), (2, 0, "3+3=", "?", None),  # the errored sample is left out
    (2, 1, "1+1=", "2", 1.0), (2, 1, "1+1=", "4", 0.0),  # the same best row as step 1: written once
]


def trace(step: int, group: int, prompt: str, response: str, reward: float | None) -> SampleTrace:
    return SampleTrace(step=step, role="rollout", rank=0, inputs=SampleInputs(prompt=prompt, group=group),
                       outputs=SampleOutputs(response=response, response_tokens=len(response), finish_reason="stop",
                                             reward=reward, reward_state="ok" if reward is not None else "error",
                                             reward_reason="" if reward is not None else "TimeoutError"))


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "samples.jsonl").write_text("".join(trace(*row).model_dump_json() + "\n" for row in ROWS))
    return tmp_path


def test_sft_keeps_each_groups_best_response_above_the_threshold() -> None:
    samples = [trace(*row) for row in ROWS]
    assert sft_rows(samples, min_reward=1.0) == [{"prompt": "1+1=", "response": "2"}, {"prompt": "3+3=", "response": "6"}]
    assert {"prompt": "2+2=", "response": "5"} in sft_rows(samples, min_reward=0.0)
    assert sft_rows(samples, min_reward=1.5) == []


def test_dpo_pairs_best_and_worst_of_groups_with_distinct_rewards() -> None:
    samples = [trace(*row) for row in ROWS]
    assert dpo_rows(samples) == [{"prompt": "1+1=", "chosen": "2", "rejected": "3"},
                                 {"prompt": "1+1=", "chosen": "2", "rejected": "4"}]
    assert dpo_rows(samples, min_margin=1.0) == []  # 1.0 - 0.0 is not more than 1.0


@pytest.mark.parametrize(("kind", "reader_kind", "rows"), [("sft", "sft", 2), ("dpo", "preference", 2)])
def test_cli_output_loads_with_the_trainers_own_readers(run_dir: Path, tmp_path: Path, kind: str, reader_kind: str,
                                                        rows: int) -> None:
    out = tmp_path / "data" / f"{kind}.jsonl"
    assert toolbox(["traces", str(run_dir), "--to", kind, str(out)]) == 0
    records = load_records(out, reader_kind)  # type: ignore[arg-type]
    assert len(records) == rows
    assert records[0]["prompt"] == "1+1="


def test_a_bad_line_is_named_by_file_and_line(run_dir: Path) -> None:
    with (run_dir / "samples.jsonl").open("a") as f:
        f.write('{"step": 3, "role": "rollout", "rank": 0, "inputs": {"prompt": "x", "group": 0}}\n')
    with pytest.raises(ConfigError, match=r"samples\.jsonl:10: not a sample trace: outputs: Field required"):
        read_samples(run_dir / "samples.jsonl")


def test_no_samples_or_no_rows_exit_2_saying_why(tmp_path: Path, run_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty-run"
    empty.mkdir()
    assert toolbox(["traces", str(empty), "--to", "sft", str(tmp_path / "x.jsonl")]) == 2
    said = lambda: " ".join(capsys.readouterr().err.split())  # noqa: E731  (rich wraps long lines)
    assert "no samples.jsonl; a run records samples every trainer.log_samples_every steps" in said()
    assert toolbox(["traces", str(run_dir / "samples.jsonl"), "--to", "sft", "--min-reward", "2",
                    str(tmp_path / "y.jsonl")]) == 2
    assert "none of the 9 recorded samples gives a sft row (no group with a reward >= 2.0)" in said()
    assert not (tmp_path / "y.jsonl").exists()
