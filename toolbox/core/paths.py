"""Where experiment and sweep YAMLs live, and which file an ``experiment=`` names. Imports nothing heavy: the entry
point reads the experiment files before the config schema (and torch with it) is imported (`toolbox.driver.local_ray`)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from toolbox.core.errors import ConfigError

DEFAULT_EXPERIMENT = "grpo_tiny"  # what runs when no experiment= is given


def _config_dir() -> Path:
    """Where the shipped experiment and sweep YAMLs are.

    An installed wheel carries them as package data in ``toolbox/configs/``; a source checkout (and an editable
    install of it) reads the repository's top-level ``configs/``, their one source of truth (setup.py maps it).
    """
    packaged = Path(str(files("toolbox") / "configs"))
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "configs"


CONFIG_DIR = _config_dir()


def experiment_path(name: str) -> Path:
    """``configs/experiments/NAME.yaml``, or ``name`` itself when it is a path to a YAML file."""
    path = Path(name)
    if path.suffix in {".yaml", ".yml"}:
        if not path.exists():
            raise ConfigError(f"experiment={name}: file not found")
        return path
    path = CONFIG_DIR / "experiments" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / "experiments").glob("*.yaml"))
        raise ConfigError(f"experiment={name}: no {path}; known experiments: {known}")
    return path
