"""Records -> token ids with a loss mask: prompt tokens are context only, response tokens are targets.

With a chat template (when the tokenizer has one and the config allows it) a record
becomes a conversation and every assistant turn is a target, end-of-turn markers
included; without one, ``prompt`` is tokenised as `PromptSource` tokenises GRPO
prompts and the response is followed by EOS, so a model trained here continues
the same prompts the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Example:
    """One tokenised sequence: ids, and 1 where a token is a training target."""

    input_ids: list[int]
    loss_mask: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    def cut(self, max_length: int) -> Example:
        return Example(self.input_ids[:max_length], self.loss_mask[:max_length])


def uses_template(tokenizer: Any, use_chat_template: bool) -> bool:
    return bool(use_chat_template and getattr(tokenizer, "chat_template", None))


def _render(tokenizer: Any, messages: Messages, generation_prompt: bool) -> list[int]:
    if not messages:
        return []
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def encode_messages(messages: Messages, tokenizer: Any) -> Example:
    """A conversation through the chat template; the tokens each assistant turn adds are targets.

    A turn's span is found by rendering the conversation up to it (with the generation
    prompt) and through it; templates that re-render earlier turns differently are
    handled by taking the common prefix with the full rendering.
    """
    full = _render(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = _common_prefix(full, _render(tokenizer, messages[:i], generation_prompt=True))
        end = _common_prefix(full, _render(tokenizer, messages[: i + 1], generation_prompt=False))
        mask[start:end] = [1] * (end - start)
    return Example(full, mask)


def encode_pair(prompt: str, response: str, tokenizer: Any, use_chat_template: bool) -> Example:
    """One prompt and its response; the response (and what closes it) is the target."""
    if uses_template(tokenizer, use_chat_template):
        return encode_messages([{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenizer)
    prompt_ids = render_prompt(prompt, tokenizer, use_chat_template=False)
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    return Example(prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids))


def render_prompt(prompt: str, tokenizer: Any, use_chat_template: bool, system_prompt: str = "") -> list[int]:
    """A generation prompt's ids: the chat template with its generation prompt when used, else the plain text.

    The one place a prompt becomes ids, for online prompts and offline records alike, so a model trained
    on ``prompt``/``response`` records continues the same prompts the same way.
    """
    if uses_template(tokenizer, use_chat_template):
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return _render(tokenizer, [*system, {"role": "user", "content": prompt}], generation_prompt=True)
    text = f"{system_prompt}\n{prompt}" if system_prompt else prompt
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def encode_text(text: str, tokenizer: Any) -> Example:
    """A raw-text document (pretraining): every token is a target, EOS closes it. No chat template."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"]) + [tokenizer.eos_token_id]
    return Example(ids, [1] * len(ids))


def encode_sft(record: dict[str, Any], tokenizer: Any, max_length: int, use_chat_template: bool = True) -> Example:
    """An SFT record (``prompt``/``response``, ``messages`` or raw ``text``), cut to ``max_length`` tokens."""
    if "text" in record:
        return encode_text(record["text"], tokenizer).cut(max_length)
    if "messages" in record:
        _need_template(tokenizer, use_chat_template)
        example = encode_messages(record["messages"], tokenizer)
    else:
        example = encode_pair(record["prompt"], record["response"], tokenizer, use_chat_template)
    return example.cut(max_length)


def encode_preference(record: dict[str, Any], tokenizer: Any, max_length: int,
                      use_chat_template: bool = True) -> tuple[Example, Example]:
    """A preference record as (chosen, rejected) sequences sharing the prompt, each cut to ``max_length``.

    A record with ``messages`` (the conversation before the answer) needs a chat template.
    """
    if "messages" not in record:
        chosen = encode_pair(record["prompt"], record["chosen"], tokenizer, use_chat_template)
        rejected = encode_pair(record["prompt"], record["rejected"], tokenizer, use_chat_template)
        return chosen.cut(max_length), rejected.cut(max_length)
    _need_template(tokenizer, use_chat_template)
    before: Messages = record["messages"]
    pair = [encode_messages([*before, {"role": "assistant", "content": record[key]}], tokenizer)
            for key in ("chosen", "rejected")]
    return pair[0].cut(max_length), pair[1].cut(max_length)


def _need_template(tokenizer: Any, use_chat_template: bool) -> None:
    if not uses_template(tokenizer, use_chat_template):
        raise ValueError("a 'messages' record needs a tokenizer with a chat template (and use_chat_template: true)")


def check_fits(record: dict[str, Any], kind: str, tokenizer: Any, max_length: int, use_chat_template: bool = True) -> str:
    """Raise `RowError` when a record cannot teach what it says once tokenised and cut to ``max_length``: a
    character the tokenizer cannot encode (it would silently become its unknown token, padding for a char
    tokenizer), a prompt that alone fills ``max_length`` (no target token left), or a preference pair whose
    chosen and rejected sequences are identical once cut. Returns why the record will be cut ("" when it fits)."""
    from toolbox.data.rows import RowError

    unknown_characters(record, tokenizer)
    unlimited = 1 << 30
    if kind == "sft":
        examples = [encode_sft(record, tokenizer, unlimited, use_chat_template)]
    else:
        examples = list(encode_preference(record, tokenizer, unlimited, use_chat_template))
    for example in examples:
        if not any(example.loss_mask[:max_length]):
            first = example.loss_mask.index(1) if 1 in example.loss_mask else len(example)
            raise RowError(f"the prompt is {first} tokens, so nothing of the answer fits in max_length={max_length} "
                           "(raise algorithm.max_length or shorten the prompt)")
    if kind == "preference" and examples[0].cut(max_length) == examples[1].cut(max_length):
        raise RowError(f"chosen and rejected are identical once cut to max_length={max_length} tokens, so the pair "
                       "teaches nothing (raise algorithm.max_length)")
    if "text" in record:
        return ""  # a long document is split into max_length pieces (`text_chunks`), not cut
    longest = max(len(e) for e in examples)
    return f"{longest} tokens, longer than algorithm.max_length={max_length}" if longest > max_length else ""


def unknown_characters(record: dict[str, Any], tokenizer: Any) -> None:
    """Raise `RowError` naming the characters of a record's texts that the tokenizer maps to its unknown token."""
    from toolbox.data.rows import RowError

    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return
    for key, text in record_texts(record):
        if unk in tokenizer(text, add_special_tokens=False)["input_ids"]:
            bad = sorted(c for c in set(text) if unk in tokenizer(c, add_special_tokens=False)["input_ids"])
            raise RowError(f"field {key!r} has characters the tokenizer cannot encode: {''.join(bad)!r} (they would "
                           "become its unknown token; a tiny model's alphabet comes from the task)")


def record_texts(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, text) of every text of a normalised record, message contents included."""
    out = [(k, v) for k, v in record.items() if isinstance(v, str)]
    out += [(f"messages[{i}]", m["content"]) for i, m in enumerate(record.get("messages", []))]
    return out
