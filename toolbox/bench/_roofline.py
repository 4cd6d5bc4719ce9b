"""The roofline arithmetic of a GRPO step: the least time its work could take on a machine, phase by phase.

A phase costs at least ``max(bytes / bandwidth, FLOPs / GEMM throughput)`` (the roofline: it cannot move its bytes
faster than a large memcpy nor do its arithmetic faster than a large matrix product). What each phase must do:

- **generate**: the prefill, a forward over every prompt token (``2 N`` FLOPs a token plus attention over the
  prompt), reading the weights once per engine call; the decode, a forward per generated token whose weights are
  read once per decode step for the whole batch the engine runs (``rows_per_call`` rows: blocks of steps sampled
  together share it) and whose K and V cache is read in full for every row (`TrafficModel`).
- **score**: the reward (Python string work, no FLOPs or bytes of note): no roof; its time counts only in the step.
- **train**: forward and backward over every trained token, ``6 N`` FLOPs a token plus attention ``12 L d T``
  (`toolbox.learner.throughput.train_flops`), reading the weights three times per micro-batch, and AdamW reading
  parameters, gradients and both moments and writing three of them back (``7`` weight-sized passes, fp32).
- **sync**: the weights read once and written once (the shared-memory path's one copy; the engine copies nothing).

The step's bound is the roofline of all its work together, ``max(sum of bytes / bandwidth, sum of FLOPs / GEMM)``,
not the sum of the phases' bounds: phases may overlap (the engine samples while the learner trains), so the sum
would let a step that overlaps them look faster than its bound. Not counted: the reference model and old
log-prob forwards (off in this workload: ``kl_coef`` 0, one epoch, the engine's log-probs), logits beyond the
weights' matmul, Python, inter-process transfers of batches: the bound is a lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolbox.bench._decode_bound import TrafficModel
from toolbox.learner.throughput import train_flops

ADAMW_PASSES = 7  # weight-sized fp32 arrays AdamW reads (param, grad, m, v) and writes (param, m, v)


@dataclass(frozen=True)
class Machine:
    """The roofs: bytes a second of a large memcpy (read + written) and FLOPs a second of a large GEMM."""

    bytes_per_s: float
    flops_per_s: float

    def seconds(self, cost: Cost) -> float:
        return max(cost.bytes / self.bytes_per_s, cost.flops / self.flops_per_s)


@dataclass(frozen=True)
class Cost:
    """Bytes moved and FLOPs done by some work."""

    bytes: float = 0.0
    flops: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.flops + other.flops)


@dataclass(frozen=True)
class ModelSize:
    """What the bound needs of a causal LM: parameters (tied ones once), layers, attention width (heads x head_dim),
    and its decode traffic (weight bytes, K and V bytes a cached position)."""

    params: int
    layers: int
    width: int
    traffic: TrafficModel

    def forward_flops(self, tokens: float, context: float) -> float:
        """A forward over ``tokens`` tokens each attending to ``context`` positions: ``2 N`` a token for the weights,
        ``4 L d`` a position for the attention scores and their weighted sum."""
        return tokens * (2.0 * self.params + 4.0 * self.layers * self.width * context)


@dataclass(frozen=True)
class StepWork:
    """One GRPO step's work, per step (a block of steps sampled in one engine call shares that call's weight reads):
    ``rows`` completions of ``prompt_len`` prompt and ``new_tokens`` generated tokens (means), ``rows_per_call``
    rows decoded together, ``train_tokens`` trained tokens of mean sequence length ``train_seq_len`` in
    ``micro_batches`` forward/backward passes, and ``sync_bytes`` sent to the engines."""

    rows: int
    prompt_len: float
    new_tokens: float
    rows_per_call: int
    train_tokens: float
    train_seq_len: float
    micro_batches: int
    sync_bytes: float


def phase_costs(model: ModelSize, work: StepWork) -> dict[str, Cost]:
    """Bytes and FLOPs of each phase of one step (``score``: none)."""
    weights, calls_share = model.traffic.weight_bytes, work.rows / work.rows_per_call
    prompt_tokens, generated = work.rows * work.prompt_len, work.rows * work.new_tokens
    prefill = Cost(weights * calls_share, model.forward_flops(prompt_tokens, work.prompt_len / 2))
    context = work.prompt_len + work.new_tokens / 2  # mean positions a decode step attends to
    per_token_bytes = weights / work.rows_per_call + context * model.traffic.kv_bytes_per_position
    decode = Cost(generated * per_token_bytes, model.forward_flops(generated, context))
    dims = (model.params, model.layers, model.width)
    train = Cost(weights * (3 * work.micro_batches + ADAMW_PASSES), train_flops(dims, work.train_tokens,
                                                                               work.train_seq_len))
    return {"generate": prefill + decode, "score": Cost(), "train": train, "sync": Cost(2.0 * work.sync_bytes)}


def bounds(machine: Machine, model: ModelSize, work: StepWork) -> dict[str, float]:
    """Seconds each phase needs at least, and ``step``: the roofline of the whole step's work together."""
    costs = phase_costs(model, work)
    total = sum(costs.values(), Cost())
    return {**{phase: machine.seconds(cost) for phase, cost in costs.items()}, "step": machine.seconds(total)}


def fractions(bound_s: dict[str, float], measured_s: dict[str, float]) -> dict[str, float | None]:
    """Bound over measured seconds per phase (``None`` where there is no bound or no time measured)."""
    return {k: (bound_s[k] / measured_s[k] if bound_s.get(k) and measured_s.get(k) else None) for k in measured_s}
