"""The TRL side of the GRPO benchmark: ``trl.GRPOTrainer`` on CPU with the benchmark's model, prompts and reward.

Settings mirror toolbox's (see `toolbox.bench._grpo_vs_trl`): ``use_cpu``, fp32 (``bf16=False``), no
gradient checkpointing, ``beta=0`` (no reference model), one optimizer step per generation batch of
``prompts x group`` completions, AdamW at a constant ``lr``, gradient clip 1.0, temperature 1, and
``min_new_tokens = max_completion_length`` so every completion is exactly ``new_tokens`` long (toolbox:
``stop_at_eos=false``). The dataset is the toolbox run's own prompt sequence, unshuffled, so step k
of both sees the same prompts. Generation and reward are timed by wrapping ``model.generate`` and the
reward function; the rest of a step (old/ref log-probs if any, loss, backward, optimizer) is "train".
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

from toolbox.core.memory import PeakTreeMemory
from toolbox.driver.startup import tree_cpu_s


class Stopwatch:
    """Seconds spent inside the functions it wraps, summed per name, and the step-end times (wall and the process
    tree's CPU) of a trainer."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {"generate_s": [], "reward_s": []}
        self.pending = {k: 0.0 for k in self.spent}
        self.ends: list[float] = []
        self.wall_ends: list[float] = []  # time.time(), comparable with another process's clock
        self.cpu: list[float] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.pending[name] += time.perf_counter() - start

        timed.__name__ = getattr(fn, "__name__", name)  # TRL names reward columns after the function
        return timed

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())
        self.wall_ends.append(time.time())
        self.cpu.append(tree_cpu_s())
        for k in self.spent:
            self.spent[k].append(self.pending[k])
            self.pending[k] = 0.0


def trl_callback(watch: Stopwatch) -> Any:
    """A transformers `TrainerCallback` closing `Stopwatch` steps at every optimizer step's end."""
    from transformers import TrainerCallback

    class StepEnds(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            watch.step_end()

    return StepEnds()


def run_trl(model_dir: str, rows: list[dict[str, str]], reward_spec: dict[str, Any], sizes: dict[str, Any],
            peft_config: Any = None, callbacks: tuple[Any, ...] = (), **settings: Any) -> dict:
    """Train for ``len(rows) / prompts`` steps; returns step ends, per-step phase seconds and mean rewards,
    completion lengths and the peak PSS of this process. ``settings`` replace `trl_config`'s; ``peft_config``
    (a peft ``LoraConfig``) trains adapters, ``callbacks`` are more transformers ``TrainerCallback``s."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from toolbox.models.loading import load_tokenizer
    from toolbox.rewards import REWARDS
    from toolbox.rewards.base import RewardSample

    torch.manual_seed(0)
    score = REWARDS.build(reward_spec)
    lengths: list[int] = []
    rewards: list[float] = []
    watch = Stopwatch()

    def math_reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                    answer: list[str], **_: Any) -> list[float | None]:
        lengths.extend(len(ids) for ids in completion_ids)
        scores = [score(RewardSample(p, c, {"answer": a})) for p, c, a in zip(prompts, completions, answer)]
        rewards.append(sum(s or 0.0 for s in scores) / max(len(scores), 1))
        return scores

    with tempfile.TemporaryDirectory() as out, PeakTreeMemory() as memory:
        config = trl_config(out, sizes, len(rows) // sizes["prompts"], **settings)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        model.generate = watch.wrap("generate_s", model.generate)  # type: ignore[method-assign]
        trainer = GRPOTrainer(model=model, reward_funcs=watch.wrap("reward_s", math_reward), args=config,
                              train_dataset=Dataset.from_list(rows), processing_class=load_tokenizer(model_dir),
                              callbacks=[trl_callback(watch), *callbacks], peft_config=peft_config)
        trainer.train()
        memory.sample()
    return {"ends": watch.ends, "wall_ends": watch.wall_ends, "cpu": watch.cpu, "phases": watch.spent,
            "tokens": lengths, "rewards": rewards, "peak_pss_mib": memory.peak_mib}


def trl_config(out_dir: str, sizes: dict[str, Any], steps: int, **settings: Any) -> Any:
    """TRL's ``GRPOConfig`` matching toolbox's run (see the module docstring); ``settings`` replace fields."""
    from trl import GRPOConfig

    return GRPOConfig(**{**dict(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, seed=0,
        activation_checkpointing=False,  # TRL defaults it on; transformers 5 renamed gradient_checkpointing
        per_device_train_batch_size=sizes["prompts"] * sizes["group"], gradient_accumulation_steps=1,
        num_generations=sizes["group"], max_completion_length=sizes["new_tokens"],
        generation_kwargs={"min_new_tokens": sizes["new_tokens"]}, temperature=1.0, top_p=1.0,
        beta=0.0, num_iterations=1, learning_rate=sizes["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, max_steps=steps, shuffle_dataset=False,
        logging_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0),
        **settings})
