"""Optional dependencies and the extra that installs each: a missing one is said in one line naming the extra.

`EXTRAS` maps a top-level module to the ``pyproject.toml`` extra that brings it. `missing_extra` turns a
`ModuleNotFoundError` for one of them into that line (``None`` for a module no extra provides: a real bug,
which keeps its traceback); `require` checks at start, before anything loads.
"""

from __future__ import annotations

from importlib.util import find_spec

from toolbox.core.errors import ConfigError

EXTRAS: dict[str, str] = {
    "uvicorn": "serve", "fastapi": "serve",
    "peft": "lora",
    "wandb": "wandb",
    "mlflow": "mlflow", "sqlalchemy": "mlflow", "alembic": "mlflow",
    "mujoco": "mujoco",
    "Box2D": "box2d", "pygame": "box2d",
    "gguf": "gguf", "accelerate": "gguf",
    "tensorboard": "tensorboard",
    "optuna": "optuna",
    "trl": "bench",
}


def install_hint(extra: str) -> str:
    return f"pip install 'toolbox[{extra}]'"


def missing_extra(err: ModuleNotFoundError, what: str) -> str | None:
    """``"<what> needs the 'serve' extra: pip install 'toolbox[serve]' (uvicorn is not installed)"`` when ``err``
    is about a module an extra provides; else ``None``."""
    module = (err.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    return None if extra is None else needs_extra(what, extra, f"{module} is not installed")


def needs_extra(what: str, extra: str, why: str) -> str:
    """The one line: what needs which extra, how to install it, and why (what is missing)."""
    return f"{what} needs the {extra!r} extra: {install_hint(extra)} ({why})"


def require(module: str, what: str) -> None:
    """A `ConfigError` in `missing_extra`'s words when ``module`` (one of `EXTRAS`) is not installed."""
    if find_spec(module) is None:
        raise ConfigError(missing_extra(ModuleNotFoundError(name=module), what) or f"{what} needs {module}")
