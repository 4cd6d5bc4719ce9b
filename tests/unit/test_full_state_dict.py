"""`toolbox.learner.strategy.full_state_dict` on two FSDP2 gloo ranks: its one-collective gather of the shards gives
exactly what DCP's `get_model_state_dict` gives, uneven shards included (a tensor of one row leaves rank 1 empty)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.unit.learner_steps import spawn_two_gloo_ranks


def _rank(rank: int, model_dir: str, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from toolbox.learner.strategy import _gather_cpu_shards, full_state_dict
    from toolbox.models.loading import load_causal_lm

    model = load_causal_lm(model_dir)
    model.register_parameter("odd", torch.nn.Parameter(torch.arange(3.0).view(1, 3)))  # 1 row on 2 ranks
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ours = full_state_dict(model)
    assert _gather_cpu_shards(model.state_dict()) is not None  # the fast path, not DCP's
    theirs = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"ours": ours, "theirs": dict(theirs)}, out)
    else:
        assert ours == {}


def test_one_gather_equals_dcp(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "state.pt"
    spawn_two_gloo_ranks(_rank, tiny_model_dir, out)
    got = torch.load(out)
    ours, theirs = got["ours"], got["theirs"]
    assert sorted(ours) == sorted(theirs) and "odd" in ours
    for name, value in theirs.items():
        assert ours[name].shape == value.shape and torch.equal(ours[name], value), name
    assert torch.equal(ours["odd"], torch.arange(3.0).view(1, 3))
