"""Secrets: the http engine's ``api_key`` never reaches config.yaml, `toolbox config` or a tracker."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolbox.callbacks.trackers import tracked_config
from toolbox.commands.cli import main as cli_main
from toolbox.config import load_config
from toolbox.config.loader import dump_config
from toolbox.core.errors import ConfigError

KEY = "sk-live-0123456789"
HTTP = ["rollout.engine.name=http", f"rollout.engine.api_key={KEY}"]


def test_saved_config_and_trackers_mask_the_key(tmp_path: Path) -> None:
    cfg = load_config(HTTP)
    assert cfg.rollout.engine.api_key.get_secret_value() == KEY  # type: ignore[attr-defined]
    dump_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert KEY not in text and "api_key: '**********'" in text
    assert KEY not in str(tracked_config(tmp_path))
    # The placeholder of local servers is no secret: a config with it reloads as it was.
    dump_config(load_config(["rollout.engine.name=http"]), tmp_path / "plain.yaml")
    assert load_config([f"experiment={tmp_path / 'plain.yaml'}"]).rollout.engine.api_key.get_secret_value() == "EMPTY"  # type: ignore[attr-defined]


def test_a_reloaded_masked_key_is_refused_with_the_fix(tmp_path: Path) -> None:
    dump_config(load_config(HTTP), tmp_path / "config.yaml")
    with pytest.raises(ConfigError, match=r"rollout.engine.api_key: Value error, this is the mask a saved config shows "
                                          r"in place of the key.*set rollout.engine.api_key_env"):
        load_config([f"experiment={tmp_path / 'config.yaml'}"])
    ok = load_config([f"experiment={tmp_path / 'config.yaml'}", "rollout.engine.api_key_env=MY_KEY",
                      "rollout.engine.api_key=EMPTY"])
    assert ok.rollout.engine.api_key_env == "MY_KEY"  # type: ignore[attr-defined]


def test_toolbox_config_prints_it_masked(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["config", *HTTP]) == 0
    out = capsys.readouterr().out
    assert KEY not in out and "api_key: '**********'" in out
