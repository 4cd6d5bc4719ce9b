"""``reward_model``: the scalar a trained reward model (``algorithm.name=rm``) gives a prompt and its response.

The model is a Hugging Face sequence-classification directory with one label (what an ``rm`` run exports to
``RUN_DIR/hf``). A sample is encoded exactly as the ``rm`` learner encoded its pairs (`encode_pair`: the chat
template when there is one and ``use_chat_template`` allows it, else prompt text then response then EOS), cut
to ``max_length`` tokens; samples are scored in batches (`MicroBatcher`) on the reward worker's device.
The score is the raw logit (Bradley-Terry scale: differences are log-odds), optionally shifted and scaled.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.data.encode import encode_pair
from toolbox.data.packing import pad_examples
from toolbox.models.loading import load_tokenizer
from toolbox.models.reward_head import load_reward_model, sequence_scores
from toolbox.rewards.base import REWARDS, Reward, RewardSample
from toolbox.rewards.batching import MicroBatcher


class RewardModelConfig(BaseModel):
    """Options of ``reward_model``."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="Reward model directory (AutoModelForSequenceClassification, num_labels=1), "
                      "e.g. the RUN_DIR/hf of an `algorithm.name: rm` run, or a hub id.")
    dtype: str = Field("float32", description="Parameter dtype: float32 or bfloat16.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the model scores: 'auto' is cuda when the reward worker sees a GPU, else cpu.")
    max_length: int = Field(512, ge=2, description="Tokens of prompt + response scored; longer samples are cut.")
    use_chat_template: bool = Field(True, description="Encode as the rm run did: through the tokenizer's chat "
                                    "template when it has one.")
    batch_size: int = Field(32, ge=1, description="Most samples per forward (a batch also never exceeds "
                            "reward.run.threads, the samples scored at once).")
    max_wait_ms: float = Field(5.0, ge=0, description="How long a batch waits for more samples after its first.")
    scale: float = Field(1.0, description="The reward is scale * (logit - shift).")
    shift: float = Field(0.0, description="Subtracted from the logit before scaling.")


class RewardModelScorer:
    """Loads the model once per reward worker; each call scores one sample through the shared batcher."""

    def __init__(self, config: RewardModelConfig) -> None:
        from toolbox.core.devices import resolve_device

        self.config = config
        self.tokenizer = load_tokenizer(config.path)
        self.device = resolve_device(config.device, "reward.spec.device")
        model = load_reward_model(config.path, config.dtype, int(self.tokenizer.pad_token_id))
        self.model = model.eval().requires_grad_(False).to(self.device)
        self.batcher: MicroBatcher[RewardSample, float] = MicroBatcher(
            self.score_batch, config.batch_size, config.max_wait_ms / 1000, "reward_model")

    def score_batch(self, samples: list[RewardSample]) -> list[float]:
        """The rewards of ``samples`` in one forward."""
        c = self.config
        examples = [encode_pair(s.prompt, s.response, self.tokenizer, c.use_chat_template).cut(c.max_length)
                    for s in samples]
        batch = pad_examples(examples, int(self.tokenizer.pad_token_id))
        with torch.inference_mode():  # grad mode is per thread: this runs on the batcher's
            scores = sequence_scores(self.model, batch, self.device)
        return [c.scale * (float(v) - c.shift) for v in scores.cpu()]

    def __call__(self, sample: RewardSample) -> float:
        return self.batcher.submit(sample).result()


@REWARDS.register("reward_model", config=RewardModelConfig)
def reward_model(config: RewardModelConfig) -> Reward:
    """The reward model's score of each response (higher is preferred)."""
    return RewardModelScorer(config)
