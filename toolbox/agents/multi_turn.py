"""The ``multi_turn`` engine: wraps any engine and runs whole episodes against a text environment.

Each request starts an episode (a fresh env from the ``text_env`` registry, reset with the prompt
and the row's extras). Every turn, all episodes still running are generated in **one** call of the
wrapped engine (``sampling.max_new_tokens`` is the budget of one turn); each model message goes to
its env's ``step`` (envs step concurrently in threads), and the env's reply is tokenized and
appended. A turn ends at EOS, at the turn budget, or where its text first contains one of the ``stop``
strings (the tokens sampled after it are dropped). An episode ends when its env says done, after
``max_turns`` model turns, or when its response reaches ``max_response_tokens`` (model and env tokens
together).

The engine returns ONE `RolloutBatch` row per episode: the response is the model's turns and the
env's replies in order, ``own_mask_BR`` (and so ``loss_mask_BR``) is 1 on the model's own tokens and 0 on the env's,
``logprobs_BR`` holds the behaviour log-probs of the model's tokens (0 on env tokens), and
``extras`` gains ``env_score`` (the per-turn rewards reduced by ``reward_reduction``),
``env_turn_rewards``, ``env_turns``, ``env_info``, ``env_trace`` (a `toolbox.tracing.episodes.TurnRecord` per
model turn and env reply: role, text, tokens, timing, tool calls with arguments and results), ``env_parts`` (when the env names the parts of its rewards in
``info["parts"]``: each part reduced like the rewards) and, when the env raised, ``env_error``: the
``env_score`` reward turns that into a per-sample error. Finish reason: STOP when the env ended the
episode, LENGTH when a turn or token limit did.

Token-exactness: each turn is generated from exactly the token ids the row will hold (prompt +
response so far), so the learner's log-probs of the model's tokens are computed on the context the
behaviour policy saw. Env text is tokenized on its own (``add_special_tokens=False``).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator

from toolbox.agents import calc as _calc  # noqa: F401  (registers the calculator tools and the tool_add task)
from toolbox.agents import tool_env as _tool_env  # noqa: F401  (registers the tool_env environment)
from toolbox.agents.env import TEXT_ENVS, EnvStep, TextEnv
from toolbox.core.registry import Spec, SpecOf
from toolbox.engines.base import ENGINES, InferenceEngine, SamplingConfig
from toolbox.engines.common import Sample, batch_from_samples
from toolbox.learner.lora import LoraConfig, check_adapter_sync
from toolbox.models.loading import load_tokenizer
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.weights import WeightBucket
from toolbox.tracing.episodes import TRACE_KEY, TurnRecord

INNER = SpecOf(ENGINES, default="hf")
ENV = SpecOf(TEXT_ENVS, default="tool_env")


class MultiTurnConfig(BaseModel):
    """Options of the ``multi_turn`` engine."""

    model_config = ConfigDict(extra="forbid")
    engine: Annotated[SerializeAsAny[Spec], INNER] = Field(
        default_factory=INNER.make_default, description="The engine that generates each turn: `name` selects it "
        "(default hf), the rest are its options.")
    env: Annotated[SerializeAsAny[Spec], ENV] = Field(
        default_factory=ENV.make_default, description="The text environment of each episode: `name` selects it "
        "(default tool_env), the rest are its options.")
    max_turns: int = Field(4, ge=1, description="Most model turns per episode.")
    stop: list[str] = Field([], description="Stop strings: a model turn ends where its text first contains one "
                            "(kept in the turn, as inference servers' stop sequences do), e.g. `</tool_call>`; "
                            "the tokens sampled after it are dropped. Empty: turns end at EOS or the turn budget.")
    max_response_tokens: int = Field(256, ge=1, description="Token budget of an episode's response (the model's "
                                     "turns and the environment's replies together).")
    reward_reduction: Literal["sum", "last"] = Field("sum", description="How the env's per-turn rewards become "
                                                     "the episode's `env_score`: their sum, or the last one.")
    env_threads: int = Field(8, ge=1, description="Environments stepped concurrently (tool calls run in them).")

    def check_adapters(self, lora: LoraConfig) -> None:
        """Takes LoRA adapters when the engine it wraps does (weight updates go to that engine)."""
        check_adapter_sync(lora, self.engine, "rollout.engine.engine")

    @field_validator("engine")
    @classmethod
    def _not_nested(cls, spec: Spec) -> Spec:
        if spec.name == "multi_turn":
            raise ValueError("the multi_turn engine wraps a generating engine (hf, vllm, ...), not itself")
        return spec


@dataclass
class _Episode:
    """One episode's growing row."""

    request: PromptRequest
    env: TextEnv | None
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    last_turn: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    trace: list[TurnRecord] = field(default_factory=list)
    turns: int = 0
    error: str = ""
    done: bool = False
    finish: int = FINISH_LENGTH

    def append(self, ids: list[int], logprobs: list[float], own: bool, budget: int) -> bool:
        """Append up to the token budget; returns whether everything fit (if not, the episode ends by length).

        A model turn that exactly fills the budget still goes to the env (it may be the final answer); the
        episode then ends by length before another turn (`generate`).
        """
        room = budget - len(self.ids)
        kept = ids[:room]
        self.ids += kept
        self.logprobs += logprobs[:room] if own else [0.0] * len(kept)
        self.mask += [int(own)] * len(kept)
        if len(kept) < len(ids):
            self.end(FINISH_LENGTH)
            return False
        return True

    def end(self, finish: int, error: str = "") -> None:
        self.done, self.finish, self.error = True, finish, error or self.error


