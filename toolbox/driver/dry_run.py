"""``toolbox run ... --dry-run``: what a config would start and spend, printed before anything starts.

Four rich tables: the settings that differ from the defaults, the actors per role with their resources and
placement groups (from `toolbox.driver.placement.role_size` / `trial_bundles`, the code that sizes the real groups),
the batch arithmetic per rank, and an estimate of one learner rank's memory.

Starts nothing: no Ray, no run directory, no weights. The parameter count comes from the model's config
(``AutoConfig``, or the tiny model's config) instantiated on the ``meta`` device, which allocates no storage.
A hub id's ``config.json`` is fetched (a few KB) when it is not cached; the weights never are.

The memory figure is an estimate, not a measurement: parameters, gradients and AdamW state follow the precision,
sharding and offload settings exactly (LoRA: gradients and AdamW state of the adapters only); FSDP2's root group
(embeddings, final norm, LM head) stays gathered from the forward to the end of the backward, beside its full
gradients; a frozen fsdp2 reference on a GPU lives in host memory. Activations are what autograd saves in a
Llama/Qwen2 block (`block_activation_bytes`: no score matrices with SDPA, the scores and softmax with eager
attention) plus the fp32 logits and their log-softmax with their gradients; allocator fragmentation, CUDA context
and communication buffers are not in it. Online prompts are assumed `PROMPT_TOKENS` long (capped by the model's
positions). On GPUs `toolbox.driver.gpu_plan` adds the engines' reservation and says whether it all fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolbox.config.algorithm import PAIR_ROWS
from toolbox.config.schema import ExperimentConfig

PROMPT_TOKENS = 256  # assumed prompt length of online algorithms (the prompts are not read in a dry run)
ADAM_STATES = 2  # AdamW keeps exp_avg and exp_avg_sq, each the size and dtype of the parameter
GiB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The worker class each role's group starts (`toolbox.actors`), shown in the actors table.
ROLE_ACTORS = {"rollout": "RolloutWorker", "reward": "RewardWorker", "learner": "LearnerWorker",
               "env": "EnvRunnerWorker"}


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs to know of the policy model."""

    params: int
    block_params: int  # one decoder block: what FSDP2 gathers unsharded at a time
    output_params: int  # the LM head (a critic replaces it by a value head)
    layers: int
    hidden: int
    heads: int
    vocab: int
    max_positions: int
    source: str
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: as many as heads
    head_dim: int = 0  # 0: hidden / heads
    intermediate: int = 0  # the MLP's width (gate and up projections); 0: 4 x hidden
    attention: str = "sdpa"  # the attention implementation: eager keeps the score matrices for backward
    lora_params: int = 0  # with learner.lora: the adapters' parameters (what trains)

    @property
    def root_params(self) -> int:
        """Parameters outside the decoder blocks (embeddings, final norm, LM head): FSDP2's root group."""
        return self.params - self.layers * self.block_params

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads or self.heads) * (self.head_dim or self.hidden // self.heads)


def model_shape(cfg: ExperimentConfig) -> ModelShape:
    """The policy's sizes from its config alone: the tiny model's, or ``AutoConfig.from_pretrained(model.path)``."""
    import torch
    from transformers import AutoModelForCausalLM

    path = cfg.model.path
    if cfg.model.tiny is not None and not (path and (Path(path) / "config.json").is_file()):
        from toolbox.data.tasks import TASKS
        from toolbox.models.tiny import _model_config, build_char_tokenizer

        alphabet = cfg.model.tiny.alphabet or TASKS.build(cfg.task, inject={"data": cfg.data}).alphabet()
        config, source = _model_config(cfg.model.tiny, build_char_tokenizer(alphabet)), f"tiny {cfg.model.tiny.arch}"
    else:
        config, source = _real_model_config(cfg)
    config._attn_implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    with torch.device("meta"):  # shapes only: no storage is allocated, no weights are read
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=cfg.model.trust_remote_code)
    layers = int(config.num_hidden_layers)
    blocks = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers), None)
    head = model.get_output_embeddings()
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        block_params=sum(p.numel() for p in blocks[0].parameters()) if blocks is not None else 0,
        output_params=sum(p.numel() for p in head.parameters()) if head is not None else 0,
        layers=layers, hidden=int(config.hidden_size), heads=int(config.num_attention_heads),
        vocab=int(config.vocab_size), max_positions=int(getattr(config, "max_position_embeddings", 0) or 0),
        source=source, kv_heads=int(getattr(config, "num_key_value_heads", 0) or 0),
        head_dim=int(getattr(config, "head_dim", 0) or 0), intermediate=int(getattr(config, "intermediate_size", 0) or 0),
        attention=str(getattr(config, "_attn_implementation", None) or "sdpa"),
        lora_params=_lora_params(model, cfg.learner.lora),
    )


