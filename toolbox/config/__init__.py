"""Experiment configs: `load_config` (YAML files + dotted overrides) into an `ExperimentConfig`.

Both are imported on first use (PEP 562): the entry point reads `toolbox.core.paths` before the schema, and
torch with it, is imported (`toolbox.driver.local_ray`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolbox.config.loader import load_config
    from toolbox.config.schema import ExperimentConfig

__all__ = ["ExperimentConfig", "load_config"]


def __getattr__(name: str) -> Any:
    if name == "load_config":
        from toolbox.config.loader import load_config

        return load_config
    if name == "ExperimentConfig":
        from toolbox.config.schema import ExperimentConfig

        return ExperimentConfig
    raise AttributeError(f"module 'toolbox.config' has no attribute {name!r}")
