"""GRPO on stored rollouts (``algorithm.name=offline_grpo``): the reader of a run's samples.jsonl and of group rows
(`toolbox.data.rollouts`) with its errors naming file and row, the config's checks, and the importance-corrected
loss of one step against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from toolbox.algorithms.offline_grpo.config import OfflineGRPOConfig
from toolbox.algorithms.offline_grpo.learner import OfflineGRPOLearner
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.data.rollouts import load_rollout_groups
from toolbox.learner.config import LearnerConfig
from toolbox.models.loading import load_causal_lm, load_tokenizer
from toolbox.models.logprobs import response_logprobs
from toolbox.tracing.entries import SampleInputs, SampleOutputs, SampleTrace


def _sample(step: int, group: int, response_ids: list[int], logprobs: list[float], reward: float | None,
            prompt_ids: tuple[int, ...] = (5, 6, 7)) -> str:
    trace = SampleTrace(step=step, role="rollout", rank=0,
                        inputs=SampleInputs(prompt="p", group=group, prompt_ids=list(prompt_ids)),
                        outputs=SampleOutputs(response="r", response_tokens=len(response_ids), finish_reason="stop",
                                              reward=reward, reward_state="ok" if reward is not None else "error",
                                              response_ids=response_ids, logprobs=logprobs))
    return trace.model_dump_json()


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_samples_of_one_step_and_group_become_one_group(tmp_path: Path) -> None:
    lines = [_sample(1, 0, [3, 4], [-0.5, -1.0], 1.0), _sample(1, 1, [4], [-0.1], 0.0, (8, 9)),
             _sample(1, 0, [5], [-2.0], None), _sample(1, 1, [6, 7, 8], [-0.3, -0.2, -0.1], 1.0, (8, 9))]
    groups = load_rollout_groups(_write(tmp_path / "samples.jsonl", lines), group_size=2)
    assert groups == [
        {"prompt_ids": [5, 6, 7], "prompt": "p", "responses": [[3, 4], [5]], "logprobs": [[-0.5, -1.0], [-2.0]],
         "rewards": [1.0, None], "finish_reasons": ["stop", "stop"]},  # the errored reward abstains
        {"prompt_ids": [8, 9], "prompt": "p", "responses": [[4], [6, 7, 8]], "logprobs": [[-0.1], [-0.3, -0.2, -0.1]],
         "rewards": [0.0, 1.0], "finish_reasons": ["stop", "stop"]}]


@pytest.mark.parametrize(("lines", "message"), [
    ([_sample(1, 0, [3], [], 1.0), _sample(1, 0, [4], [-1.0], 0.0)],
     r"samples\.jsonl:1: no behaviour log-probs \(outputs\.logprobs is missing or empty\)"),
    ([_sample(1, 0, [3], [-1.0], 1.0), _sample(1, 0, [4, 5], [-1.0], 0.0)],
     r"samples\.jsonl:2: outputs\.logprobs has 1 log-probs for 2 response tokens"),
    ([_sample(1, 0, [3], [0.5], 1.0), _sample(1, 0, [4], [-1.0], 0.0)],
     r"samples\.jsonl:1: outputs\.logprobs must hold finite log-probs <= 0 \(log p, not p\)"),
    ([_sample(1, 0, [3], [-1.0], 1.0), _sample(2, 0, [4], [-1.0], 0.0), _sample(2, 0, [5], [-1.0], 0.0),
      _sample(2, 0, [6], [-1.0], 0.0)],
     r"samples\.jsonl:1: step 1, group 0 has 1 samples; algorithm\.group_size is 2"),
])
def test_bad_samples_are_named_by_file_and_row(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_rollout_groups(_write(tmp_path / "samples.jsonl", lines), group_size=2)


def test_a_group_of_the_wrong_size_names_its_rows(tmp_path: Path) -> None:
    lines = [_sample(1, 0, [3], [-1.0], 1.0), _sample(1, 0, [4], [-1.0], 0.0), _sample(1, 0, [5], [-1.0], 0.0)]
    with pytest.raises(ConfigError, match=r"samples\.jsonl:1-3: step 1, group 0 has 3 samples; algorithm\.group_size "
                                          r"is 2 \(advantages are taken over whole groups\)"):
        load_rollout_groups(_write(tmp_path / "samples.jsonl", lines), group_size=2)


def _group_row(**fields: Any) -> str:
    row = {"prompt": "1+2=", "responses": [[3, 4], [5]], "logprobs": [[-1.0, -2.0], [-0.5]], "rewards": [1, 0]}
    return json.dumps({k: v for k, v in {**row, **fields}.items() if v is not None})


@pytest.mark.parametrize(("row", "message"), [
    (_group_row(logprobs=None), r"rollouts\.jsonl:2: no behaviour log-probs \('logprobs': one list per response"),
    (_group_row(rewards=[1]), r"rollouts\.jsonl:2: 2 responses, 2 log-prob lists and 1 rewards"),
    (_group_row(responses=["3", "5"]), r"rollouts\.jsonl:2: responses\[0\] must be a non-empty list of token ids"),
    (_group_row(logprobs=[[-1.0], [-0.5]]), r"rollouts\.jsonl:2: logprobs\[0\] has 1 log-probs for 2 response tokens"),
])
def test_bad_group_rows_are_named_by_file_and_row(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path / "rollouts.jsonl", [_group_row(), row])
    with pytest.raises(ConfigError, match=message):
        load_rollout_groups(path, group_size=2)


def test_config_reads_the_rows_before_any_actor_starts(tmp_path: Path) -> None:
    path = _write(tmp_path / "samples.jsonl", [_sample(1, 0, [3], [], 1.0), _sample(1, 0, [4], [-1.0], 0.0)])
    with pytest.raises(ConfigError, match=r"algorithm\.dataset: .*samples\.jsonl:1: no behaviour log-probs"):
        load_config(["experiment=offline_grpo_tiny", f"algorithm.dataset={path}", "algorithm.group_size=2",
                     "algorithm.prompts_per_step=1"])
    with pytest.raises(ConfigError, match=r"algorithm\.tis_cap=2\.0: with algorithm\.importance=ratio"):
        load_config(["experiment=offline_grpo_tiny", "algorithm.importance=ratio", "algorithm.tis_cap=2.0"])
    with pytest.raises(ConfigError, match=r"algorithm\.dynamic_sampling: Extra inputs are not permitted"):
        load_config(["experiment=offline_grpo_tiny", "algorithm.dynamic_sampling=true"])
    cfg = load_config(["experiment=offline_grpo_tiny"])
    assert cfg.algorithm.tis_cap == 2.0  # unset: resolved to the cap used, into the written config.yaml


PROMPTS = ["1+2=", "3+4="]
RESPONSES = [[[5, 6, 7], [8, 9]], [[10, 3], [4, 11, 12]]]
REWARDS = [[1.0, 0.0], [0.0, 1.0]]  # RLOO over groups of 2: advantages +1 / -1
OFFSETS = [[[-2.0, -0.5, 0.1], [1.0, -0.3]], [[0.4, -1.5], [0.05, 0.2, -0.8]]]  # behaviour = pi + offset


def _hand_case(tiny_model_dir: Path, tmp_path: Path) -> tuple[str, list[torch.Tensor], list[torch.Tensor]]:
    """A group-row file whose behaviour log-probs are the model's own moved by `OFFSETS`; the model's log-probs and
    the behaviour's, per response."""
    tok, model = load_tokenizer(str(tiny_model_dir)), load_causal_lm(str(tiny_model_dir)).eval()
    pis, mus, rows = [], [], []
    for prompt, responses, rewards, offsets in zip(PROMPTS, RESPONSES, REWARDS, OFFSETS, strict=True):
        prompt_ids = tok(prompt, add_special_tokens=True)["input_ids"]
        lps = []
        for ids, off in zip(responses, offsets, strict=True):
            rows_ = _Rows(prompt_ids, ids)
            with torch.no_grad():
                pi = response_logprobs(model, rows_, 1.0)[0]
            mu = (pi + torch.tensor(off)).clamp(max=-1e-3)
            pis.append(pi)
            mus.append(mu)
            lps.append(mu.tolist())
        rows.append(json.dumps({"prompt_ids": prompt_ids, "responses": responses, "logprobs": lps, "rewards": rewards}))
    return _write(tmp_path / "groups.jsonl", rows), pis, mus


