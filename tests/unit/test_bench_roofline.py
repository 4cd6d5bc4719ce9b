"""`toolbox bench roofline`'s bound arithmetic against a hand computation, and its step counts from a run's metrics."""

from __future__ import annotations

import pytest

from toolbox.bench._decode_bound import TrafficModel
from toolbox.bench._roofline import Cost, Machine, ModelSize, StepWork, bounds, fractions, phase_costs
from toolbox.bench.roofline import gemm_flops_per_s, step_work, top_ops

# N = 1000 parameters in 4000 bytes, 2 layers of attention width 8, K and V of a cached position 128 bytes.
MODEL = ModelSize(params=1000, layers=2, width=8, traffic=TrafficModel(4000, 128))
# 4 rows of 10 prompt + 6 new tokens, decoded 8 rows at a time (a block of 2 steps), 64 trained tokens of mean
# length 16 in one micro-batch, 2000 bytes synced.
WORK = StepWork(rows=4, prompt_len=10, new_tokens=6, rows_per_call=8, train_tokens=64, train_seq_len=16,
                micro_batches=1, sync_bytes=2000)
MACHINE = Machine(bytes_per_s=1e6, flops_per_s=1e6)


def test_phase_costs_by_hand() -> None:
    costs = phase_costs(MODEL, WORK)
    # prefill: weights read once per engine call, of which this step is half (4 of 8 rows): 2000 bytes;
    #   40 prompt tokens x (2N + 4 L d x mean context 5) = 40 x (2000 + 320) = 92,800 FLOPs.
    # decode: 24 tokens, each reading W / 8 rows = 500 bytes of weights and 13 cached positions x 128 = 1664 bytes
    #   of K and V (mean context 10 + 6 / 2): 24 x 2164 = 51,936 bytes; 24 x (2000 + 4 x 2 x 8 x 13) = 67,968 FLOPs.
    assert costs["generate"] == Cost(2000 + 51_936, 92_800 + 67_968)
    # train: 64 x (6N + 12 L d T) = 64 x (6000 + 3072) FLOPs; 3 weight reads a micro-batch + 7 AdamW passes.
    assert costs["train"] == Cost(4000 * (3 + 7), 64 * 9072)
    assert costs["sync"] == Cost(4000, 0) and costs["score"] == Cost()


def test_bounds_are_each_phases_roof_and_the_steps_is_all_work_together() -> None:
    got = bounds(MACHINE, MODEL, WORK)
    assert got["generate"] == pytest.approx(0.160768)  # compute-bound: 160,768 FLOPs > 53,936 bytes
    assert got["train"] == pytest.approx(0.580608)
    assert got["sync"] == pytest.approx(0.004) and got["score"] == 0.0
    # max(97,936 bytes, 741,376 FLOPs) at 1e6 a second: below the phases' sum (0.745 s), as overlap allows.
    assert got["step"] == pytest.approx(0.741376)


def test_fraction_is_bound_over_measured_and_none_without_a_roof() -> None:
    bound = bounds(MACHINE, MODEL, WORK)
    got = fractions(bound, {"generate": 0.321536, "score": 0.1, "step": 1.482752})
    assert got["generate"] == pytest.approx(0.5) and got["step"] == pytest.approx(0.5) and got["score"] is None


def test_step_work_from_a_runs_metrics() -> None:
    history = [{"samples": 8.0, "sampled_tokens": 512.0, "train_tokens": 640.0, "train_seq_len": 80.0}] * 3
    work = step_work(history, MODEL, steps_per_generation=4, micro_batch=3)
    assert (work.rows, work.new_tokens, work.prompt_len, work.rows_per_call) == (8, 64.0, 16.0, 32)
    assert (work.micro_batches, work.sync_bytes) == (3, 1000.0)  # one sync of 4000 bytes a block of 4 steps


def test_gemm_throughput_is_measured_at_a_tiny_size() -> None:
    assert gemm_flops_per_s(64, "float32", repeats=1) > 1e6


def test_the_profile_names_the_op_that_dominates() -> None:
    import torch

    a = torch.randn(256, 256)
    ops = top_ops(lambda: a @ a @ a, threads=1)
    assert ops[0][0] == "aten::mm" and ops[0][2] == "2"


def test_tables_show_both_roofs_and_an_untimed_sync() -> None:
    from toolbox.bench.roofline import tables

    phases = ("generate", "score", "train", "sync", "step")
    result = {"model": "medium", "params": 25e6, "profile": {}, "settings": "s",
              "work": {"rows": 8, "new_tokens": 64.0, "prompt_len": 4.0, "rows_per_call": 32},
              "measured_s": dict(zip(phases, (1.0, 0.01, 1.5, 0.0, 1.5))),
              "bound_s": dict(zip(phases, (0.05, 0.0, 0.15, 0.001, 0.2))),
              "fraction": dict(zip(phases, (0.05, None, 0.1, None, 0.13))),
              "fraction_fp32": dict(zip(phases, (0.2, None, 0.45, None, 0.55)))}
    machine = {"bytes_per_s": 3.7e10, "gemm_fp32": 1.3e11, "gemm_bf16": 6e11}
    step = tables(machine, [result])[1]
    rows = {row[0]: row for row in step.rows}
    assert rows["score"][3] == "no roof" and rows["sync"][3] == "not timed"
    assert rows["step"][3:] == ["0.13", "0.55"] and rows["score"][4] == "-"
