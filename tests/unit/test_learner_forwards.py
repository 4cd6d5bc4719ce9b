"""The RL learners' forwards (`toolbox.learner.packed`, no Ray): packed rows give the padded numbers, no forward is
wasted, and packed ranks dealt by tokens make the update of one rank.

Not covered: packing on GPU attention kernels (tests/gpu), multi-turn rows (their masks are prefixes too).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.unit.learner_steps import assert_same_update, online_step, spawn_two_gloo_ranks
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.algorithms.ppo.learner import PPOLearner
from toolbox.learner.config import LearnerConfig
from toolbox.learner.packed import RowForwards, balanced_shares
from toolbox.learner.row_packing import pack_rows
from toolbox.models.logprobs import token_logprobs
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch

ROWS, PROMPT, RESPONSE = 8, 6, 7


def _batch(seed: int = 0, rows: int = ROWS, vocab: int = 12, shared: bool = False) -> RolloutBatch:
    """Prompts of 2..PROMPT tokens (left-padded), responses of 1..RESPONSE (right-padded), groups of 2; ``shared``:
    a group's two rows have the same prompt (as GRPO's samples of one prompt do)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.randint(2, PROMPT + 1, (rows,), generator=gen)
    r = torch.randint(1, RESPONSE + 1, (rows,), generator=gen)
    ids = torch.randint(3, vocab, (rows, PROMPT), generator=gen)
    if shared:
        p, ids = p[::2].repeat_interleave(2), ids[::2].repeat_interleave(2, dim=0)
    pm = (torch.arange(PROMPT) >= PROMPT - p[:, None]).long()
    rm = (torch.arange(RESPONSE) < r[:, None]).long()
    return RolloutBatch(ids * pm, pm,
                        torch.randint(3, vocab, (rows, RESPONSE), generator=gen) * rm, rm, torch.zeros(rows, RESPONSE),
                        torch.arange(rows) // 2, torch.zeros(rows, dtype=torch.long))


def _rewards(rows: int = ROWS) -> RewardResult:
    return RewardResult(torch.tensor([1.0, 0.0] * (rows // 2)), torch.zeros(rows, dtype=torch.long), [""] * rows)


def _grpo(model_dir: Path, packing: bool, strategy: str = "single", workers: int = 1, micro: int = 2,
          share: bool = True, **algo: object) -> GRPOLearner:
    cfg = LearnerConfig(num_workers=workers, strategy=strategy, device="cpu", micro_batch_size=micro, packing=packing,
                        share_prompts=share, optim={"lr": 1e-3, "scheduler": "constant", "max_grad_norm": 100.0})
    torch.manual_seed(0)
    return GRPOLearner(str(model_dir), "float32", cfg, GRPOConfig(prompts_per_step=ROWS // 2, group_size=2, **algo),
                       total_steps=3)


def _count_forwards(module: nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_packed_rows_give_the_padded_logprobs_and_values(tiny_model_dir: Path) -> None:
    learner = PPOLearner(str(tiny_model_dir), "float32", LearnerConfig(num_workers=1, strategy="single"),
                         PPOConfig(prompts_per_step=ROWS), total_steps=1)
    with torch.no_grad():
        learner.critic.module.head.weight.normal_()  # a zero head would make every value 0 either way
    batch = _batch()
    batch.response_mask_BR[5] = 0  # a row out of the loss (an errored sample): packing leaves it out
    padded, packed = RowForwards(False, 0.7), RowForwards(True, 0.7)
    torch.testing.assert_close(packed.logprobs(learner.policy.model, batch),
                               padded.logprobs(learner.policy.model, batch), atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.values(learner.critic.module, batch), padded.values(learner.critic.module, batch),
                               atol=1e-5, rtol=0)
    real = int(batch.prompt_mask_BP.sum() + batch.response_mask_BR.sum())
    assert padded.real == 2 * real and packed.real == 2 * (real - int(batch.prompt_mask_BP[5].sum()))
    assert packed.slots < padded.slots == 2 * ROWS * (PROMPT + RESPONSE)
    # Every response token is read where it is predicted, and the packed rows hold only the rows' real tokens.
    rows = pack_rows(batch)
    assert len(rows.labels_N) == int(batch.response_mask_BR.sum())
    assert int((rows.inputs.doc_ids_BT > 0).sum()) == packed.real // 2 and rows.inputs.documents() == ROWS - 1


def test_rows_sharing_a_prompt_hold_it_once_and_give_the_padded_numbers(tiny_model_dir: Path) -> None:
    """Groups of 2 rows with one prompt: packed with shared prompts, each prompt is laid out once per unit, each
    response sees its prompt and not its sibling, and log-probs, values and the gradients through them equal the
    padded forward's. A row length too short for a whole group splits it into units of their own."""
    learner = PPOLearner(str(tiny_model_dir), "float32", LearnerConfig(num_workers=1, strategy="single"),
                         PPOConfig(prompts_per_step=ROWS), total_steps=1)
    model = learner.policy.model
    with torch.no_grad():
        learner.critic.module.head.weight.normal_()
    batch = _batch(shared=True)
    batch.response_mask_BR[5] = 0  # out of the loss: its group's unit holds its sibling alone
    padded, shared = RowForwards(False, 0.7), RowForwards(True, 0.7, share_prompts=True)
    logp_pad, logp_shared = padded.logprobs(model, batch), shared.logprobs(model, batch)
    torch.testing.assert_close(logp_shared, logp_pad, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared.values(learner.critic.module, batch), padded.values(learner.critic.module, batch),
                               atol=1e-5, rtol=0)
    grads = []
    for logp in (logp_pad, logp_shared):
        model.zero_grad()
        (logp * torch.linspace(-1, 1, logp.numel()).reshape(logp.shape)).sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    rows = pack_rows(batch, share_prompts=True)
    prompts = batch.prompt_mask_BP.sum(1)
    assert rows.allowed is not None and rows.inputs.documents() == ROWS // 2
    assert int((rows.inputs.doc_ids_BT > 0).sum()) == int(prompts[::2].sum() + batch.response_mask_BR.sum())
    assert shared.real < padded.real and len(rows.labels_N) == int(batch.response_mask_BR.sum())
    # The first group's unit: its prompt, row 0's response, row 1's; row 1's first token sees the prompt and itself,
    # not row 0's tokens.
    row, last_prompt = int(rows.at_N[0][0]), int(rows.at_N[1][0])
    first_1 = last_prompt + 1 + int(batch.response_mask_BR[0].sum())
    assert rows.at_N[1][int(batch.response_mask_BR[0].sum())] == last_prompt  # both first tokens: the prompt predicts
    assert rows.allowed[row, first_1, last_prompt] and rows.allowed[row, first_1, first_1]
    assert not rows.allowed[row, first_1, last_prompt + 1]
    longest = int((prompts + batch.response_mask_BR.sum(1)).max())
    short = pack_rows(batch, share_prompts=True, row_length=longest)
    assert short.inputs.documents() > rows.inputs.documents()
    with torch.no_grad():
        logits = model(**short.model_inputs()).logits
    logp_short = short.to_BR(token_logprobs(short.take(logits).unsqueeze(0), short.labels_N.unsqueeze(0), 0.7)[0])
    torch.testing.assert_close(logp_short, logp_pad.detach(), atol=1e-5, rtol=0)


def test_shared_prompts_need_an_attention_that_takes_a_4d_mask(tiny_model_dir: Path) -> None:
    """flash or flex attention, or a sliding window: each sequence keeps its prompt; a forward that drops the mask
    is refused at start, naming the switch."""
    from toolbox.learner.packed import check_shared_prompts, shared_prompts_unsupported
    from toolbox.models.loading import load_causal_lm

    model = load_causal_lm(str(tiny_model_dir), "float32")
    assert shared_prompts_unsupported(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "takes no 4-D mask" in str(shared_prompts_unsupported(model))
    model.config._attn_implementation = "sdpa"
    model.config.sliding_window, model.config.use_sliding_window = 4, True
    assert shared_prompts_unsupported(model) == "sliding-window attention"
    model.config.sliding_window = None

    class DropsMask(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.config = model, model.config

        def forward(self, **kwargs: object) -> object:
            return self.inner(**{**kwargs, "attention_mask": None})

    check_shared_prompts(model, 12, RowForwards(True, 1.0, share_prompts=True))
    with pytest.raises(RuntimeError, match="learner.share_prompts=false"):
        check_shared_prompts(DropsMask(), 12, RowForwards(True, 1.0, share_prompts=True))


def test_packing_leaves_a_batch_with_little_padding_padded(tiny_model_dir: Path) -> None:
    """Full-length responses and prompts (the benchmark's fixed-length completions): packed rows would save under
    20% of the slots, so the forward runs padded, with the same numbers."""
    from toolbox.models.loading import load_causal_lm

    model = load_causal_lm(str(tiny_model_dir), "float32")
    batch = _batch()
    batch.prompt_mask_BP[:, 1:] = 1  # at least 5 of 6 prompt tokens and every response token real
    batch.response_mask_BR[:] = 1
    padded, packed = RowForwards(False, 1.0), RowForwards(True, 1.0)
    with torch.no_grad():
        torch.testing.assert_close(packed.logprobs(model, batch), padded.logprobs(model, batch), atol=1e-5, rtol=0)
    real = int(batch.prompt_mask_BP.sum() + batch.response_mask_BR.sum())
    assert (packed.real, packed.slots) == (padded.real, padded.slots) == (real, ROWS * 13)
    batch.response_mask_BR[:, 2:] = 0  # now most of the padded layout is padding: packed
    packed.reset()  # the next update (within one, the rows are not changed and their layout is remembered)
    packed.logprobs(model, batch)
    assert packed.slots - ROWS * 13 < (ROWS * 13) * 0.8


def test_packing_refuses_a_response_mask_with_holes() -> None:
    batch = _batch()
    batch.response_mask_BR[3] = torch.tensor([1, 0, 1, 0, 0, 0, 0])
    with pytest.raises(ValueError, match=r"response rows \[3\] have a response_mask that is not a prefix"):
        pack_rows(batch)


def test_balanced_shares_deal_equal_rows_and_about_equal_tokens() -> None:
    batch = _batch(rows=16)
    lengths = batch.prompt_mask_BP.sum(1) + batch.response_mask_BR.sum(1)
    shares = balanced_shares(batch, 2)
    assert [len(s) for s in shares] == [8, 8]
    assert sorted(torch.cat(shares).tolist()) == list(range(16))
    assert all(torch.equal(s, s.sort().values) for s in shares)
    sums = [int(lengths[s].sum()) for s in shares]
    assert abs(sums[0] - sums[1]) <= int(lengths.max()), sums
    assert torch.equal(balanced_shares(batch, 1)[0], torch.arange(16))  # one rank: the plan is unchanged
    with pytest.raises(ValueError, match="16 rows does not split evenly over 3 learner ranks"):
        balanced_shares(batch, 3)


def test_shared_prompts_deal_whole_groups_to_ranks() -> None:
    """Each group's rows on one rank (their prompt shared there), equal row counts, token sums (a prompt counted
    once per group) within one group's weight; uneven groups fall back to dealing rows."""
    batch = _batch(rows=16, shared=True)
    shares = balanced_shares(batch, 2, by_group=True)
    assert [len(s) for s in shares] == [8, 8] and sorted(torch.cat(shares).tolist()) == list(range(16))
    groups = [set(batch.group_B[s].tolist()) for s in shares]
    assert not groups[0] & groups[1], "a group was split across ranks"
    weight = lambda rows: int(batch.prompt_mask_BP[rows[::2]].sum() + batch.response_mask_BR[rows].sum())  # noqa: E731
    heaviest = max(weight(torch.tensor([2 * g, 2 * g + 1])) for g in range(8))
    assert abs(weight(shares[0]) - weight(shares[1])) <= heaviest
    batch.group_B[0] = 7  # groups of 1, 2 and 3 rows: dealt by rows
    assert [torch.equal(a, b) for a, b in zip(balanced_shares(batch, 2, by_group=True), balanced_shares(batch, 2),
                                                strict=True)] == [True, True]


@pytest.mark.parametrize("minis, kl, policy_forwards", [(1, 0.0, 4), (2, 0.0, 4 + 4), (1, 0.1, 4)])
def test_grpo_runs_no_wasted_forward(tiny_model_dir: Path, minis: int, kl: float, policy_forwards: int) -> None:
    """8 rows in micro-batches of 2: one training forward per micro-batch; the old log-probs' no-grad pass only
    when there is more than one optimizer step per update; the reference only with a KL term."""
    learner = _grpo(tiny_model_dir, packing=False, mini_batches=minis, kl_coef=kl)
    calls = _count_forwards(learner.policy.model)
    assert (learner.policy.ref is None) == (kl == 0)
    ref_calls = None if learner.policy.ref is None else _count_forwards(learner.policy.ref)
    online_step(learner, [_batch()], [_rewards()])
    assert calls[0] == policy_forwards
    assert ref_calls is None or ref_calls[0] == 4


def test_a_micro_batch_is_packed_once_per_update(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a KL term the reference's forward and the training pass read the same micro-batches: each is laid out
    once (the check at start packs once more)."""
    import toolbox.learner.packed as packed_module

    calls = []
    real_pack = packed_module.pack_rows
    monkeypatch.setattr(packed_module, "pack_rows", lambda *a, **k: calls.append(1) or real_pack(*a, **k))
    learner = _grpo(tiny_model_dir, packing=True, micro=4, kl_coef=0.1)
    calls.clear()
    online_step(learner, [_batch(shared=True)], [_rewards()])
    assert len(calls) == ROWS // 4
    online_step(learner, [_batch(seed=1, shared=True)], [_rewards()])
    assert len(calls) == 2 * ROWS // 4  # a new update lays its rows out anew


def test_ppo_takes_old_logprobs_from_the_training_pass_with_one_epoch(tiny_model_dir: Path) -> None:
    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=2)
    learner = PPOLearner(str(tiny_model_dir), "float32", cfg, PPOConfig(prompts_per_step=ROWS, kl_coef=0.0, ppo_epochs=1),
                         total_steps=1)
    policy, critic = _count_forwards(learner.policy.model), _count_forwards(learner.critic.module)
    online_step(learner, [_batch()], [_rewards()])
    assert learner.policy.ref is None
    assert policy[0] == 4, "a no-grad pass for the old log-probs came back"
    assert critic[0] == 8  # old values (GAE needs them before the loss) + the training pass


@pytest.mark.parametrize("shared", [False, True])
def test_packing_does_not_change_the_grpo_update(tiny_model_dir: Path, shared: bool) -> None:
    """Micro-batches of 4 rows: with ``shared``, each holds two groups whose rows share their prompt."""
    padded, packed = (_grpo(tiny_model_dir, packing, micro=4, kl_coef=0.1, mini_batches=2)
                      for packing in (False, True))
    m_pad = online_step(padded, [_batch(shared=shared)], [_rewards()])
    m_pack = online_step(packed, [_batch(shared=shared)], [_rewards()])
    for key in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm"):
        assert m_pack[key] == pytest.approx(m_pad[key], rel=1e-4, abs=1e-6), key
    assert m_pack["pad_frac"] < m_pad["pad_frac"]
    # Adam's first steps move a weight by about lr (1e-3) whatever its gradient's size, so float rounding of a
    # near-zero gradient can show as a few percent of lr.
    a, b = padded.policy.full_state_dict(), packed.policy.full_state_dict()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=5e-5, rtol=0)


def _packed_rank(rank: int, model_dir: str, out: str) -> None:
    learner = _grpo(Path(model_dir), True, strategy="fsdp2", workers=2)
    shards, results = _batch(rows=2 * ROWS, shared=True).split(2), [_rewards(), _rewards()]
    plan = learner.plan(shards, results)  # every rank plans alike (rank 0 alone does in a run)
    metrics = learner.update(plan, {i: shards[i] for i in plan.shards_for(rank)})
    state = learner.policy.full_state_dict()
    if rank == 0:
        torch.save(state, Path(out).with_suffix(".pt"))
        Path(out).write_text(json.dumps({"metrics": metrics, "rows": [r.tolist() for r in plan.rank_rows]}))


def test_two_packed_ranks_dealt_by_tokens_make_the_one_rank_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    spawn_two_gloo_ranks(_packed_rank, tiny_model_dir, out)
    got = json.loads(out.read_text())
    assert got["rows"] != [list(range(ROWS)), list(range(ROWS, 2 * ROWS))], "the rows were not dealt by tokens"
    one = _grpo(tiny_model_dir, packing=False)
    metrics = online_step(one, [_batch(rows=2 * ROWS, shared=True)], [RewardResult.concat([_rewards(), _rewards()])])
    for key in ("grad_norm", "reward"):  # the loss metric is rank 0's share
        assert got["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    two = torch.load(out.with_suffix(".pt"))
    assert_same_update(two, one.policy.full_state_dict())


def test_learner_step_bench_times_every_side(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.bench import learner_step

    monkeypatch.setitem(learner_step.CASES, "nano", learner_step.Case((16, 1, 2, 1, 32), 16, 4, 2, (2, 4), (1, 6), 4, 0.0))
    got = learner_step.measure("nano", rounds=1, steps=1)
    assert got["padded_s"] > 0 and got["packed_s"] > 0 and got["shared_s"] > 0
    assert got["pad_frac_packed"] < got["pad_frac_padded"]