class _Rows:
    """One prompt + response row (what `response_logprobs` takes)."""

    def __init__(self, prompt: list[int], response: list[int]) -> None:
        self.prompt_ids_BP, self.response_ids_BR = torch.tensor([prompt]), torch.tensor([response])
        self.response_mask_BR = torch.ones(1, len(response), dtype=torch.long)

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.cat([self.prompt_ids_BP, self.response_ids_BR], 1)
        return ids, torch.ones_like(ids), torch.arange(ids.shape[1]).unsqueeze(0)


@pytest.mark.parametrize("importance", ["truncated", "ratio"])
def test_importance_corrected_loss_matches_a_hand_computation(tiny_model_dir: Path, tmp_path: Path,
                                                              importance: str) -> None:
    path, pis, mus = _hand_case(tiny_model_dir, tmp_path)
    algo = OfflineGRPOConfig(dataset=path, prompts_per_step=2, group_size=2, advantage="rloo", importance=importance,
                             tis_cap=2.0 if importance == "truncated" else 0.0,
                             loss={"clip_low": 0.2, "clip_high": 0.28})
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=4, packing=False)
    metrics = OfflineGRPOLearner(str(tiny_model_dir), "float32", cfg, algo, total_steps=1).update(0)
    terms, tokens = [], 0
    for pi, mu, adv in zip(pis, mus, [1.0, -1.0, -1.0, 1.0], strict=True):
        if importance == "truncated":  # ratio pi / pi_old = 1; each token weighted by min(pi_old / mu, 2)
            terms.append(-(torch.exp(pi - mu).clamp(max=2.0) * adv))
        else:  # PPO's clipped ratio, taken against mu
            r = torch.exp(pi - mu)
            terms.append(-torch.minimum(r * adv, r.clamp(0.8, 1.28) * adv))
        tokens += len(pi)
    want = float(torch.cat(terms).sum()) / tokens
    assert metrics["pg_loss"] == pytest.approx(want, rel=1e-4)
    assert metrics["loss"] == pytest.approx(want, rel=1e-4)  # no KL term
    assert metrics["reward"] == pytest.approx(0.5)
    on_policy = OfflineGRPOConfig(dataset=path, prompts_per_step=2, group_size=2, advantage="rloo", tis_cap=0.0)
    plain = OfflineGRPOLearner(str(tiny_model_dir), "float32", cfg, on_policy, total_steps=1).update(0)
    # uncorrected (no cap): -(3 - 2 - 2 + 3) / 10, each token's advantage alone
    assert plain["pg_loss"] == pytest.approx(-0.2, rel=1e-5)
