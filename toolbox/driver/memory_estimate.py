"""An estimate of one learner rank's memory, line by line, from the config and the model's shape (the dry run prints
it; `toolbox.driver.gpu_plan` adds the engines' reservation).

An estimate, not a measurement: parameters, gradients and AdamW state follow the precision, sharding and offload
settings exactly (LoRA: gradients and AdamW state of the adapters only); FSDP2's root group (embeddings, final
norm, LM head) stays gathered from the forward to the end of the backward, beside its full gradients; a frozen fsdp2
reference on a GPU lives in host memory. Activations are what autograd saves in a Llama/Qwen2 block
(`block_activation_bytes`: no score matrices with SDPA, the scores and softmax with eager attention) plus the fp32
logits and their log-softmax with their gradients; allocator fragmentation, CUDA context and communication buffers
are not in it. Online prompts are assumed `PROMPT_TOKENS` long (capped by the model's positions)."""

from __future__ import annotations

from dataclasses import dataclass

from toolbox.config.schema import ExperimentConfig
from toolbox.driver.model_shape import ModelShape

PROMPT_TOKENS = 256  # assumed prompt length of online algorithms (the prompts are not read in a dry run)
ADAM_STATES = 2  # AdamW keeps exp_avg and exp_avg_sq, each the size and dtype of the parameter
GiB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryLine:
    what: str
    bytes: float
    where: str  # the rank's device (cpu / cuda), or "host (offload)"
    how: str


def memory_lines(cfg: ExperimentConfig, shape: ModelShape) -> list[MemoryLine]:
    """One learner rank's memory, item by item (see the module docstring for what the estimate leaves out)."""
    lc = cfg.learner
    world = lc.num_workers if lc.strategy == "fsdp2" else 1  # ddp and single keep a full replica per rank
    param_b = BYTES.get(cfg.model.dtype, 4)
    bf16 = getattr(lc, "mixed_precision", "fp32") == "bf16"
    compute_b = 2 if bf16 else param_b
    offload = getattr(lc, "offload", "none") != "none"
    device = rank_device(cfg)
    state_at = "host (offload)" if offload else device
    shard = f" / {world} ranks" if world > 1 else ""
    models = cfg.algorithm.models()
    trained = shape.lora_params or shape.params  # LoRA: only the adapters have gradients and AdamW state
    adapters = " adapter" if shape.lora_params else ""
    lines = [
        MemoryLine("parameters", shape.params * param_b / world, state_at, f"{shape.params:,} x {param_b} B{shard}"),
        MemoryLine("gradients", trained * param_b / world, state_at, f"{trained:,}{adapters} x {param_b} B{shard}"),
        MemoryLine("optimizer state (AdamW)", ADAM_STATES * trained * param_b / world, state_at,
                   f"{ADAM_STATES} x {trained:,}{adapters} x {param_b} B{shard}"),
    ]
    if lc.strategy == "fsdp2":
        lines.append(MemoryLine("gathered blocks (FSDP2)", 2 * shape.block_params * compute_b, device,
                                f"2 blocks (current + prefetch) x {shape.block_params:,} x {compute_b} B"))
        lines.append(root_group_line(shape, compute_b, bf16, device))
    if models.reference and lc.lora is None:  # LoRA's reference is the base model itself, adapters off
        # On a GPU an fsdp2 reference lives in host memory (CPU offload) and gathers one block at a time.
        ref_at = "host (offload)" if offload or (lc.strategy == "fsdp2" and device == "cuda") else device
        lines.append(MemoryLine("frozen reference", shape.params * param_b / world, ref_at,
                                f"{shape.params:,} x {param_b} B{shard} (no gradients)"))
    if models.critic:  # a critic of the policy's body, trained beside it
        body = shape.params - shape.output_params
        lines.append(MemoryLine("critic (params, grads, AdamW)", (2 + ADAM_STATES) * body * param_b / world, state_at,
                                f"{2 + ADAM_STATES} x {body:,} x {param_b} B{shard}"))
    lines.append(activation_line(cfg, shape, compute_b))
    return lines


