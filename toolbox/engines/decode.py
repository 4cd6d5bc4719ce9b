"""The ``hf`` engine's lean decode loop: a static KV cache, one forward per token, sampling and log-probs fused.

`decode` samples up to ``max_new_tokens`` tokens for a batch of left-padded prompts with a
`transformers.StaticCache` sized once for prompt + response. Each step is one forward of the rows
still running (finished rows leave the batch and the cache), the temperature / top-p sampling of
their next token, and the gather of its behaviour log-prob ``log_softmax(logits / T)[token]``; no
logits processors, no per-step logits kept.

Exactness with ``model.generate`` (the ``decode: generate`` path): tokens are drawn the way
``torch.multinomial`` draws one sample (``argmax(p / q)`` with ``q ~ Exp(1)``), and the exponential
noise is drawn for the *whole* batch every step, finished rows included, exactly as ``generate``
draws it, so the global torch RNG advances identically and a seeded run samples the same tokens
(up to float rounding of the forward: the static cache attends over padded key slots).

Not covered: beam search, repetition penalties, stop strings, or models whose attention is neither
``sdpa`` nor ``eager`` (flash-attention kernels take a 2-D mask; those use the ``generate`` path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from toolbox.engines.llama_decode import LlamaDecoder, column_major_weights, unsupported
from toolbox.models.causal_lm import Decoder, DecodesItself

if TYPE_CHECKING:  # transformers is imported when a model is, not by every worker that imports the engines
    from transformers import PreTrainedModel

LEAN_ATTENTION = ("sdpa", "eager")


def check_lean_attention(model: PreTrainedModel) -> None:
    """The lean loop builds its own 4-D attention mask, which only the sdpa and eager attention kernels take (a
    model with its own decoder builds its own)."""
    if isinstance(model, DecodesItself):
        return
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in LEAN_ATTENTION:
        raise ValueError(f"rollout.engine.decode=lean needs attention implementation sdpa or eager, the model uses "
                         f"{impl!r}; set rollout.engine.decode: generate")


class TransformersForward:
    """The model's own forward over a `transformers.StaticCache` (any sdpa / eager model)."""

    def __init__(self, model: PreTrainedModel, batch: int, max_len: int) -> None:
        from transformers import StaticCache

        self.model, self.cache = model, StaticCache(config=model.config, max_cache_len=max_len)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(cast(torch.LongTensor, rows))

    def prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, pos_BP: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids_BP, attention_mask=mask_BP, position_ids=pos_BP, cache=self.cache,
                          use_cache=True, logits_to_keep=1).logits[:, -1]

    def step(self, token_B: torch.Tensor, pos_B: torch.Tensor, keys_BL: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=token_B[:, None], attention_mask=_attention_mask(self.model, keys_BL),
                          position_ids=pos_B[:, None], cache=self.cache, use_cache=True).logits[:, -1]


STOP_CHECK_EVERY = 8  # decode steps between looks at finished rows on a GPU (each look is a device-to-host sync)


def forward_for(model: PreTrainedModel, forward: str, batch: int, max_len: int) -> Decoder:
    """A model's own decoder (`DecodesItself`: toolbox's GPT); else, ``forward`` 'auto': toolbox's `LlamaDecoder`
    where the model allows it, else transformers' forward.

    Outside inference mode (it may move the model's weights: `column_major_weights`)."""
    if isinstance(model, DecodesItself):
        return model.decoder(batch, max_len)
    if forward == "auto" and unsupported(model) is None:
        column_major_weights(model)
        return LlamaDecoder(model, batch, max_len)
    return TransformersForward(model, batch, max_len)


