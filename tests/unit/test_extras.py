"""A missing optional package is one line naming the extra that installs it, at the place that needs it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from toolbox.commands import cli
from toolbox.core.errors import ConfigError
from toolbox.core.extras import EXTRAS, missing_extra, require
from toolbox.envs.config import EnvConfig


def test_serve_without_its_extra_says_which_to_install(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` now raises ModuleNotFoundError
    assert cli.main(["serve", "model=/nowhere"]) == 1
    err = capsys.readouterr().err
    assert err == "toolbox serve needs the 'serve' extra: pip install 'toolbox[serve]' (uvicorn is not installed)\n"


@pytest.mark.parametrize(("module", "argv", "line"), [
    ("peft", ["config", "learner.lora={r: 8}"],
     "config error: learner.lora needs the 'lora' extra: pip install 'toolbox[lora]' (peft is not installed)"),
    ("wandb", ["config", "callbacks=[{name: wandb}]"],
     "callbacks.0: Value error, the wandb callback needs the 'wandb' extra: pip install 'toolbox[wandb]' (wandb is "
     "not installed)"),
    ("mlflow", ["config", "callbacks=[{name: mlflow}]"],
     "callbacks.0: Value error, the mlflow callback needs the 'mlflow' extra: pip install 'toolbox[mlflow]' (mlflow "
     "is not installed)"),
    ("gguf", ["model", "import", "model.gguf", "out"],
     "toolbox model import: reading a GGUF file needs the 'gguf' extra: pip install 'toolbox[gguf]' (gguf not "
     "installed)"),
])
def test_each_extra_missing_is_one_line_naming_it(module: str, argv: list[str], line: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The package is hidden (``import`` raises ModuleNotFoundError, ``find_spec`` finds nothing) and the command a
    user would type runs: it fails, with the extra named on one line of stderr and nothing else said."""
    monkeypatch.setitem(sys.modules, module, None)
    assert cli.main(argv) in (1, 2)
    out, err = capsys.readouterr()
    assert out == "" and any(line in row for row in err.splitlines()), err


def test_a_missing_tensorboard_names_its_extra_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The tensorboard callback is a default one: without the package the run still runs, and says what to install."""
    from toolbox.callbacks.files import TensorBoardConfig, TensorBoardMetrics

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    assert TensorBoardMetrics(TensorBoardConfig(), tmp_path).writer is None
    assert "the tensorboard callback needs the 'tensorboard' extra: pip install 'toolbox[tensorboard]'" in caplog.text


def test_every_documented_extra_is_named_and_real() -> None:
    assert {"serve", "lora", "wandb", "mlflow", "mujoco", "box2d", "gguf"} <= set(EXTRAS.values())
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert set(EXTRAS.values()) <= set(extras)


def test_an_unknown_module_keeps_its_traceback() -> None:
    assert missing_extra(ModuleNotFoundError(name="not_an_extra"), "x") is None
    assert missing_extra(ModuleNotFoundError(name="peft.tuners"), "learner.lora") == (
        "learner.lora needs the 'lora' extra: pip install 'toolbox[lora]' (peft is not installed)")


def test_require_checks_before_anything_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.core import extras

    monkeypatch.setattr(extras, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^model.gguf_file needs the 'gguf' extra: pip install 'toolbox\[gguf\]' "
                                          r"\(gguf is not installed\)$"):
        require("gguf", "model.gguf_file")


def test_a_mujoco_env_without_mujoco_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium as gym

    from toolbox.envs.make import make_env

    def not_installed(*args: object, **kwargs: object) -> None:
        raise gym.error.DependencyNotInstalled('MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`')

    monkeypatch.setattr(gym, "make", not_installed)
    with pytest.raises(ConfigError, match=r"^env.id=HalfCheetah-v5 needs the 'mujoco' extra: pip install "
                                          r"'toolbox\[mujoco\]' \(MuJoCo is not installed"):
        make_env(EnvConfig(id="HalfCheetah-v5"))
    with pytest.raises(ConfigError, match=r"^env.id=LunarLander-v3 needs the 'box2d' extra"):
        make_env(EnvConfig(id="LunarLander-v3"))


def test_train_is_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import toolbox.commands.run

    seen: list[list[str]] = []
    monkeypatch.setattr(toolbox.commands.run, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["train", "experiment=sft_tiny"]) == 0 and seen == [["experiment=sft_tiny"]]