def _lora_params(model: Any, lora: Any) -> int:
    """The adapters' parameters: ``r x (in + out)`` for each linear layer ``lora.target_modules`` names (all of
    them in the blocks for 'all-linear')."""
    if lora is None:
        return 0
    import torch

    targets = lora.target_modules
    return sum(lora.r * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()
               and (targets == "all-linear" or name.rsplit(".", 1)[-1] in targets))


def _real_model_config(cfg: ExperimentConfig) -> tuple[Any, str]:
    """``model.path``'s config (a catalog name resolved), and where it came from. A GGUF not converted yet is not
    converted here: its config comes from the file's metadata, which is all a dry run reads."""
    from transformers import AutoConfig

    from toolbox.core.errors import ConfigError
    from toolbox.driver.preflight import check_model_path
    from toolbox.models.architectures import published_config
    from toolbox.models.catalog import gguf_source, gguf_target, resolve
    from toolbox.models.gguf import GGUFImportError, check_gguf_packages

    model = cfg.model
    path = resolve(model.path)  # a ConfigError naming model.path and the fetch command, as a run would raise
    published = None if (Path(path) / "config.json").is_file() else published_config(path)
    if published is not None:  # a listed hub id not fetched here: its published architecture, no download
        return published, f"{path} (published architecture)"
    if model.gguf_file:
        gguf = gguf_source(path, model.gguf_file)
        converted = gguf_target(gguf)
        if not (converted / "config.json").is_file():
            try:
                check_gguf_packages()
            except GGUFImportError as err:
                raise ConfigError(f"model.gguf_file: {err}") from None
            return AutoConfig.from_pretrained(path, gguf_file=model.gguf_file), str(gguf)
        path = str(converted)
    check_model_path(path, model.trust_remote_code)  # a ConfigError naming model.path, as a run would raise
    return AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code), path


