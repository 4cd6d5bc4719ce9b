"""`toolbox.rl.batch.RolloutBatch`: select, split/concat round trips, re-padding, validation."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, RolloutBatch

PAD = 0


def make_batch(rows: int, p: int, r: int, seed: int = 0, extras: bool = True) -> RolloutBatch:
    """Left-padded prompts and right-padded responses of random lengths, ids >= 1 so padding is visible."""
    gen = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, p + 1, (rows,), generator=gen)
    r_len = torch.randint(0, r + 1, (rows,), generator=gen)
    p_mask = (torch.arange(p).flip(0).unsqueeze(0) < p_len.unsqueeze(1)).long()
    r_mask = (torch.arange(r).unsqueeze(0) < r_len.unsqueeze(1)).long()
    return RolloutBatch(
        prompt_ids_BP=torch.randint(1, 50, (rows, p), generator=gen) * p_mask,
        prompt_mask_BP=p_mask,
        response_ids_BR=torch.randint(1, 50, (rows, r), generator=gen) * r_mask,
        response_mask_BR=r_mask,
        logprobs_BR=-torch.rand(rows, r, generator=gen) * r_mask,
        group_B=torch.arange(rows) // 2,
        finish_B=torch.where(r_len < r, FINISH_STOP, FINISH_LENGTH),
        extras=[{"answer": str(seed * 100 + i)} for i in range(rows)] if extras else [],
    )


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def test_select_slice_and_index() -> None:
    batch = make_batch(6, 4, 5)
    part = batch.select(slice(1, 4))
    assert len(part) == 3 and torch.equal(part.response_ids_BR, batch.response_ids_BR[1:4])
    assert part.extras == batch.extras[1:4]
    picked = batch.select(torch.tensor([5, 0]))
    assert torch.equal(picked.prompt_ids_BP, batch.prompt_ids_BP[[5, 0]])
    assert picked.extras == [batch.extras[5], batch.extras[0]]
    assert batch.select(slice(0, 2)).response_lengths_B.tolist() == batch.response_mask_BR[:2].sum(1).tolist()


def test_select_without_extras() -> None:
    batch = make_batch(4, 3, 3, extras=False)
    assert batch.select(slice(0, 2)).extras == []


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_split_concat_round_trip_is_exact(n: int) -> None:
    batch = make_batch(7, 4, 6)
    shards = batch.split(n)
    assert len(shards) == n
    sizes = [len(s) for s in shards]
    assert sum(sizes) == 7 and max(sizes) - min(sizes) <= 1
    assert_same(RolloutBatch.concat(shards), batch)


def test_split_more_shards_than_rows_and_bad_n() -> None:
    shards = make_batch(2, 3, 3).split(4)
    assert [len(s) for s in shards] == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="0 shards"):
        make_batch(2, 3, 3).split(0)


def test_concat_repads_different_widths() -> None:
    a, b = make_batch(3, 2, 3, seed=1), make_batch(2, 5, 6, seed=2)
    out = RolloutBatch.concat([a, b], pad_id=PAD)
    assert out.prompt_ids_BP.shape == (5, 5) and out.response_ids_BR.shape == (5, 6)
    # Prompts gain padding on the left, responses on the right; masks and logprobs pad with 0.
    assert torch.equal(out.prompt_ids_BP[:3, 3:], a.prompt_ids_BP)
    assert (out.prompt_ids_BP[:3, :3] == PAD).all() and (out.prompt_mask_BP[:3, :3] == 0).all()
    assert torch.equal(out.response_ids_BR[:3, :3], a.response_ids_BR)
    assert (out.response_mask_BR[:3, 3:] == 0).all() and (out.logprobs_BR[:3, 3:] == 0).all()
    assert out.extras == a.extras + b.extras
    # Token content per row is unchanged: the real (masked) tokens are the same sequences.
    for src, row in ((a, 0), (a, 2), (b, 1)):
        i = row if src is a else 3 + row
        assert out.prompt_ids_BP[i][out.prompt_mask_BP[i].bool()].tolist() == src.prompt_ids_BP[row][src.prompt_mask_BP[row].bool()].tolist()
        assert out.response_ids_BR[i][out.response_mask_BR[i].bool()].tolist() == src.response_ids_BR[row][src.response_mask_BR[row].bool()].tolist()
    # Splitting back gives the originals, re-padded to the common width.
    back = out.split(2)
    assert torch.equal(back[0].response_ids_BR[:, :3], a.response_ids_BR[:3])
    assert_same(RolloutBatch.concat(back), out)


def test_concat_custom_pad_id() -> None:
    out = RolloutBatch.concat([make_batch(1, 1, 1, seed=3), make_batch(1, 3, 2, seed=4)], pad_id=99)
    assert out.prompt_ids_BP[0, :2].tolist() == [99, 99] and out.response_ids_BR[0, 1].item() == 99


def test_concat_nothing() -> None:
    with pytest.raises(ValueError, match="concat of no batches"):
        RolloutBatch.concat([])


def test_validation_names_the_mismatched_field() -> None:
    b = make_batch(3, 2, 2)
    with pytest.raises(ValueError, match=r"RolloutBatch\.logprobs_BR has 2 rows, expected 3"):
        RolloutBatch(b.prompt_ids_BP, b.prompt_mask_BP, b.response_ids_BR, b.response_mask_BR, b.logprobs_BR[:2],
                     b.group_B, b.finish_B, b.extras)
    with pytest.raises(ValueError, match=r"RolloutBatch\.extras has 1 rows, expected 3"):
        RolloutBatch(b.prompt_ids_BP, b.prompt_mask_BP, b.response_ids_BR, b.response_mask_BR, b.logprobs_BR,
                     b.group_B, b.finish_B, b.extras[:1])


def test_rows_of_several_steps_come_apart_as_if_generated_alone() -> None:
    """`split_rows` (a rollout worker's `generate_steps`): the parts of one engine call's batch, trimmed to their own
    widths, concatenate back (re-padded) to the whole, and share its seconds by rows."""
    from toolbox.actors.rollout import split_rows

    parts = [make_batch(3, 2, 3, seed=1), make_batch(5, 6, 7, seed=2)]
    whole = RolloutBatch.concat(parts)
    first, second = split_rows(whole, [3, 5], seconds=8.0)
    assert (first.seconds, second.seconds) == (3.0, 5.0)
    for part, alone in zip((first, second), parts):
        assert int(part.prompt_mask_BP[:, 0].max()) == 1 and int(part.response_mask_BR[:, -1].max()) == 1
        assert part.prompt_ids_BP.shape[1] <= alone.prompt_ids_BP.shape[1]
    again = RolloutBatch.concat([first, second])
    assert again.seconds == 5.0  # a concatenation keeps the longest
    again.seconds = whole.seconds
    assert_same(again.trimmed(), whole.trimmed())
    assert whole.select(slice(0, 0)).trimmed().response_ids_BR.shape == (0, 0)
    assert len(split_rows(whole, [8], 1.0)[0]) == 8