def root_group_line(shape: ModelShape, compute_b: int, bf16: bool, device: str) -> MemoryLine:
    """FSDP2's root group (embeddings, final norm, LM head) on a trained model: gathered for the forward and kept
    so until the backward ends, when its full gradients (in the compute dtype, plus an fp32 copy for the
    reduce-scatter under bf16) exist beside it."""
    per_param = 2 * compute_b + (4 if bf16 else 0)
    how = f"{shape.root_params:,} x ({compute_b} B gathered + {compute_b} B grad" + (" + 4 B fp32 reduce)" if bf16 else ")")
    return MemoryLine("root group (embeddings, LM head)", shape.root_params * per_param, device, how)


def rank_device(cfg: ExperimentConfig) -> str:
    """Where a learner rank computes: ``learner.device``, or for auto cuda exactly when Ray gives it a GPU."""
    device = getattr(cfg.learner, "device", "auto")
    return device if device != "auto" else ("cuda" if cfg.learner.gpus_per_worker > 0 else "cpu")


def sequence_length(cfg: ExperimentConfig, shape: ModelShape) -> tuple[int, str]:
    """The token length of one learner row: the batch's fixed ``max_length`` (offline), or prompt +
    ``max_new_tokens`` (online)."""
    batch = cfg.algorithm.batch(cfg)
    if batch is not None and batch.max_length is not None:
        return batch.max_length, f"max_length {batch.max_length}"
    new = cfg.rollout.sampling.max_new_tokens
    total = PROMPT_TOKENS + new
    if shape.max_positions and total > shape.max_positions:
        return shape.max_positions, f"model max positions {shape.max_positions}"
    return total, f"prompt ~{PROMPT_TOKENS} + max_new_tokens {new}"


def activation_line(cfg: ExperimentConfig, shape: ModelShape, act_b: int) -> MemoryLine:
    """Activations of one micro-batch kept for backward (`block_activation_bytes` per token and block), plus the
    fp32 logits and their log-softmax."""
    seq, why = sequence_length(cfg, shape)
    batch = cfg.algorithm.batch(cfg)
    fixed = batch is not None and batch.max_length is not None
    rows = cfg.learner.micro_batch_size * (batch.rows_per_example if batch is not None else 1)  # a pair: 2 rows
    tokens = seq * rows
    per_block = tokens * block_activation_bytes(shape, seq, act_b)
    if getattr(cfg.learner, "activation_checkpointing", False):
        blocks, how = shape.layers * tokens * shape.hidden * act_b + per_block, "block inputs + 1 recomputed block"
    else:
        blocks, how = shape.layers * per_block, f"{shape.layers} blocks"
    # fp32 logits and their log-softmax, and at the backward peak the gradients of both; online learners take the
    # logits of the response positions only (`response_logprobs`' logits_to_keep).
    scored = seq if fixed else cfg.rollout.sampling.max_new_tokens + 1
    logits = 4 * rows * scored * shape.vocab * 4
    return MemoryLine("activations (one micro-batch)", blocks + logits, rank_device(cfg),
                      f"{rows} rows x {seq} tokens ({why}), {how} ({shape.attention} attention), "
                      f"logits {rows}x{scored}x{shape.vocab} fp32 x 4")


def block_activation_bytes(shape: ModelShape, seq: int, c: int) -> float:
    """Bytes one decoder block keeps for backward per token, computing in ``c``-byte floats: what autograd saves in
    a Llama/Qwen2 block. Each RMSNorm: its fp32 input and its normalised output (4 h + c h); attention: queries and
    the keys and values repeated to every head, and its output (4 c h); the SwiGLU MLP: gate, up, their activation
    and product (4 c i). SDPA (flash or memory-efficient) keeps no score matrix; eager attention keeps the scores
    and their softmax (2 c a s)."""
    h, i = shape.hidden, shape.intermediate or 4 * shape.hidden
    saved = 2 * (4 + c) * h + 4 * c * h + 4 * c * i
    if shape.attention == "eager":
        saved += 2 * c * shape.heads * seq
    return float(saved)
