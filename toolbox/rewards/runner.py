"""Runs a `Reward` over a `RolloutBatch` with a per-batch deadline, recording three states.

Each sample runs in a worker thread; one that raises becomes an ERROR with the
exception as its reason, and one still running at the deadline becomes an ERROR
"timed out". Threads cannot be killed, so a reward stuck in a C call keeps its thread
until it returns; it cannot block the run. Rewards that must be isolated for safety
(executing model-written code) need a process sandbox, which this does not provide.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.rewards.base import Composite, Reward, RewardResult, RewardSample, RewardStatus, reward_value
from toolbox.rl.batch import RolloutBatch


class RewardRunConfig(BaseModel):
    """How rewards are computed."""

    model_config = ConfigDict(extra="forbid")
    timeout_s: float = Field(10.0, gt=0, description="Deadline for scoring one batch shard; late samples are errors.")
    threads: int = Field(4, ge=1, description="Samples scored concurrently in one reward worker.")
    max_error_rate: float = Field(0.5, ge=0.0, le=1.0, description="Largest fraction of a step's samples whose "
                                  "reward may be an error (raised, timed out, NaN/inf or not a number); above it "
                                  "the run fails naming the most common reasons. Errored samples never enter "
                                  "the update. 1: never fail.")


def decode_samples(batch: RolloutBatch, tokenizer) -> list[RewardSample]:  # noqa: ANN001 - transformers type
    """Prompt and response text of every row (special tokens dropped)."""
    prompts = tokenizer.batch_decode(
        [ids[m.bool()] for ids, m in zip(batch.prompt_ids_BP, batch.prompt_mask_BP)], skip_special_tokens=True
    )
    responses = tokenizer.batch_decode(
        [ids[m.bool()] for ids, m in zip(batch.response_ids_BR, batch.response_mask_BR)], skip_special_tokens=True
    )
    extras = batch.extras or [{} for _ in prompts]
    return [RewardSample(p, r, e) for p, r, e in zip(prompts, responses, extras)]


def score_samples(reward: Reward, samples: list[RewardSample], config: RewardRunConfig) -> RewardResult:
    """Score every sample; never raises for a sample's failure, records it instead."""
    values = torch.zeros(len(samples))
    status = torch.full((len(samples),), int(RewardStatus.OK), dtype=torch.long)
    reasons = [""] * len(samples)
    components: list[dict[str, float | None]] = [{} for _ in samples]
    pool = cf.ThreadPoolExecutor(max_workers=config.threads, thread_name_prefix="reward")
    futures = {pool.submit(reward, s): i for i, s in enumerate(samples)}
    deadline = time.monotonic() + config.timeout_s
    try:
        for fut in cf.as_completed(futures, timeout=max(0.0, deadline - time.monotonic())):
            i = futures[fut]
            try:
                value = fut.result()
                if value is None:
                    status[i], reasons[i] = RewardStatus.ABSTAIN, "abstained"
                else:
                    values[i] = reward_value(value)  # NaN, inf or a non-number: this sample's error
                    components[i] = value.components if isinstance(value, Composite) else {}
            except Exception as exc:  # a reward bug is a per-sample error, reported with its reason
                status[i], reasons[i] = RewardStatus.ERROR, f"{type(exc).__name__}: {exc}"
    except cf.TimeoutError:
        for fut, i in futures.items():
            if not fut.done():
                status[i], reasons[i] = RewardStatus.ERROR, f"timed out after {config.timeout_s}s"
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return RewardResult(values, status, reasons, max_error_rate=config.max_error_rate,
                        components=components if any(components) else [])