def changed_settings(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """(path, value) of every leaf that differs from the defaults (the algorithm against its own class's)."""
    from toolbox.algorithms.ppo_env.config import changed_fields

    default = ExperimentConfig()
    leaves = [leaf for name in ExperimentConfig.model_fields if name != "algorithm"
              for leaf in changed_fields(name, getattr(cfg, name), getattr(default, name))]
    if cfg.algorithm.name != default.algorithm.name:
        leaves.append(f"algorithm.name={cfg.algorithm.name!r}")
    leaves += changed_fields("algorithm", cfg.algorithm, type(cfg.algorithm)())
    return [(path, value) for path, _, value in (leaf.partition("=") for leaf in leaves)]


def actor_rows(cfg: ExperimentConfig) -> list[tuple[str, ...]]:
    """Per role, in the order the algorithm builds them: actors, resources each, and their placement group."""
    from toolbox.driver.placement import role_size, trial_bundles
    from toolbox.engines.placement import colocated_bundle

    bundles, first = trial_bundles(cfg)[1:], 0
    rows: list[tuple[str, ...]] = []
    placement = getattr(cfg.ray, "placement", {})
    for role in cfg.algorithm.roles:
        n, cpus, gpus = role_size(cfg, role)
        bundle = bundles[first] if n else {}
        first += n
        strategy = getattr(placement.get(role), "strategy", "PACK")
        where = ("in-process (ray.local_mode)" if cfg.ray.local_mode
                 else f"{n} x {_bundle_text(bundle)}, {strategy}")
        if role == "reward" and not n:
            where = "none: each rollout worker scores its own batches (reward.num_workers: 0)"
        if colocated(cfg, role) and not cfg.ray.local_mode:
            shared, strategy = colocated_bundle(cfg)
            other = "learner rank" if role == "rollout" else "rollout worker"
            where = f"one, with {other} i in bundle i: {n} x {_bundle_text(shared)}, {strategy}"
        each = f"{cpus:g} CPU" + (f", {gpus:g} GPU" if gpus else "")
        rows.append((role, ROLE_ACTORS.get(role, role), str(n), each, where, _role_detail(cfg, role)))
    return rows


def colocated(cfg: ExperimentConfig, role: str) -> bool:
    from toolbox.engines.placement import COLOCATED_ROLES

    return cfg.rollout.placement == "colocate" and role in COLOCATED_ROLES


def _bundle_text(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in bundle.items()) + "}"


def _role_detail(cfg: ExperimentConfig, role: str) -> str:
    lc = cfg.learner
    return {"rollout": f"engine {cfg.rollout.engine.name}", "reward": f"reward {cfg.reward.spec.name}",
            "env": f"{cfg.env.id}, {cfg.env.num_envs} envs each",
            "learner": f"{lc.strategy}, backend {lc.backend}, device {getattr(lc, 'device', 'cpu')}"}.get(role, "")


def batch_rows(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """The batch arithmetic of one training step, as the algorithm describes its batch (`AlgorithmConfig.batch`)."""
    shape, ranks, micro = cfg.algorithm.batch(cfg), cfg.learner.num_workers, cfg.learner.micro_batch_size
    if shape is None:
        return [("batch arithmetic", f"algorithm {cfg.algorithm.name!r} does not describe its batch "
                                     "(AlgorithmConfig.batch)")]
    rows = list(shape.how)
    if shape.rows_per_example == PAIR_ROWS:
        rows.append(("model rows per example", f"{PAIR_ROWS} (a pair: chosen and rejected)"))
    elif shape.rows_per_example > 1:
        rows.append(("model rows per example", str(shape.rows_per_example)))
    unit, minis, epochs = shape.unit, shape.mini_batches, shape.epochs
    per_rank = shape.examples // ranks
    per_mini = per_rank // minis
    rows.append(("per learner rank", f"{shape.examples} / {ranks} ranks = {per_rank} {unit}"))
    if shape.micro_batched:
        rows += [("per optimizer step and rank", f"{per_rank} / {minis} mini-batches = {per_mini} {unit}"),
                 ("micro-batches (grad. accumulation)",
                  f"{per_mini} / micro_batch_size {micro} = {max(1, per_mini // micro)}")]
    rows.append(("optimizer steps per step", f"{epochs} epochs x {minis} mini-batches = {epochs * minis}"))
    return rows


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


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 100 else f"{n / 1024**2:.2f} MiB"


def print_dry_run(cfg: ExperimentConfig, console: Console | None = None, gpu_gib: float | None = None) -> int:
    """Print the four tables, and for a run on GPUs whether it fits GPUs of ``gpu_gib`` GiB (default 80). Exit code
    0, or 2 when the model's config cannot be read (``model.path``)."""
    from toolbox.core.errors import ConfigError

    console = console or Console()
    try:
        memory = memory_table(cfg)  # first: the one part that can still fail (an unreadable model.path)
    except ConfigError as err:
        Console(stderr=True).print(f"[bold red]config error[/]: {escape(str(err))}", soft_wrap=True)
        return 2
    console.print(_table(f"experiment {cfg.experiment}: settings that differ from the defaults (`toolbox config` "
                         "prints them all)", ("setting", "value"), changed_settings(cfg)))
    console.print(_table("actors that would start (one placement group per role)",
                         ("role", "actor", "count", "each", "placement group", "what"), actor_rows(cfg)))
    cold = cfg.model.cold_start
    if cold is not None:
        console.print(escape(f"model.cold_start: experiment {cold.experiment} {' '.join(cold.overrides)} runs first in "
                             f"the driver's process (local mode, one learner rank) unless {cfg.trainer.run_root}/.models "
                             "holds it from before; this run starts from the policy it exports"), soft_wrap=True)
    if "rollout" in cfg.algorithm.roles:
        from toolbox.engines.placement import choose_sync_path

        console.print(escape(choose_sync_path(cfg).describe() + " (before start: nodes unknown)"), soft_wrap=True)
    console.print(_table("batch arithmetic of one training step", ("quantity", "value"), batch_rows(cfg)))
    console.print(memory)
    if rank_device(cfg) == "cuda" or cfg.rollout.gpus_per_worker and "rollout" in cfg.algorithm.roles:
        from toolbox.driver.gpu_plan import DEFAULT_GPU_GIB, describe, gpu_plan

        for line in describe(gpu_plan(cfg, model_shape(cfg), gpu_gib or DEFAULT_GPU_GIB)):
            console.print(escape(line), soft_wrap=True)
    console.print("[dim]dry run: nothing was started, no run directory was written.[/]")
    return 0


def _table(title: str, columns: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def memory_table(cfg: ExperimentConfig) -> Any:
    """The memory estimate of one learner rank as a table (or a line saying why there is none)."""
    if cfg.algorithm.models().policy == "mlp":
        return "memory per learner rank: an MLP policy (algorithm.policy.hidden_sizes); negligible, not estimated"
    shape = model_shape(cfg)
    lc = cfg.learner
    lines = memory_lines(cfg, shape)
    rows = [(line.what, _gib(line.bytes), line.where, line.how) for line in lines]
    for where in dict.fromkeys(line.where for line in lines):
        total = sum(line.bytes for line in lines if line.where == where)
        rows.append((f"[bold]total on {where}[/]", f"[bold]{_gib(total)}[/]", where, ""))
    title = (f"memory per learner rank (estimate): {shape.source}, {shape.params / 1e6:,.2f} M parameters, "
             f"{lc.strategy} x {lc.num_workers}, {cfg.model.dtype} parameters, mixed_precision "
             f"{getattr(lc, 'mixed_precision', 'fp32')}, offload {getattr(lc, 'offload', 'none')}")
    return _table(title, ("item", "size", "where", "how"), rows)