def decode(model: PreTrainedModel, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, *, max_new_tokens: int,
           temperature: float, top_p: float, eos: int | None, pad: int, drop_finished: bool = True,
           forward: str = "auto", check_every: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample a response per left-padded prompt row (greedy when ``temperature`` is 0): tokens ``[B, R]`` (``pad``
    after a row's EOS) and their behaviour log-probs (0 there).

    A row finishes at its first ``eos`` (when given) or after ``max_new_tokens`` tokens; the loop ends when
    every row has finished, so the response width is the longest response. ``drop_finished`` removes a
    finished row from the batch and the cache; off, it keeps decoding padding (``bench decode`` compares).
    ``forward`` (`forward_for`): 'auto' or 'transformers'. Rows with the same prompt (a GRPO group's samples)
    share its prefill: it runs once per distinct prompt and the cache rows are copied (on the default experiment's
    256 rows of 32 prompts this saves about a quarter of the rollout worker's CPU a step: `toolbox bench grpo`).
    ``check_every``: steps between looks at which rows finished (each look waits for the device); default every
    step on the CPU, where it costs nothing, and every `STOP_CHECK_EVERY` steps on a GPU, which then runs ahead
    of the host. Rows finished between looks decode padding; the result is the same either way.
    """
    if check_every is None:
        check_every = 1 if prompt_ids_BP.device.type == "cpu" else STOP_CHECK_EVERY
    # inference_mode: ~10% less CPU than no_grad (`toolbox bench decode --cases small`); the clones are ordinary tensors again.
    first_U, prompt_B = distinct_prompts(prompt_ids_BP, prompt_mask_BP)
    fwd = forward_for(model, forward, len(first_U), prompt_ids_BP.shape[1] + max_new_tokens)
    with torch.inference_mode():
        tokens_BR, logprobs_BR = _decode(fwd, prompt_ids_BP, prompt_mask_BP, max_new_tokens, temperature, top_p,
                                         eos, pad, (drop_finished, check_every), (first_U, prompt_B))
    return tokens_BR.clone(), logprobs_BR.clone()


def distinct_prompts(prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first row of each distinct prompt ``[U]``, and each row's prompt as an index into those ``[B]``."""
    _, prompt_B = torch.unique(torch.where(prompt_mask_BP.bool(), prompt_ids_BP, -1), dim=0, return_inverse=True)
    rows = torch.arange(len(prompt_B), device=prompt_B.device)
    first_U = torch.full((int(prompt_B.max()) + 1 if len(rows) else 0,), len(rows), device=prompt_B.device)
    return first_U.scatter_reduce(0, prompt_B, rows, reduce="amin"), prompt_B


def _decode(fwd: Decoder, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor,
            max_new_tokens: int, temperature: float, top_p: float, eos: int | None, pad: int,
            stops: tuple[bool, int], prompts: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`decode`'s loop: prefill, then per step sample, record, mask finished rows, forward; every ``check_every``
    steps (``stops``: drop_finished, check_every) end when every row finished, or drop the finished ones.

    ``prompts`` (`distinct_prompts`): the prefill runs over each distinct prompt once (``fwd`` holds that many
    rows); where rows share one (a GRPO group's samples), its cache rows and last logits are then copied to each."""
    b, p = prompt_ids_BP.shape
    device = prompt_ids_BP.device
    keys_BL = torch.zeros((b, p + max_new_tokens), dtype=torch.bool, device=device)
    keys_BL[:, :p] = prompt_mask_BP.bool()
    # Positions count real tokens only (left padding), as generate() and the learner count them.
    pos_BP = (prompt_mask_BP.cumsum(-1) - 1).clamp(min=0)
    first_U, prompt_B = prompts
    if len(first_U) == b:  # no two rows alike
        logits_BV = fwd.prefill(prompt_ids_BP, prompt_mask_BP, pos_BP)
    else:
        logits_BV = fwd.prefill(prompt_ids_BP[first_U], prompt_mask_BP[first_U], pos_BP[first_U])[prompt_B]
        fwd.keep(prompt_B)
    pos_B = pos_BP[:, -1] + 1
    tokens_BR = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=device)
    logprobs_BR = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    rows = torch.arange(b, device=device)  # the batch row of each row still in the loop
    done_b = torch.zeros(b, dtype=torch.bool, device=device)  # rows in the loop that finished since they were kept
    length_B = torch.full((b,), max_new_tokens, device=device)  # each row's response length once it finished
    drop_finished, check_every = stops
    for t in range(max_new_tokens):
        token_b, logp_b = sample_step(logits_BV, temperature, top_p, b, rows)
        token_b, logp_b = token_b.masked_fill(done_b, pad), logp_b.masked_fill(done_b, 0.0)
        tokens_BR[rows, t], logprobs_BR[rows, t] = token_b, logp_b
        if t == max_new_tokens - 1:
            break
        if eos is not None:
            stopped = (token_b == eos) & ~done_b
            length_B[rows] = torch.where(stopped, t + 1, length_B[rows])
            done_b |= stopped
            if (t + 1) % check_every == 0 or check_every == 1:
                if bool(done_b.all()):  # the one wait for the device, every check_every steps
                    width = int(length_B.max())
                    return tokens_BR[:, :width], logprobs_BR[:, :width]
                if drop_finished and bool(done_b.any()):
                    keep = (~done_b).nonzero().squeeze(1)
                    rows, token_b, pos_B, keys_BL = rows[keep], token_b[keep], pos_B[keep], keys_BL[keep]
                    done_b = done_b[keep]
                    fwd.keep(keep)
        keys_BL[:, p + t] = True
        logits_BV = fwd.step(token_b, pos_B, keys_BL)
        pos_B = pos_B + 1
    return tokens_BR, logprobs_BR


def sample_step(logits_bV: torch.Tensor, temperature: float, top_p: float, batch: int,
                rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each running row and its log-prob ``log_softmax(logits / T)[token]`` (T = 1 when greedy).

    ``rows`` are the running rows' indices in the full batch of ``batch`` rows: sampling draws the exponential
    noise of all ``batch`` rows (as ``torch.multinomial`` over the whole batch would) and uses the running rows'.
    """
    scores = logits_bV.float()
    if temperature == 0.0:
        token = scores.argmax(-1)
        return token, torch.log_softmax(scores, -1).gather(-1, token[:, None]).squeeze(-1)
    if temperature != 1.0:
        scores = scores / temperature
    logp_bV = torch.log_softmax(scores, -1)
    probs = torch.softmax(top_p_filter(scores, top_p) if top_p < 1.0 else scores, -1)
    noise = torch.empty((batch, probs.shape[-1]), dtype=probs.dtype, device=probs.device).exponential_(1)
    token = (probs / noise[rows]).argmax(-1)
    return token, logp_bV.gather(-1, token[:, None]).squeeze(-1)


def top_p_filter(scores_bV: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Scores outside the smallest set of tokens with mass >= ``top_p`` set to -inf (``TopPLogitsWarper``'s rule);
    ``top_p`` is one value or one per row (``[b, 1]``; 1 keeps the row whole)."""
    sorted_scores, order = torch.sort(scores_bV, descending=False)
    drop_sorted = sorted_scores.softmax(-1).cumsum(-1) <= (1 - top_p)
    drop_sorted[:, -1] = False  # the most likely token always stays
    return scores_bV.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))


def _attention_mask(model: PreTrainedModel, keys_bL: torch.Tensor) -> torch.Tensor:
    """The one-query 4-D mask ``[b, 1, 1, L]`` over the cache slots: boolean for sdpa, additive for eager."""
    mask = keys_bL[:, None, None, :]
    if model.config._attn_implementation == "sdpa":
        return mask
    dtype = model.dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