@ENGINES.register("multi_turn", config=MultiTurnConfig)
class MultiTurnEngine:
    """Runs episodes of several turns against a text env around another engine; one row per episode."""

    def __init__(self, model_path: str, dtype: str = "float32", config: MultiTurnConfig | None = None,
                 seed: int = 0) -> None:
        self.config = config or MultiTurnConfig()
        self.engine: InferenceEngine = ENGINES.build(self.config.engine,
                                                     inject={"model_path": model_path, "dtype": dtype, "seed": seed})
        self.tokenizer = load_tokenizer(model_path)
        self.pool = cf.ThreadPoolExecutor(max_workers=self.config.env_threads, thread_name_prefix="env")

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        start = time.perf_counter()
        episodes = [self._start(r) for r in requests]
        for turn in range(1, self.config.max_turns + 1):
            for e in episodes:
                if not e.done and len(e.ids) >= self.config.max_response_tokens:
                    e.end(FINISH_LENGTH)  # no room for another turn
            active = [e for e in episodes if not e.done]
            if not active:
                break
            called = time.perf_counter()
            batch = self.engine.generate([PromptRequest(e.prompt + e.ids, e.request.group) for e in active], sampling)
            took = time.perf_counter() - called
            stepping, actions = [], []
            for i, e in enumerate(active):
                keep = batch.response_mask_BR[i].bool()
                e.last_turn, e.turns = self._until_stop(batch.response_ids_BR[i][keep].tolist()), turn
                logprobs = batch.logprobs_BR[i][keep].tolist()[: len(e.last_turn)]
                before = len(e.ids)
                fits = e.append(e.last_turn, logprobs, True, self.config.max_response_tokens)
                text = self.tokenizer.decode(e.ids[before:], skip_special_tokens=True)
                e.trace.append(TurnRecord(turn=turn, who="model", role="assistant", text=text,
                                          tokens=len(e.ids) - before, at_s=called - start, seconds=took))
                if fits:
                    stepping.append(e)
                    actions.append(text)
            for e, step in zip(stepping, self.pool.map(_timed_step, [e.env for e in stepping], actions)):
                self._reply(e, step, turn, start)
        pad = int(self.tokenizer.pad_token_id)
        rows = [PromptRequest(e.prompt, e.request.group, self._extras(e)) for e in episodes]
        return batch_from_samples(rows, [Sample(e.ids, e.logprobs, e.finish, e.mask) for e in episodes], pad)

    def _until_stop(self, ids: list[int]) -> list[int]:
        """The turn's tokens up to the one that completes its first stop string (all of them without one).

        Dropping the later tokens is exact: they were sampled after the kept ones and never influenced them.
        """
        stops = self.config.stop
        if not stops or not any(s in self.tokenizer.decode(ids, skip_special_tokens=True) for s in stops):
            return ids
        for end in range(1, len(ids) + 1):
            if any(s in self.tokenizer.decode(ids[:end], skip_special_tokens=True) for s in stops):
                return ids[:end]
        return ids

    def _start(self, request: PromptRequest) -> _Episode:
        episode = _Episode(request, None, list(request.ids))
        try:
            episode.env = TEXT_ENVS.build(self.config.env)
            prompt = self.tokenizer.decode(request.ids, skip_special_tokens=True)
            first = episode.env.reset(prompt, dict(request.extras))
            episode.prompt += self._encode(first)
        except Exception as err:  # an env failure is this episode's error, never the whole rollout's
            episode.end(FINISH_STOP, f"env reset: {type(err).__name__}: {err}")
        return episode

    def _reply(self, episode: _Episode, stepped: TimedStep, turn: int, start: float) -> None:
        """Record the env's answer to turn ``turn`` (its tool calls go on the turn's record) and append its
        observation (env tokens, out of the loss)."""
        step, began, seconds = stepped
        try:
            if isinstance(step, Exception):
                raise step
            episode.rewards.append(float(step.reward))
            episode.infos.append(dict(step.info))
            episode.trace[-1].tool_calls = list(step.calls)
            before = len(episode.ids)
            if step.done:
                episode.end(FINISH_STOP)
            else:
                episode.append(self._encode(step.observation), [], False, self.config.max_response_tokens)
            text = self.tokenizer.decode(episode.ids[before:], skip_special_tokens=True)
            episode.trace.append(TurnRecord(turn=turn, who="env", role=step.role, text=text,
                                            tokens=len(episode.ids) - before, at_s=began - start, seconds=seconds,
                                            reward=float(step.reward)))
        except Exception as err:  # a broken env or an observation the tokenizer cannot encode: this row's error
            episode.end(FINISH_STOP, f"env step {turn}: {type(err).__name__}: {err}")

    def _encode(self, text: str) -> list[int]:
        """Env text as token ids; characters the tokenizer can only map to its unknown token are an error."""
        if not text:
            return []
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        unk = self.tokenizer.unk_token_id
        if unk is not None and unk in ids and self.tokenizer.unk_token not in text:
            bad = sorted({c for c in text if self.tokenizer(c, add_special_tokens=False)["input_ids"] == [unk]})
            raise ValueError(f"the environment's text {text[:60]!r} has characters the tokenizer cannot encode: "
                             f"{''.join(bad)!r} (for a tiny char model, add them to the task's alphabet)")
        return ids

    def _extras(self, e: _Episode) -> dict[str, Any]:
        last = self.config.reward_reduction == "last"
        reduce = (lambda r: r[-1] if r else 0.0) if last else sum
        out = {**e.request.extras, "env_score": float(reduce(e.rewards)), "env_turn_rewards": e.rewards,
               "env_turns": e.turns, "env_info": e.infos, TRACE_KEY: [t.model_dump(mode="json") for t in e.trace]}
        parts: dict[str, float] = {}
        for info in e.infos[-1:] if last else e.infos:  # the named parts of the reward, reduced like it
            for name, value in (info.get("parts") or {}).items():
                parts[name] = parts.get(name, 0.0) + float(value)
        if parts:
            out["env_parts"] = parts
        return {**out, "env_error": e.error} if e.error else out

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        return self.engine.update_weights(buckets)

    def state_dict(self) -> dict[str, Any]:
        return self.engine.state_dict()


TimedStep = tuple[EnvStep | Exception, float, float]


def _timed_step(env: TextEnv | None, action: str) -> TimedStep:
    """``env.step(action)``, or the exception it raised (reported on the episode's row); when it started
    (``time.perf_counter``) and how long it took."""
    began = time.perf_counter()
    try:
        assert env is not None, "stepped an episode whose env was never built"
        step: EnvStep | Exception = env.step(action)
    except Exception as err:
        step = err
    return step, began, time.perf_counter() - began
