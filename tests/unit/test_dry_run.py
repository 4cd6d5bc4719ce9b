"""`toolbox run ... --dry-run`: the plan of a run, printed without Ray, a run directory or weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from toolbox.commands.run import main as run_main
from toolbox.config import load_config
from toolbox.driver import dry_run, memory_estimate, model_shape


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.setenv("COLUMNS", "200")
    inits: list[object] = []  # the suite's integration tests may have left a Ray instance up: watch ray.init
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)))
    root = tmp_path / "runs"
    code = run_main(["experiment=grpo_tiny_fsdp2", f"trainer.run_root={root}", "learner.micro_batch_size=16", "--dry-run"])

    out = capsys.readouterr().out
    assert code == 0
    assert not inits
    assert not root.exists()  # no run directory, no tiny model written under it
    assert re.search(r"learner\.micro_batch_size\s+│ 16\s", out)  # the diff from the defaults
    assert re.search(r"learner\s+│ LearnerWorker\s+│ 2\s+│ 0.5 CPU\s+│ 2 x \{CPU: 0.5\}, PACK", out)
    assert "128 / 2 ranks = 64 rollouts" in out and "64 / micro_batch_size 16 = 4" in out
    assert "total on cpu" in out


def test_the_parameter_count_matches_the_built_model(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    from_path = model_shape.model_shape(load_config([f"model.path={tiny_model_dir}", "model.tiny=null"]))
    from_tiny = model_shape.model_shape(load_config([]))  # the default tiny model, from its config alone

    assert from_path.params == from_tiny.params == sum(p.numel() for p in model.parameters())
    assert from_path.block_params == sum(p.numel() for p in model.model.layers[0].parameters())


def memory(*overrides: str) -> dict[str, memory_estimate.MemoryLine]:
    cfg = load_config(["experiment=grpo_tiny_fsdp2", *overrides])
    return {line.what: line for line in memory_estimate.memory_lines(cfg, model_shape.model_shape(cfg))}


def test_memory_follows_sharding_precision_and_offload() -> None:
    params = model_shape.model_shape(load_config(["experiment=grpo_tiny_fsdp2"])).params

    fsdp = memory("learner.num_workers=2")
    assert fsdp["parameters"].bytes == params * 4 / 2
    assert fsdp["optimizer state (AdamW)"].bytes == 2 * params * 4 / 2
    assert "frozen reference" in fsdp  # grpo_tiny_fsdp2 has a KL term
    ddp = memory("learner.strategy=ddp", "learner.num_workers=2", "algorithm.kl_coef=0")
    assert ddp["parameters"].bytes == params * 4 and "frozen reference" not in ddp
    assert "gathered blocks (FSDP2)" not in ddp
    bf16 = memory("learner.mixed_precision=bf16", "learner.gpus_per_worker=1", "learner.offload=optimizer")
    assert bf16["gathered blocks (FSDP2)"].bytes == fsdp["gathered blocks (FSDP2)"].bytes / 2
    assert bf16["gradients"].where == "host (offload)" and bf16["activations (one micro-batch)"].where == "cuda"
    checkpointed = memory("learner.activation_checkpointing=true")
    assert checkpointed["activations (one micro-batch)"].bytes < fsdp["activations (one micro-batch)"].bytes


def test_batch_arithmetic_of_each_family() -> None:
    sft = dict(dry_run.batch_rows(load_config(["experiment=sft_tiny"])))
    assert sft["per learner rank"] == "64 / 2 ranks = 32 records"
    env = dict(dry_run.batch_rows(load_config(["experiment=ppo_cartpole"])))
    assert env["env steps per step"] == "2 runners x 4 envs x 128 = 1024"
    ppo = dict(dry_run.batch_rows(load_config(["experiment=ppo_tiny", "algorithm.mini_batches=2",
                                               "learner.micro_batch_size=8"])))
    assert ppo["optimizer steps per step"] == "2 epochs x 2 mini-batches = 4"
    assert ppo["micro-batches (grad. accumulation)"] == "16 / micro_batch_size 8 = 2"
    online_dpo = dict(dry_run.batch_rows(load_config(["experiment=online_dpo_tiny", "algorithm.prompts_per_step=8",
                                                      "learner.micro_batch_size=2"])))
    assert online_dpo["preference pairs per step"] == "one per group = 8"  # DPO trains on pairs, not rollouts
    assert online_dpo["micro-batches (grad. accumulation)"] == "4 / micro_batch_size 2 = 2"


def test_actors_follow_the_algorithm_roles() -> None:
    rows = dry_run.actor_rows(load_config(["experiment=ppo_cartpole", "env.num_workers=3"]))
    assert [(r[0], r[2]) for r in rows] == [("env", "3"), ("learner", "1")]
    local = dry_run.actor_rows(load_config(["experiment=sft_tiny", "ray.local_mode=true", "learner.num_workers=1",
                                            "learner.strategy=single"]))
    assert local[0][4] == "in-process (ray.local_mode)"


def test_an_unreadable_model_path_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-model"
    code = run_main([f"model.path={missing}", "model.tiny=null", "--dry-run"])

    assert code == 2
    assert f"model.path: cannot load a model config from '{missing}'" in capsys.readouterr().err


def test_a_cold_start_is_listed_and_not_trained(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    root = tmp_path / "runs"
    assert run_main(["experiment=grpo_tool_calc_tiny", f"trainer.run_root={root}", "--dry-run"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "model.cold_start: experiment sft_tool_calc_tiny" in out and "runs first" in out
    assert not root.exists()


QWEN_7B_ON_8 = ["experiment=grpo_tiny_fsdp2", "model.path=Qwen/Qwen2.5-7B-Instruct", "model.tiny=null",
                "learner.num_workers=8", "learner.strategy=fsdp2", "learner.gpus_per_worker=1",
                "learner.mixed_precision=bf16", "learner.micro_batch_size=2",
                "rollout.engine.name=vllm", "rollout.gpus_per_worker=1", "rollout.num_workers=8"]


def test_published_architecture_is_planned_without_the_hub() -> None:
    shape = model_shape.model_shape(load_config(QWEN_7B_ON_8))
    assert round(shape.params / 1e9, 2) == 7.62 and shape.source.endswith("(published architecture)")
    assert (shape.layers, shape.kv_dim, shape.intermediate) == (28, 512, 18944)
    assert shape.root_params == 2 * 152064 * 3584 + 3584  # embeddings, LM head (not tied), final norm


def test_memory_at_real_size_root_group_sdpa_and_offloaded_reference() -> None:
    lines = memory(*QWEN_7B_ON_8[1:])
    root = lines["root group (embeddings, LM head)"]
    assert root.where == "cuda" and root.bytes == (2 * 152064 * 3584 + 3584) * (2 + 2 + 4)  # bf16 x2 + fp32 reduce
    assert lines["frozen reference"].where == "host (offload)"  # FSDP2's CPU offload of the reference on a GPU
    sdpa = lines["activations (one micro-batch)"].bytes
    shape = model_shape.model_shape(load_config(QWEN_7B_ON_8))
    eager = memory_estimate.activation_line(load_config(QWEN_7B_ON_8), model_shape.ModelShape(
        **{**shape.__dict__, "attention": "eager"}), 2).bytes
    seq, rows = memory_estimate.sequence_length(load_config(QWEN_7B_ON_8), shape)[0], 2
    assert eager - sdpa == shape.layers * rows * seq * 2 * 2 * shape.heads * seq  # scores + softmax, kept by eager only


def test_engine_line_holds_weights_and_kv_cache_at_its_utilization() -> None:
    from toolbox.driver.gpu_plan import engine_memory, gpu_plan, kv_bytes_per_token

    cfg = load_config(QWEN_7B_ON_8)
    shape = model_shape.model_shape(cfg)
    assert kv_bytes_per_token(shape, 2) == 56 * 1024  # Qwen2.5-7B, bf16
    engine = engine_memory(cfg, shape, 80 * memory_estimate.GiB)
    assert engine is not None and engine.weights == shape.params * 2  # rollout.dtype auto: bf16, not model.dtype
    assert engine.reserved == 0.5 * 80 * memory_estimate.GiB and engine.kv_tokens > 0
    assert gpu_plan(cfg, shape).fits
    tight = load_config([*QWEN_7B_ON_8, "rollout.engine.gpu_memory_utilization=0.2"])
    assert "less than one sequence" in " ".join(gpu_plan(tight, shape).problems)
    colocated = load_config([*QWEN_7B_ON_8, "learner.gpus_per_worker=0.5", "rollout.gpus_per_worker=0.5",
                             "rollout.placement=colocate", "rollout.engine.enable_sleep_mode=true",
                             "rollout.engine.gpu_memory_utilization=0.9"])
    assert "generating: the engine's 72.0 GiB beside the learner's" in " ".join(gpu_plan(colocated, shape).problems)


@pytest.mark.parametrize("experiment", ["rm_tiny", "dpo_tiny"])
def test_a_pair_algorithm_counts_both_rows_of_each_pair(experiment: str) -> None:
    """A micro-batch of m pairs is one forward of 2m rows (chosen, then rejected), reward model as DPO."""
    cfg = load_config([f"experiment={experiment}", "learner.micro_batch_size=4"])
    line = memory_estimate.activation_line(cfg, model_shape.model_shape(cfg), 4)
    assert line.how.startswith("8 rows x ")
    assert dict(dry_run.batch_rows(cfg))["model rows per example"] == "2 (a pair: chosen and rejected)"
