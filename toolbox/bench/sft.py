"""SFT throughput: examples/s and peak memory of our `SFTLearner` vs TRL's ``SFTTrainer``, same model and batches.

``python -m toolbox.bench sft [--steps 20] [--batch-size 32] [--packing] [--threads 1] [--no-trl]``

Both train the tiny Qwen2 model on digit_add prompt/answer pairs with the prompt
masked (TRL: prompt-completion data, completion-only loss), one micro-batch per
optimizer step, AdamW at a constant learning rate, fp32 on CPU.
"""

from __future__ import annotations

import argparse
import tempfile

from toolbox.bench._offline import Timing, compare, parser, records, run_learner, step_timer, trl_common


def run_toolbox(args: argparse.Namespace, model_dir: str) -> Timing:
    from toolbox.algorithms.sft.config import SFTConfig
    from toolbox.algorithms.sft.learner import SFTLearner
    from toolbox.learner.config import LearnerConfig, OptimConfig

    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=args.batch_size,
                        optim=OptimConfig(lr=1e-4, scheduler="constant"))
    algo = SFTConfig(batch_size=args.batch_size, max_length=args.max_length, packing=args.packing)
    learner = SFTLearner(model_dir, "float32", cfg, algo, args.warmup + args.steps,
                         task={"name": "digit_add", "max_operand": args.max_operand}, seed=0)
    return run_learner(learner, args)


def run_trl(args: argparse.Namespace, model_dir: str) -> Timing:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from toolbox.models.loading import load_tokenizer

    rows = [{"prompt": r["prompt"], "completion": r["response"]} for batch in records(args, "sft") for r in batch]
    timer = step_timer()
    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(**trl_common(args, out), packing=args.packing, completion_only_loss=True,
                           shuffle_dataset=False)
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=config,
                             train_dataset=Dataset.from_list(rows), processing_class=load_tokenizer(model_dir),
                             callbacks=[timer])
        trainer.train()
    return timer.timing(None if getattr(args, "packing", False) else args.batch_size)


def main(argv: list[str]) -> int:
    p = parser("sft", __doc__)
    p.add_argument("--packing", action="store_true", help="Pack several examples per row (both frameworks).")
    return compare("sft", "examples", run_toolbox, run_trl, p.parse_args(argv))
