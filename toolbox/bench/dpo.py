"""Offline DPO throughput: pairs/s and peak memory of our `DPOLearner` vs TRL's ``DPOTrainer``, same model and pairs.

``python -m toolbox.bench dpo [--steps 20] [--batch-size 32] [--loss-type sigmoid] [--threads 1] [--no-trl]``

Both train the tiny Qwen2 model on digit_add preference pairs (chosen: the sum,
rejected: a nearby wrong number) against a frozen reference computed on the fly,
one micro-batch per optimizer step, AdamW at a constant learning rate, fp32 on CPU.
"""

from __future__ import annotations

import argparse
import tempfile

from toolbox.bench._offline import Timing, compare, parser, records, run_learner, step_timer, trl_common


def run_toolbox(args: argparse.Namespace, model_dir: str) -> Timing:
    from toolbox.algorithms.dpo.config import DPOConfig
    from toolbox.algorithms.dpo.learner import DPOLearner
    from toolbox.learner.config import LearnerConfig, OptimConfig

    cfg = LearnerConfig(num_workers=1, strategy="single", micro_batch_size=args.batch_size,
                        optim=OptimConfig(lr=1e-4, scheduler="constant"))
    algo = DPOConfig(batch_size=args.batch_size, max_length=args.max_length, loss={"name": args.loss_type}, beta=0.1)
    learner = DPOLearner(model_dir, "float32", cfg, algo, args.warmup + args.steps,
                         task={"name": "digit_add", "max_operand": args.max_operand}, seed=0)
    return run_learner(learner, args)


def run_trl(args: argparse.Namespace, model_dir: str) -> Timing:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from toolbox.models.loading import load_tokenizer

    rows = [dict(r) for batch in records(args, "preference") for r in batch]
    timer = step_timer()
    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(**trl_common(args, out), loss_type=[args.loss_type], beta=0.1)
        trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=config,
                             train_dataset=Dataset.from_list(rows), processing_class=load_tokenizer(model_dir),
                             callbacks=[timer])
        trainer.train()
    return timer.timing(None if getattr(args, "packing", False) else args.batch_size)


def main(argv: list[str]) -> int:
    p = parser("dpo", __doc__)
    p.add_argument("--loss-type", default="sigmoid", choices=["sigmoid", "ipo", "hinge"], help="Preference loss (both).")
    return compare("dpo", "pairs", run_toolbox, run_trl, p.parse_args(argv))
