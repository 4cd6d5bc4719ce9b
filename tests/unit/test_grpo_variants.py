"""GRPO variants as configuration: DAPO's overlong shaping and dynamic sampling, base experiments."""

from __future__ import annotations

import torch

from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.config import load_config
from toolbox.data.prompts import split_groups
from toolbox.rl.advantages import overlong_shaping
from toolbox.rl.batch import PromptRequest
from toolbox.rl.sampling import choose_groups, informative_groups


def test_overlong_shaping_is_zero_before_the_buffer_and_linear_inside_it() -> None:
    lengths = torch.tensor([2, 6, 7, 8])
    shaped = overlong_shaping(lengths, max_len=8, buffer=4, penalty=1.0)
    assert torch.allclose(shaped, torch.tensor([0.0, -0.5, -0.75, -1.0]))
    assert torch.equal(overlong_shaping(lengths, 8, 0, 1.0), torch.zeros(4))


def test_informative_groups_ignore_errored_samples() -> None:
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    ok = torch.tensor([True, True, False, True, True, True])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    # group 0: the only differing sample errored, so its scored rewards are all equal
    assert informative_groups(values, ok, groups) == {0: False, 1: True}


def test_choose_groups_prefers_informative_and_fills_up_to_the_batch() -> None:
    rounds = [{0: False, 1: True, 2: False}, {3: True, 4: False, 5: False}]
    assert choose_groups(rounds, 2) == [1, 3]
    assert choose_groups(rounds, 3) == [0, 1, 3]  # too few informative: an uninformative group keeps the shape


def test_split_groups_keeps_groups_whole() -> None:
    requests = [PromptRequest([1], g) for g in range(3) for _ in range(4)]
    shards = split_groups(requests, 2)
    assert [len(s) for s in shards] == [8, 4]
    for shard in shards:
        for g in {r.group for r in shard}:
            assert sum(r.group == g for r in shard) == 4


def test_variant_experiments_inherit_from_their_base() -> None:
    dapo = load_config(["experiment=dapo_tiny"])
    assert isinstance(dapo.algorithm, GRPOConfig)
    assert dapo.algorithm.dynamic_sampling and dapo.algorithm.loss.clip_high > dapo.algorithm.loss.clip_low
    assert dapo.learner.num_workers == 2 and dapo.task.name == "digit_add"  # from grpo_tiny
    dr = load_config(["experiment=dr_grpo_tiny"])
    assert isinstance(dr.algorithm, GRPOConfig)
    assert (dr.algorithm.advantage, dr.algorithm.loss.agg) == ("group_mean", "seq-mean-token-sum-norm")
    # Each variant's YAML was read: its own fields differ from grpo_tiny's (group_norm, token-mean).
    rloo = load_config(["experiment=rloo_tiny"]).algorithm
    assert isinstance(rloo, GRPOConfig) and (rloo.advantage, rloo.loss.agg) == ("rloo", "seq-mean-token-mean")
    rpp = load_config(["experiment=reinforce_pp_tiny"]).algorithm
    assert isinstance(rpp, GRPOConfig) and (rpp.advantage, rpp.loss.agg) == ("reinforce_pp", "token-mean")
    base = load_config(["experiment=grpo_tiny"]).algorithm
    assert isinstance(base, GRPOConfig) and (base.advantage, base.loss.agg) == ("group_norm", "token-mean")
