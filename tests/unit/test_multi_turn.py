"""`toolbox.agents.multi_turn` with a scripted engine (no model, no Ray), `tool_env`, and the `env_score` reward;
then the real ``hf`` engine inside it: behaviour log-probs of the model's turns equal the learner's on the row."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from toolbox.agents.env import TEXT_ENVS, EnvStep
from toolbox.agents.multi_turn import MultiTurnConfig, MultiTurnEngine
from toolbox.agents.tool_env import ToolEnv, ToolEnvConfig
from toolbox.data.offline import load_records
from toolbox.data.tasks import TASKS
from toolbox.engines.base import ENGINES, SamplingConfig
from toolbox.engines.common import Sample, batch_from_samples
from toolbox.models.loading import load_tokenizer
from toolbox.models.logprobs import response_logprobs
from toolbox.models.tiny import build_char_tokenizer
from toolbox.rewards.base import REWARDS, RewardStatus
from toolbox.rewards.runner import RewardRunConfig, decode_samples, score_samples
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, PromptRequest, RolloutBatch
from toolbox.rl.plan import StepPlan
from toolbox.tracing.datasets import dpo_rows, read_samples, sft_rows
from toolbox.tracing.entries import TraceRequest
from toolbox.tracing.episodes import first_divergence
from toolbox.tracing.record import sample_traces

# Printable ASCII: the tools' English error messages are spelled out in these tests (the recipe shows "?").
ALPHABET = "".join(c for c in string.printable if c == " " or not c.isspace())
ENV = {"name": "tool_env", "formats": ["pythonic"], "observation_template": "={result}>", "call_reward": 0.3,
       "answer_pattern": r"(\d+)"}
# What the scripted model says in each turn, by group: a tool user, a guesser, a caller that never stops, a caller
# that gets the arguments wrong and then answers.
SCRIPTS = {0: ["add(37,45)", "{last}"], 1: ["99"], 2: ["add(1,1)"] * 9, 3: ["add(37)", "82"],
           4: ["add(37,45) and on", "{last};;"]}  # a model that goes on after its call and its answer


class ScriptedEngine:
    """Replies with its script's next turn (``{last}``: the number the env just showed), EOS-terminated, with
    behaviour log-probs -0.01 * (1 + position in the turn); records the rows of each call."""

    calls: list[int] = []

    def __init__(self, model_path: str) -> None:
        self.tokenizer = load_tokenizer(model_path)

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        ScriptedEngine.calls.append(len(requests))
        samples = []
        for r in requests:
            context = self.tokenizer.decode(r.ids, skip_special_tokens=True)
            # Each earlier model turn ended with EOS, or with a stop string before the env's "...>" reply.
            turn = max(r.ids.count(self.tokenizer.eos_token_id), context.count(">") - 1)
            text = SCRIPTS[r.group][turn].replace("{last}", context.rsplit("=", 1)[-1].rstrip(">"))
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
            ids = ids[: sampling.max_new_tokens]
            samples.append(Sample(ids, [-0.01 * (i + 1) for i in range(len(ids))], FINISH_STOP))
        return batch_from_samples(requests, samples, int(self.tokenizer.pad_token_id))

    def update_weights(self, buckets: list[Any]) -> int:
        return 0

    def state_dict(self) -> dict[str, Any]:
        return {}


class EchoEnv:
    """Never ends; answers every turn with ``+1=`` (digit_add's alphabet); raises on the turn named ``fail_on`` (0: never)."""

    def __init__(self, fail_on: int = 0) -> None:
        self.fail_on, self.turn = fail_on, 0

    def reset(self, prompt: str, extras: dict[str, Any]) -> str:
        return ""

    def step(self, action: str) -> EnvStep:
        self.turn += 1
        if self.turn == self.fail_on:
            raise RuntimeError("the env's backend went away")
        return EnvStep("+1=", 0.5, False)


@pytest.fixture(scope="module")
def char_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chartok")
    build_char_tokenizer(ALPHABET).save_pretrained(path)
    return path


@pytest.fixture(scope="module", autouse=True)
def registered() -> Iterator[None]:
    ENGINES.register("scripted")(ScriptedEngine)
    TEXT_ENVS.register("echo")(EchoEnv)
    TEXT_ENVS.register("echo_failing")(lambda: EchoEnv(fail_on=2))
    yield
    ENGINES.unregister("scripted")
    TEXT_ENVS.unregister("echo")
    TEXT_ENVS.unregister("echo_failing")


def episodes(path: Path, groups: list[int], env: dict[str, Any] | str = ENV, **options: Any) -> tuple[RolloutBatch, Any]:
    engine = MultiTurnEngine(str(path), config=MultiTurnConfig(engine={"name": "scripted"},
                                                               env=env if isinstance(env, dict) else {"name": env},
                                                               **options))
    tok = engine.tokenizer
    reqs = [PromptRequest(tok("37+45? add(37,45)>")["input_ids"], g, {"answer": "82"}) for g in groups]
    ScriptedEngine.calls = []
    return engine.generate(reqs, SamplingConfig(max_new_tokens=12)), tok


def response_text(batch: RolloutBatch, tok: Any, row: int, mask: torch.Tensor | None = None) -> str:
    keep = (batch.response_mask_BR[row] if mask is None else mask[row]).bool()
    return tok.decode(batch.response_ids_BR[row][keep])


def test_episodes_batched_per_turn_with_env_tokens_masked(char_tokenizer_dir: Path) -> None:
    batch, tok = episodes(char_tokenizer_dir, [0, 1, 2, 3], max_turns=3)
    assert ScriptedEngine.calls == [4, 3, 1]  # every active episode of a turn in one engine call
    assert len(batch) == 4 and batch.group_B.tolist() == [0, 1, 2, 3]
    assert response_text(batch, tok, 0) == "add(37,45)</s>=82>82</s>"
    assert response_text(batch, tok, 0, batch.loss_mask_BR) == "add(37,45)</s>82</s>"  # the model's own tokens
    env_tokens = (batch.response_mask_BR[0] - batch.loss_mask_BR[0]).bool()
    assert tok.decode(batch.response_ids_BR[0][env_tokens]) == "=82>"
    # Behaviour log-probs: the engine's on the model's tokens (per turn), 0 on the env's.
    expected = [-0.01 * (i + 1) for i in range(11)] + [0.0] * 4 + [-0.01, -0.02, -0.03]
    torch.testing.assert_close(batch.logprobs_BR[0, :18], torch.tensor(expected))
    assert batch.extras[0]["env_score"] == pytest.approx(1.3) and batch.extras[0]["env_turn_rewards"] == [0.3, 1.0]
    assert batch.extras[0]["env_turns"] == 2 and batch.extras[0]["answer"] == "82"
    assert response_text(batch, tok, 1) == "99</s>" and batch.extras[1]["env_score"] == 0.0
    assert response_text(batch, tok, 2) == "add(1,1)</s>=2>" * 3 and batch.extras[2]["env_turn_rewards"] == [0.3, 0, 0]
    assert response_text(batch, tok, 3) == "add(37)</s>=error: bad arguments for add: b: Field required>82</s>"
    assert batch.extras[3]["env_turn_rewards"] == [0.0, 1.0]  # a failed call earns no call reward
    assert batch.finish_B.tolist() == [FINISH_STOP, FINISH_STOP, FINISH_LENGTH, FINISH_STOP]  # 2 hit max_turns


def test_stop_strings_end_a_turn_where_they_first_appear(char_tokenizer_dir: Path) -> None:
    env = {**ENV, "answer_pattern": r"(\d+);?"}
    batch, tok = episodes(char_tokenizer_dir, [4], env=env, stop=[")", ";"], max_turns=3)
    # Each turn is cut after its first stop string: no EOS, and the tokens sampled after it are gone.
    assert response_text(batch, tok, 0) == "add(37,45)=82>82;" and batch.extras[0]["env_turn_rewards"] == [0.3, 1.0]
    expected = [-0.01 * (i + 1) for i in range(10)] + [0.0] * 4 + [-0.01, -0.02, -0.03]
    torch.testing.assert_close(batch.logprobs_BR[0], torch.tensor(expected))
    assert batch.loss_mask_BR[0].tolist() == [1] * 10 + [0] * 4 + [1] * 3


def test_token_budget_ends_an_episode_by_length(char_tokenizer_dir: Path) -> None:
    batch, tok = episodes(char_tokenizer_dir, [0, 2], max_response_tokens=13, max_turns=3)
    # Row 0: its call (11 tokens) fits, the env's reply is cut after 2 tokens. Row 1: call (9) + reply (3) fit,
    # its second call is cut after 1 token and never reaches the env.
    assert ScriptedEngine.calls == [2, 1]
    assert response_text(batch, tok, 0) == "add(37,45)</s>=8" and batch.loss_mask_BR[0].tolist() == [1] * 11 + [0, 0]
    assert response_text(batch, tok, 1) == "add(1,1)</s>=2>a" and batch.extras[1]["env_turn_rewards"] == [0.3]
    assert batch.finish_B.tolist() == [FINISH_LENGTH, FINISH_LENGTH]
    # A final answer that exactly fills the budget is still scored.
    batch, tok = episodes(char_tokenizer_dir, [1], max_response_tokens=3)
    assert response_text(batch, tok, 0) == "99</s>" and batch.finish_B.tolist() == [FINISH_STOP]
    assert batch.extras[0]["env_turn_rewards"] == [0.0]


def test_env_failure_is_that_rows_reward_error(char_tokenizer_dir: Path) -> None:
    batch, tok = episodes(char_tokenizer_dir, [0, 2], env="echo_failing", max_turns=3)
    assert batch.extras[0]["env_error"] == "env step 2: RuntimeError: the env's backend went away"
    assert batch.extras[0]["env_turn_rewards"] == [0.5]
    result = score_samples(REWARDS.build({"name": "env_score"}), decode_samples(batch, tok), RewardRunConfig())
    assert result.status_B.tolist() == [RewardStatus.ERROR, RewardStatus.ERROR]
    assert result.reasons[0] == "RuntimeError: environment failed: env step 2: RuntimeError: the env's backend went away"


def test_env_score_reward_reads_the_episode_score(char_tokenizer_dir: Path) -> None:
    batch, tok = episodes(char_tokenizer_dir, [0, 1], max_turns=2)
    result = score_samples(REWARDS.build({"name": "env_score"}), decode_samples(batch, tok), RewardRunConfig())
    assert result.values_B.tolist() == pytest.approx([1.3, 0.0]) and result.ok_B.all()
    # The env's named parts, summed over the episode's turns, are the reward's components and step metrics.
    assert batch.extras[0]["env_parts"] == parts(call=0.3, answer=1.0) and result.components[1] == parts()
    metrics = result.metrics()
    assert metrics["reward/call"] == pytest.approx(0.15) and metrics["reward/answer"] == pytest.approx(0.5)
    plain = decode_samples(batch, tok)[0].__class__("p", "r", {"answer": "1"})
    missing = score_samples(REWARDS.build({"name": "env_score"}), [plain], RewardRunConfig())
    assert missing.status_B.tolist() == [RewardStatus.ERROR] and "needs rollout.engine.name=multi_turn" in missing.reasons[0]


def parts(**given: float) -> dict[str, float]:
    return {"call": 0.0, "answer": 0.0, "call_format": 0.0, "answer_format": 0.0, "answer_chars": 0.0, **given}


def test_tool_env_answer_and_format_shaping() -> None:
    env = ToolEnv(ToolEnvConfig(formats=["pythonic"], call_reward=0.3, answer_pattern=r"\s*(\d+)\s*",
                                example_pattern=r"(add\(\d+,\d+\))", example_reward=0.4))
    env.reset("37+45? add(37,45)>", {"answer": "82"})
    near = env.step("add(37,4")  # the first 8 of the example's 10 characters; not a call
    assert near.done and near.reward == pytest.approx(0.4 * 8 / 10)
    env.reset("37+45? add(37,45)>", {"answer": "82"})
    assert env.step("add(37,45)x").reward == pytest.approx(0.4)  # the whole call, then junk
    env.reset("37+45? add(37,45)>", {"answer": "82"})
    assert env.step("a((((((((").reward == pytest.approx(0.4 / 10)  # only the prefix counts, not a later "("
    env.reset("37+45? add(37,45)>", {"answer": "82"})
    called = env.step("add(37,45)")
    assert called == EnvStep("<tool_response>82</tool_response>", 0.3, False,
                             {"tool_calls": 1, "tool_errors": 0, "parts": parts(call=0.3)}, called.calls, "tool")
    [record] = called.calls  # the call as run, for the episode's trace
    assert (record.tool, record.arguments, record.result, record.ok) == ("add", [37, 45], "82", True)
    assert env.step("add(1,1)").reward == 0.0  # the call reward is paid once per episode
    final = env.step(" 82 ")
    assert final.done and final.reward == 1.0 and final.info == {"correct": True, "parts": parts(answer=1.0)}
    for wrong, credit in (("8x", 0.25), ("72", 0.0), ("820", 0.5), ("28", 0.0)):
        partial = ToolEnv(ToolEnvConfig(formats=["pythonic"], answer_char_reward=0.5))
        partial.reset("37+45?", {"answer": "82"})
        assert partial.step("8x").reward == 0.0  # no answer credit before a call: copying, not guessing, pays
        partial.reset("37+45?", {"answer": "82"})
        partial.step("add(37,45)")
        answer = partial.step(wrong)  # the answer's first digits, once the tool has shown the result
        assert answer.reward == pytest.approx(credit) and answer.info["parts"] == parts(answer_chars=credit), wrong
    terse = ToolEnv(ToolEnvConfig(formats=["pythonic"], observation_template="={result}>", error_template="?"))
    terse.reset("1+2?", {"answer": "3"})
    failed = terse.step("add(1)")
    assert failed == EnvStep("=?>", 0.0, False, {"tool_calls": 1, "tool_errors": 1, "parts": parts()}, failed.calls,
                             "tool")
    assert [(c.tool, c.ok, c.result) for c in failed.calls] == [("add", False, "bad arguments for add: b: Field required")]
    assert terse.step("add(1,x)").observation == "=?>"  # a malformed call: the parse error, shown the same way


def test_unencodable_env_text_is_a_row_error(char_tokenizer_dir: Path) -> None:
    env = {**ENV, "observation_template": "résultat {result}"}
    batch, _ = episodes(char_tokenizer_dir, [0], env=env)
    assert batch.extras[0]["env_error"].startswith("env step 1: ValueError: the environment's text 'résultat 82' "
                                                   "has characters the tokenizer cannot encode: 'é'")


def test_hf_engine_turns_match_learner_logprobs(tiny_model_dir: Path) -> None:
    """Token-exactness: each turn is sampled from the row's own prefix, so the learner's log-probs of the model's
    tokens (attending to the env's tokens) equal the behaviour log-probs the engine reported."""
    engine = MultiTurnEngine(str(tiny_model_dir), config=MultiTurnConfig(engine={"name": "hf"}, env={"name": "echo"},
                                                                         max_turns=3))
    torch.manual_seed(0)
    reqs = [PromptRequest(engine.tokenizer(p)["input_ids"], g) for g, p in enumerate(["12+30=", "7+8=", "1+1="])]
    batch = engine.generate(reqs, SamplingConfig(max_new_tokens=5, temperature=1.0))
    env_tokens = batch.response_mask_BR - batch.loss_mask_BR
    assert int(env_tokens.sum()) == 3 * 3 * 3  # "+1=" after each of 3 turns of 3 episodes
    model = engine.engine.model  # type: ignore[attr-defined]
    with torch.no_grad():
        learner = response_logprobs(model, batch, 1.0)
    torch.testing.assert_close(learner * batch.loss_mask_BR, batch.logprobs_BR, atol=1e-4, rtol=0)
    assert (batch.logprobs_BR * env_tokens).abs().sum() == 0


def test_tool_add_task_shows_the_call_in_its_own_alphabet() -> None:
    task = TASKS.build({"name": "tool_add"})
    problems = task.sample(50, random.Random(0))
    assert problems == task.sample(50, random.Random(0))  # deterministic given the rng
    for p in problems:
        a, b = (int(x[2:]) for x in p.prompt.split("?")[0].split(" "))
        assert p.prompt == f"a={a} b={b}? sum()>" and p.answer == str(a + b) and len(p.answer) == 2
        assert set(p.prompt + p.answer + "=?;") <= set(task.alphabet())  # the recipe's replies are spelled too
    a, b = (int(x[2:]) for x in problems[0].prompt.split("?")[0].split(" "))
    for options, prompt in (({"style": "literal", "tool": "add"}, f"{a}+{b}? add({a},{b})>"),
                            ({"style": "variables"}, f"a={a} b={b}? sum(a,b)>"), ({"show_call": False}, f"a={a} b={b}?>")):
        assert TASKS.build({"name": "tool_add", **options}).sample(1, random.Random(0))[0].prompt == prompt
    with pytest.raises(ValueError, match=r"task.high \(5\) is below task.low \(10\)"):
        TASKS.build({"name": "tool_add", "high": 5})


def test_tool_add_demos_replay_as_correct_episodes_of_the_recipes_env() -> None:
    """The cold start's demonstrations are exactly what the recipe's env pays in full: the call, its reply, the answer."""
    from toolbox.config import load_config

    recipe = load_config(["experiment=grpo_tool_calc_tiny"])
    demos = TASKS.build({"name": "tool_add_demos"}).sample(20, random.Random(3))
    problems = TASKS.build({"name": "tool_add"}).sample(20, random.Random(3))
    assert [d.prompt for d in demos] == [p.prompt for p in problems]  # the same prompts, in the same order
    env = ToolEnv(ToolEnvConfig.model_validate(recipe.rollout.engine.env.model_dump(exclude={"name"})))
    for demo, problem in zip(demos, problems, strict=True):
        env.reset(demo.prompt, {"answer": problem.answer})
        call, rest = demo.answer.split(")", 1)  # the recipe's turns end at the stop strings ")" and ";"
        first = env.step(call + ")")
        assert rest.startswith(first.observation) and first.info["parts"]["call"] == 0.6
        final = env.step(rest[len(first.observation):])
        assert final.done and final.info["parts"]["answer"] == 1.0, demo


def test_tool_env_binds_the_prompts_variables() -> None:
    env = ToolEnv(ToolEnvConfig(formats=["pythonic"], variables_pattern=r"([ab])=(\d+)"))
    env.reset("a=37 b=45? add(a,b)>", {"answer": "82"})
    assert env.variables == {"a": 37, "b": 45}
    assert env.step("add(a,b)").observation == "<tool_response>82</tool_response>"
    assert env.step("add(a,c)").observation == ("<tool_response>error: could not parse the tool call: add: name 'c' "
                                                "is not defined (variables: a, b)</tool_response>")
    injecting = ToolEnv(ToolEnvConfig(formats=["pythonic"], tools=[{"name": "sum"}], variables_pattern=r"([ab])=(\d+)",
                                      injected=["a", "b"]))
    injecting.reset("a=37 b=45? sum()>", {"answer": "82"})
    assert injecting.step("sum()").observation == "<tool_response>82</tool_response>"
    assert injecting.step("sum(b=1)").observation == "<tool_response>38</tool_response>"  # the call's own win


def test_episode_turns_and_tool_calls_become_typed_samples_and_chat_rows(char_tokenizer_dir: Path,
                                                                        tmp_path: Path) -> None:
    """A recorded step of scripted episodes: each sample holds its turns (who, role, text, tokens, timing) and tool
    calls (tool, arguments, result); written to samples.jsonl and read back, they become SFT chat rows and a DPO
    pair at the first model turn where two episodes part, which the offline readers load."""
    batch, tok = episodes(char_tokenizer_dir, [0, 1, 3], max_turns=3)
    rewards = score_samples(REWARDS.build({"name": "env_score"}), decode_samples(batch, tok), RewardRunConfig())
    plan = StepPlan(shard_rows=[3], rank_rows=[torch.arange(3)], response_width=batch.response_ids_BR.shape[1],
                    metrics={})
    recorded = sample_traces(TraceRequest(step=1, prompts=3, rollout_workers=1), [batch], [rewards], plan, tok)
    tool_user, guesser, mistaken = recorded.samples
    turns = tool_user.outputs.turns
    assert [(t.turn, t.who, t.role, t.text, t.tokens, t.reward) for t in turns] == [
        (1, "model", "assistant", "add(37,45)", 11, None), (1, "env", "tool", "=82>", 4, 0.3),
        (2, "model", "assistant", "82", 3, None), (2, "env", "user", "", 0, 1.0)]  # the final answer's reply ends it
    assert sum(t.tokens for t in turns) == tool_user.outputs.response_tokens
    assert all(t.at_s >= 0 and t.seconds >= 0 for t in turns) and turns[2].at_s >= turns[1].at_s
    [call] = turns[0].tool_calls
    assert (call.tool, call.arguments, call.result, call.ok) == ("add", [37, 45], "82", True)
    assert "env_trace" not in tool_user.inputs.extras  # moved to outputs.turns, not kept twice
    assert [(t.who, t.role) for t in guesser.outputs.turns] == [("model", "assistant"), ("env", "user")]
    [bad] = mistaken.outputs.turns[0].tool_calls
    assert (bad.tool, bad.arguments, bad.ok, bad.result) == ("add", [37], False, "bad arguments for add: b: Field required")

    # The mistaken episode as a worse sample of the tool user's prompt: a preference pair at their first turn.
    path = tmp_path / "samples.jsonl"
    both = [tool_user, mistaken.model_copy(update={"inputs": mistaken.inputs.model_copy(update={"group": 0})})]
    path.write_text("".join(s.model_dump_json() + "\n" for s in [*both, guesser]))
    samples = read_samples(path)
    assert samples[0] == tool_user
    prompt = tool_user.inputs.prompt
    assert sft_rows(samples, min_reward=1.0) == [{"messages": [
        {"role": "user", "content": prompt}, {"role": "assistant", "content": "add(37,45)"},
        {"role": "tool", "content": "=82>"}, {"role": "assistant", "content": "82"}]}]
    pairs = dpo_rows(samples)
    assert pairs == [{"prompt": [{"role": "user", "content": prompt}], "chosen": "add(37,45)", "rejected": "add(37)"}]
    for kind, rows in (("sft", sft_rows(samples, 1.0)), ("preference", pairs)):
        out = tmp_path / f"{kind}.jsonl"
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert len(load_records(out, kind)) == 1  # type: ignore[arg-type]


def test_a_pair_parts_at_a_model_turn_or_not_at_all() -> None:
    user, said = {"role": "user", "content": "q"}, lambda role, text: {"role": role, "content": text}
    a = [user, said("assistant", "c()"), said("tool", "=1"), said("assistant", "1")]
    assert first_divergence(a, [*a[:3], said("assistant", "2")]) == 3  # the shared call and reply are the prompt
    assert first_divergence(a, [*a[:2], said("tool", "=2"), said("assistant", "2")]) is None  # the env parted them
    assert first_divergence(a, a[:2]) is None and first_divergence(a, a) is None
