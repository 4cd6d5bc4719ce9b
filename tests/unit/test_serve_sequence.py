"""Stop handling of one choice: stop strings cut the text, a streamed text never shows a stop string's beginning,
the text is decoded only when it is needed, and EOS / ``max_tokens`` finish as the batcher's tensors say."""

from __future__ import annotations

import torch

from toolbox.serving.sampling import Choice
from toolbox.serving.sequence import Delta, SamplingParams, Sequence

EOS = 25


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids if i != EOS)


class LetterChoice:
    """A sequence over a letter tokenizer (token i is the i-th letter), counting its full decodes."""

    def __init__(self, stop: tuple[str, ...] = (), stream: bool = False, max_tokens: int = 50,
                 ignore_eos: bool = False) -> None:
        self.decodes = 0
        self.events: list[Delta | BaseException] = []

        def decode(ids: list[int]) -> str:
            self.decodes += 1
            return letters(ids)

        self.seq = Sequence([0], SamplingParams(max_tokens, stop=stop, ignore_eos=ignore_eos), torch.Generator(),
                            self.events.append, decode, EOS, stream, None, lambda t: letters([t]))

    def feed(self, text: str) -> list[Delta | None]:
        """Each letter as a token, the batcher's way: record, then advance when ended or watched."""
        out = []
        for ch in text:
            token = ord(ch) - ord("a")
            self.seq.record(token, -1.0)
            ended = self.seq.ended_by(token)
            out.append(self.seq.advance(ended) if ended or self.seq.watched else None)
        return out


def test_a_stop_string_cuts_the_text_and_finishes() -> None:
    choice = LetterChoice(stop=("cd", "zz"))
    deltas = choice.feed("abcd")
    assert deltas[:3] == [None, None, None]
    assert deltas[3] is not None and deltas[3].finish == "stop" and choice.seq.text == "ab"


def test_the_text_is_decoded_only_when_a_stop_string_could_end() -> None:
    choice = LetterChoice(stop=("xd",))
    choice.feed("abcabcab")
    assert choice.decodes == 0  # no "d" yet: no token could complete "xd"
    choice.feed("d")
    assert choice.decodes == 1 and not choice.seq.done  # "...bd" is no stop
    plain = LetterChoice()
    plain.feed("abcabc")
    assert plain.decodes == 0 and plain.seq.text == ""  # neither streamed nor stopped: nothing decoded yet


def test_a_streamed_text_holds_back_what_could_begin_a_stop_string() -> None:
    choice = LetterChoice(stop=("bcd",), stream=True)
    texts = [d.text if d else None for d in choice.feed("abcx")]
    assert texts == ["a", "", "", "bcx"]  # "b", "bc" might begin "bcd"; "bcx" cannot
    done = choice.feed("bcd")[-1]
    assert done is not None and done.finish == "stop" and choice.seq.text == "abcx"


def test_eos_finishes_unless_ignored_and_max_tokens_finishes_with_length() -> None:
    eos = chr(ord("a") + EOS)
    stopped = LetterChoice(max_tokens=3)
    assert stopped.feed("a" + eos)[-1] == Delta("a", stopped.seq.last_choice(), "stop")
    ignored = LetterChoice(max_tokens=3, ignore_eos=True)
    last = ignored.feed("a" + eos + "b")[-1]
    assert last is not None and last.finish == "length" and ignored.seq.text == "ab"
    assert len(ignored.seq.token_ids) == 3


def test_the_engine_replay_appends_and_tells_the_listener_every_token() -> None:
    choice = LetterChoice(stop=("c",))
    choice.seq.append(Choice(0, -1.0, []))
    choice.seq.append(Choice(2, -1.0, []), ended="length")  # the stop string wins over the engine's own finish
    assert [d.finish for d in choice.events if isinstance(d, Delta)] == [None, "stop"]
    assert choice.seq.text == "a"
