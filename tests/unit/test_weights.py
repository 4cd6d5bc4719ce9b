"""`toolbox.rl.weights`: bucketed pack/unpack is bit-exact, zero-copy, and loads a model by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from toolbox.models.loading import load_causal_lm
from toolbox.rl.weights import WeightBucket, load_into, pack_state_dict, unpack_all, unpack_bucket


def mixed_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 5, generator=gen),
        "b.bf16": torch.randn(3, 11, generator=gen).to(torch.bfloat16),
        "c.index": torch.randint(-(2**40), 2**40, (9,), generator=gen),
        "d.scalar": torch.tensor(3.25),
        "e.big": torch.randn(64, 33, generator=gen),
        "f.odd_bf16": torch.randn(5, generator=gen).to(torch.bfloat16),  # 10 bytes: alignment padding follows
        "g.transposed": torch.randn(6, 4, generator=gen).t(),  # not contiguous
        "h.empty": torch.zeros(0, 3),
    }


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_bit_exact(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, src in want.items():
        assert got[name].dtype == src.dtype and got[name].shape == src.shape, name
        assert torch.equal(bits(got[name]), bits(src)), name


@pytest.mark.parametrize("bucket_bytes", [64, 300, 1 << 20])
def test_round_trip_bit_exact(bucket_bytes: int) -> None:
    state = mixed_state()
    buckets = pack_state_dict(state, bucket_bytes)
    if bucket_bytes < 1000:
        assert len(buckets) >= 3
    else:
        assert len(buckets) == 1
    for bucket in buckets:
        assert len(bucket.arrays) == len(bucket.manifest)
        assert all(a.dtype == np.uint8 and a.ndim == 1 for a in bucket.arrays)
        assert bucket.nbytes == sum(spec.nbytes for spec in bucket.manifest)
    assert [spec.name for b in buckets for spec in b.manifest] == list(state)
    assert_bit_exact(unpack_all(buckets), state)


def test_nan_and_inf_survive() -> None:
    state = {"x": torch.tensor([float("nan"), float("inf"), -0.0, 1e-40]), "y": torch.tensor([float("nan")]).bfloat16()}
    assert_bit_exact(unpack_all(pack_state_dict(state)), state)


def test_large_tensor_gets_its_own_bucket() -> None:
    state = {"small": torch.zeros(4), "huge": torch.zeros(1000), "tail": torch.zeros(4)}
    buckets = pack_state_dict(state, bucket_bytes=256)
    assert [[s.name for s in b.manifest] for b in buckets] == [["small"], ["huge"], ["tail"]]


def test_no_copies_on_either_side() -> None:
    state = mixed_state()
    (bucket,) = pack_state_dict(state, 1 << 20)
    views = unpack_bucket(bucket)
    for spec, array in zip(bucket.manifest, bucket.arrays):
        if spec.nbytes == 0:
            continue
        # Unpacked tensors are views of the bucket's arrays ...
        assert views[spec.name].data_ptr() == array.ctypes.data, spec.name
        # ... and a contiguous CPU tensor is packed without a copy.
        if state[spec.name].is_contiguous():
            assert array.ctypes.data == state[spec.name].data_ptr(), spec.name
    # Writing the array shows through the unpacked view.
    i = [s.name for s in bucket.manifest].index("a.weight")
    bucket.arrays[i][:4] = np.frombuffer(np.float32(42.0).tobytes(), dtype=np.uint8)
    assert views["a.weight"][0, 0].item() == 42.0


def test_read_only_arrays_work() -> None:
    state = mixed_state()
    buckets = pack_state_dict(state, 300)
    for bucket in buckets:
        assert not bucket.shared
        for array in bucket.arrays:
            array.setflags(write=False)  # what Ray's zero-copy get returns
        assert bucket.shared
    assert_bit_exact(unpack_all(buckets), state)


def test_unknown_dtype_in_manifest() -> None:
    (bucket,) = pack_state_dict({"x": torch.zeros(2)})
    bad = WeightBucket([dataclasses.replace(bucket.manifest[0], dtype="complex_nonsense")], bucket.arrays)
    with pytest.raises(ValueError, match="unknown dtype 'complex_nonsense'"):
        unpack_bucket(bad)


# ---- loading into a model ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def source_model(tiny_model_dir: Path) -> torch.nn.Module:
    model = load_causal_lm(str(tiny_model_dir))
    with torch.no_grad():  # make it differ from a freshly loaded copy
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return model


def test_load_into_fresh_model_is_bit_exact(tiny_model_dir: Path, source_model: torch.nn.Module) -> None:
    target = load_causal_lm(str(tiny_model_dir))
    state = source_model.state_dict()
    assert any(not torch.equal(v, target.state_dict()[k]) for k, v in state.items())
    buckets = pack_state_dict(state, bucket_bytes=16 << 10)
    assert len(buckets) > 2
    copied = load_into(target, buckets)
    assert copied == sum(v.numel() * v.element_size() for v in state.values())
    assert_bit_exact(target.state_dict(), state)


def test_load_into_from_shared_buckets_then_private_ones(tiny_model_dir: Path, source_model: torch.nn.Module) -> None:
    target = load_causal_lm(str(tiny_model_dir))
    state = {k: v.clone() for k, v in source_model.state_dict().items()}
    shared = pack_state_dict(state, bucket_bytes=16 << 10)
    for bucket in shared:
        for array in bucket.arrays:
            array.setflags(write=False)
    load_into(target, shared)
    assert_bit_exact(target.state_dict(), state)
    # A second sync from private (writeable) buckets must not write into the read-only shared memory.
    frozen = {k: v.clone() for k, v in state.items()}
    newer = {k: v + 1 for k, v in state.items()}
    load_into(target, pack_state_dict(newer, bucket_bytes=16 << 10))
    assert_bit_exact(target.state_dict(), newer)
    assert_bit_exact(unpack_all(shared), frozen)


def test_load_into_missing_weight_names_it(tiny_model_dir: Path, source_model: torch.nn.Module) -> None:
    state = dict(source_model.state_dict())
    name = next(iter(dict(source_model.named_parameters())))
    del state[name]
    with pytest.raises(KeyError, match=name.replace(".", r"\.")):
        load_into(load_causal_lm(str(tiny_model_dir)), pack_state_dict(state))


def test_load_into_unknown_weight_names_it(tiny_model_dir: Path, source_model: torch.nn.Module) -> None:
    state = {**source_model.state_dict(), "extra.head.weight": torch.zeros(2)}
    with pytest.raises(KeyError, match=r"extra\.head\.weight"):
        load_into(load_causal_lm(str(tiny_model_dir)), pack_state_dict(state))


def test_load_into_misshapen_weight_names_it(tiny_model_dir: Path, source_model: torch.nn.Module) -> None:
    state = dict(source_model.state_dict())
    name = "model.norm.weight"
    state[name] = torch.ones(state[name].numel() + 1)
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*shape"):
        load_into(load_causal_lm(str(tiny_model_dir)), pack_state_dict(state))
