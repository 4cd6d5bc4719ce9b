"""`toolbox.models`: the char tokenizer round-trips text, and tiny models are deterministic and loadable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.models.loading import TinyModelConfig, load_causal_lm, load_tokenizer
from toolbox.models.tiny import TINY_CACHE_ENV, build_char_tokenizer, ensure_tiny_model


@pytest.mark.parametrize("text", ["12+30=42", "abcd>dcba", "7", "0+0+0="])
def test_char_tokenizer_round_trip(text: str) -> None:
    tok = build_char_tokenizer("0123456789+=abcd>")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    # Decoding must not put spaces between characters: rewards compare the decoded text ("12" is not "1 2").
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_saved_tokenizer_decodes_the_same(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(str(tiny_model_dir))
    ids = tok("13+4=17", add_special_tokens=False)["input_ids"]
    assert tok.batch_decode([ids]) == ["13+4=17"]
    assert tok.pad_token_id is not None and tok.eos_token_id is not None and tok.pad_token_id != tok.eos_token_id


def test_tiny_model_is_deterministic_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TINY_CACHE_ENV, raising=False)  # both built here, not one copied from the other
    cfg = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32, seed=3)
    a = ensure_tiny_model(tmp_path / "a", cfg, "0123456789+=")
    b = ensure_tiny_model(tmp_path / "b", cfg, "0123456789+=")
    assert ensure_tiny_model(a, cfg.model_copy(update={"seed": 99}), "xyz") == a  # already there: reused as is
    sa, sb = load_causal_lm(str(a)).state_dict(), load_causal_lm(str(b)).state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not list(tmp_path.glob(".tiny-*"))  # the temp directory was renamed into place


def test_the_driver_builds_a_tiny_model_in_a_child_without_loading_the_modeling_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``apart=True`` in a process that has not loaded transformers' modeling code: the model is built by a child
    process (the same weights as built in place), and the calling process still has not loaded that code."""
    monkeypatch.delenv(TINY_CACHE_ENV, raising=False)
    import json
    import subprocess
    import sys

    cfg = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32, seed=3)
    script = ("import json, sys; from toolbox.models.loading import TinyModelConfig; "
              "from toolbox.models.tiny import ensure_tiny_model; "
              "ensure_tiny_model(sys.argv[1], TinyModelConfig.model_validate_json(sys.argv[2]), '0123456789+=', "
              "apart=True); print(json.dumps('transformers.modeling_utils' in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "apart"), cfg.model_dump_json()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) is False
    here = ensure_tiny_model(tmp_path / "here", cfg, "0123456789+=")  # built in this process
    sa, sb = load_causal_lm(str(tmp_path / "apart")).state_dict(), load_causal_lm(str(here)).state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_tiny_cache_builds_each_model_once_and_copies_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``$TOOLBOX_TINY_CACHE`` every asked path gets a copy of the one model built in the cache for its
    sizes, seed and alphabet; another alphabet is another model."""
    from toolbox.models import causal_lm

    monkeypatch.setenv(TINY_CACHE_ENV, str(tmp_path / "cache"))
    cfg = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32, seed=3)
    a = ensure_tiny_model(tmp_path / "runs1" / "a", cfg, "0123456789+=")
    built = []
    monkeypatch.setattr(causal_lm.HFFamily, "save_tiny", lambda *args: built.append(args))
    b = ensure_tiny_model(tmp_path / "runs2" / "b", cfg, "0123456789+=")
    assert built == [], "the second path was built, not copied from the cache"
    sa, sb = load_causal_lm(str(a)).state_dict(), load_causal_lm(str(b)).state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    monkeypatch.undo()
    monkeypatch.setenv(TINY_CACHE_ENV, str(tmp_path / "cache"))
    ensure_tiny_model(tmp_path / "runs3" / "c", cfg, "abc")
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert not list(tmp_path.glob("*/.tiny-*"))  # every temp directory was renamed into place


def test_unknown_arch_fails_in_config_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"model\.tiny\.arch: Input should be 'qwen2' or 'llama'"):
        load_config(["model.tiny.arch=gpt9"])


def test_tiny_char_tokenizer_keeps_spaces_after_a_round_trip(tmp_path) -> None:  # noqa: ANN001
    """transformers 5 would hand a qwen2 directory its own Qwen2Tokenizer, which drops the spaces of word problems."""
    from toolbox.models.loading import TinyModelConfig, load_tokenizer
    from toolbox.models.tiny import ensure_tiny_model

    path = ensure_tiny_model(tmp_path / "tiny", TinyModelConfig(), "ab1 ?")
    tok = load_tokenizer(str(path))
    ids = tok("a 1?", add_special_tokens=False)["input_ids"]
    assert len(ids) == 4 and tok.decode(ids) == "a 1?"
