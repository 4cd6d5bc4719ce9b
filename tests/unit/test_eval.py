"""Evaluation on its own: the pass@k estimator by hand, the summary, and `toolbox.commands.eval` in-process on a run's export.

``trainer.export`` is exercised here too: a local-mode run writes RUN_DIR/hf, which
`toolbox.commands.export` reproduces from the run's checkpoint and `toolbox.commands.eval` then scores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from toolbox.commands import eval as toolbox_eval
from toolbox.commands import export as toolbox_export
from toolbox.commands import run as toolbox_run
from toolbox.core.errors import ConfigError
from toolbox.driver.local_ray import WORKER_ENV
from toolbox.evaluation.metrics import PromptResult, pass_at_k, summarize

LOCAL = ["ray.local_mode=true", "learner.num_workers=1", "learner.strategy=single", "callbacks=[{name: jsonl}]"]
METRICS = {"prompts", "samples_per_prompt", "pass@1", "pass@2", "reward_mean", "response_len_mean", "reward_abstain",
           "reward_error"}


@pytest.fixture(autouse=True)
def isolated_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in WORKER_ENV.items():
        monkeypatch.setenv(key, value)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    yield
    torch.set_num_threads(threads)
    torch.set_rng_state(rng)


def test_pass_at_k_hand_computed() -> None:
    # n=5 samples, c=2 correct: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # pass@3 = 1 - C(3,3)/C(5,3) = 1 - 1/10; with n-c < k every draw holds a correct sample.
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError, match="1 <= k <= n; got n=2, c=1, k=3"):
        pass_at_k(2, 1, 3)


def result(rewards: list[float | None], status: list[str]) -> PromptResult:
    n = len(rewards)
    return PromptResult("1+2=", "3", ["3"] * n, rewards, status, [""] * n, [1, 2, 3][:n])


def test_summary_counts_errors_apart_and_never_as_zero() -> None:
    results = [result([1.0, 0.0, None], ["ok", "ok", "error"]), result([1.0, 1.0, 0.0], ["ok"] * 3)]
    metrics = summarize(results, k=2)
    # c = 1 and 2 of n = 3. pass@2: 1 - C(2,2)/C(3,2) = 2/3, and 1 (n-c < k).
    assert metrics["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert metrics["pass@2"] == pytest.approx((2 / 3 + 1) / 2)
    assert metrics["reward_mean"] == pytest.approx(3 / 5)  # the error is not a scored 0
    assert metrics["reward_error"] == 1 and metrics["reward_abstain"] == 0
    assert metrics["response_len_mean"] == 2 and metrics["prompts"] == 2
    assert summarize(results, k=2, threshold=0.0)["pass@1"] == pytest.approx((2 / 3 + 1) / 2)


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One local-mode GRPO step with trainer.export=true."""
    root = tmp_path_factory.mktemp("runs")
    assert toolbox_run.main([*LOCAL, "trainer.total_steps=1", "trainer.export=true", f"trainer.run_root={root}"]) == 0
    (run_dir,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return run_dir


def test_trainer_export_writes_run_dir_hf_equal_to_the_checkpoint(exported_run: Path, tmp_path: Path) -> None:
    hf = exported_run / "hf"
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in hf.iterdir()}
    assert toolbox_export.main([str(exported_run / "checkpoints" / "step_1"), str(tmp_path / "out")]) == 0
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()(ids).logits
        b = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()(ids).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_eval_in_process_on_a_run(exported_run: Path) -> None:
    assert toolbox_eval.main([f"model={exported_run}", "samples=2", "prompts=3"]) == 0
    report = json.loads((exported_run / "eval" / "eval.json").read_text())
    assert report["model"] == str(exported_run / "hf") and report["task"]["name"] == "digit_add"
    assert set(report["metrics"]) == METRICS and report["metrics"]["prompts"] == 3
    lines = [json.loads(line) for line in (exported_run / "eval" / "eval_samples.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(len(x["responses"]) == len(x["rewards"]) == 2 for x in lines)
    assert {"prompt", "answer", "responses", "rewards", "status", "reasons", "lengths"} <= lines[0].keys()


def test_eval_needs_an_export_of_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("task: {name: digit_add}\n")
    assert toolbox_eval.main([f"model={tmp_path / 'run'}", "samples=2"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"the run has no exported model ({tmp_path / 'run' / 'hf'}); export it with" in err


def test_eval_options_are_validated_apart_from_the_experiment() -> None:
    opts, rest = toolbox_eval.split_args(["samples=4", "task.name=reverse", "out=x"])
    assert (opts.samples, opts.out, rest) == (4, "x", ["task.name=reverse"])
    with pytest.raises(ConfigError, match="samples: Input should be greater than or equal to 1"):
        toolbox_eval.split_args(["samples=0"])


def test_eval_scores_the_whole_held_out_split_of_a_dataset(tmp_path: Path) -> None:
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(3)]  # 12 rows
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["experiment=grpo_tiny", "task.name=dataset", f"task.path={data}", "task.prompt_field=question",
            "task.eval_fraction=0.25", "rollout.num_workers=1", "samples=2", f"trainer.run_root={tmp_path / 'runs'}",
            f"out={tmp_path / 'eval'}"]
    assert toolbox_eval.main(argv) == 0  # no model=: the experiment's own (tiny, untrained) model
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["metrics"]["prompts"] == 3  # a quarter of 12 rows held out, all of them scored
    held = {json.loads(line)["prompt"] for line in (tmp_path / "eval" / "eval_samples.jsonl").read_text().splitlines()}
    assert len(held) == 3 and held <= {r["question"] for r in rows}
