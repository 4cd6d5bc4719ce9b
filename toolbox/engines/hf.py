"""The transformers engine: batched sampling with a KV cache, CPU default.

Two decode paths give the same tokens for the same seed: ``lean`` (`toolbox.engines.decode`: a static
cache, one forward per token, sampling and log-probs fused; toolbox's own forward for Llama-family models)
and ``generate`` (``model.generate`` with ``output_logits``), kept for attention kernels the lean loop does
not drive (flash attention).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.core.devices import resolve_device
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.decode import check_lean_attention, decode
from toolbox.learner.lora import LoraConfig, adapter_update, load_adapter
from toolbox.models.lean_llama import LeanLlama, lean_or
from toolbox.models.loading import load_causal_lm, load_tokenizer
from toolbox.models.logprobs import token_logprobs
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.weights import WeightBucket, load_into


class HFEngineConfig(BaseModel):
    """Options of the ``hf`` engine."""

    model_config = ConfigDict(extra="forbid")
    max_batch_size: int = Field(256, ge=1, description="Prompts decoded together in one batch.")
    decode: Literal["lean", "generate"] = Field(
        "lean", description="How tokens are sampled: 'lean' is the engine's own loop (static KV cache, one forward "
        "per token, finished rows leave the batch; sdpa or eager attention), 'generate' is transformers' "
        "model.generate. Both draw the same random numbers, so a seed samples the same tokens.")
    forward: Literal["auto", "transformers"] = Field(
        "auto", description="The lean loop's model forward: 'auto' is toolbox's own for Llama-family models (Llama, "
        "Qwen2, Mistral: about half the ops per token, toolbox.engines.llama_decode; a safetensors directory loads "
        "without transformers' modeling code, toolbox.models.lean_llama) and transformers' for any other; "
        "'transformers' always takes transformers'. Both give the same logits up to float rounding.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "cpu", description="Where the model generates: 'auto' is cuda when the rollout worker has a GPU "
        "(rollout.gpus_per_worker > 0), else cpu. Batches come back on the CPU either way.")

    def check_adapters(self, lora: LoraConfig) -> None:
        """Takes LoRA adapters (learner.lora.sync: adapter): loaded with peft onto its model."""


@ENGINES.register("hf", config=HFEngineConfig)
class HFEngine:
    """Samples with ``transformers``; behaviour log-probs are ``log_softmax(logits / T)`` of sampled tokens.

    Sampling draws from the process's global torch generator, seeded here once; its state is the
    engine's sampling state, which `toolbox.actors.rollout.RolloutWorker.get_state` puts in checkpoints.
    Both decode paths advance it alike, so a checkpoint resumes exactly whichever path wrote it.
    """

    def __init__(self, model_path: str, dtype: str = "float32", config: HFEngineConfig | None = None,
                 seed: int = 0, trust_remote_code: bool = False, adapters: bool = False) -> None:
        """``adapters``: the learner syncs LoRA adapters (``learner.lora.sync: adapter``), which peft adds to the
        transformers model's modules: that model from the start."""
        self.config = config or HFEngineConfig()
        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        self.device = resolve_device(self.config.device, "rollout.engine.device")
        self.model_path, self.dtype, self.trust_remote_code, self.adapters = model_path, dtype, trust_remote_code, adapters
        self.model = self._load().eval().to(self.device)
        if self.config.decode == "lean":
            check_lean_attention(self.model)
        self.generator_seed = seed
        torch.manual_seed(seed)

    def _load(self) -> Any:  # a transformers model or a LeanLlama: the calls the engine makes, both take
        """toolbox's own Llama-family model where the lean loop runs toolbox's own forward on it (no transformers
        modeling code in this process: `toolbox.models.lean_llama`), else the model's family's
        (`load_causal_lm`)."""
        load = partial(load_causal_lm, trust_remote_code=self.trust_remote_code)
        lean = self.config.decode == "lean" and self.config.forward == "auto" and not self.adapters
        return (lean_or(load) if lean else load)(self.model_path, self.dtype)

    @torch.no_grad()
    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        chunks = [requests[i : i + self.config.max_batch_size] for i in range(0, len(requests), self.config.max_batch_size)]
        pad = int(self.tokenizer.pad_token_id)
        return RolloutBatch.concat([self._generate(chunk, sampling) for chunk in chunks], pad_id=pad)

    def _generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        pad, eos = int(self.tokenizer.pad_token_id), int(self.tokenizer.eos_token_id)
        prompt_ids, prompt_mask = left_pad(requests, pad)
        eos_or_none = eos if sampling.stop_at_eos else None
        if self.config.decode == "lean":
            response, logp = decode(self.model, prompt_ids.to(self.device), prompt_mask.to(self.device),
                                    max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                    top_p=sampling.top_p, eos=eos_or_none, pad=pad, forward=self.config.forward)
        else:
            response, logp = self._model_generate(prompt_ids, prompt_mask, sampling, eos_or_none, pad)
        response, logp = response.cpu(), logp.cpu()
        mask, finish = _response_mask(response, eos_or_none)
        return RolloutBatch(
            prompt_ids_BP=prompt_ids,
            prompt_mask_BP=prompt_mask,
            response_ids_BR=torch.where(mask.bool(), response, pad),
            response_mask_BR=mask,
            logprobs_BR=logp * mask,
            group_B=torch.tensor([r.group for r in requests], dtype=torch.long),
            finish_B=finish,
            extras=[r.extras for r in requests],
        )

    def _model_generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingConfig,
                        eos: int | None, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Response tokens and their behaviour log-probs through ``model.generate`` (the ``generate`` path)."""
        greedy = sampling.temperature == 0.0
        out = self.model.generate(
            input_ids=prompt_ids.to(self.device),
            attention_mask=prompt_mask.to(self.device),
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None,
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=0,
            eos_token_id=eos,
            pad_token_id=pad,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
        )
        response = out.sequences[:, prompt_ids.shape[1] :]
        return response, token_logprobs(torch.stack(out.logits, dim=1), response, 1.0 if greedy else sampling.temperature)

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        lora = adapter_update(buckets)
        if lora is not None:  # learner.lora.sync: adapter: peft adapters on this engine's model, loaded in place
            if isinstance(self.model, LeanLlama):  # built without `adapters`: the transformers model, same weights
                model = load_causal_lm(self.model_path, self.dtype, self.trust_remote_code)
                model.load_state_dict(self.model.state_dict())
                self.model = model.eval().to(self.device)
            self.model, loaded = load_adapter(self.model, buckets, lora)
            return loaded
        return load_into(self.model, buckets)

    def sleep(self) -> None:
        """On cuda: the model moves to host memory and the cached device blocks are freed (a colocated learner
        trains meanwhile); on cpu: nothing to free."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """The model back on its device after `sleep`."""
        if self.device.type == "cuda":
            self.model.to(self.device)

    def state_dict(self) -> dict[str, Any]:
        # Row-major copies: the lean loop may keep weights column-major (`column_major_weights`).
        return {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in self.model.state_dict().items()}


def left_pad(requests: list[PromptRequest], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The requests' prompt ids left-padded to the longest, and their mask, ``[B, P]`` each."""
    width = max(len(r.ids) for r in requests)
    prompt_ids = torch.full((len(requests), width), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, r in enumerate(requests):
        prompt_ids[i, width - len(r.ids) :] = torch.tensor(r.ids)
        prompt_mask[i, width - len(r.ids) :] = 1
    return prompt_ids, prompt_mask


def _response_mask(response_BR: torch.Tensor, eos: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """1 up to and including the first EOS; finish reason STOP if an EOS was sampled, else LENGTH."""
    b, r = response_BR.shape
    if eos is None:
        return torch.ones_like(response_BR), torch.full((b,), FINISH_LENGTH, dtype=torch.long)
    is_eos = response_BR == eos
    # Tokens after the first EOS are padding: their count of earlier EOS tokens is >= 1.
    before_or_at_first_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) == 0
    finish = torch.where(is_eos.any(dim=1), FINISH_STOP, FINISH_LENGTH)
    return before_or_at_first_eos.long(), finish
