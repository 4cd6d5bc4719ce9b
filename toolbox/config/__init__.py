"""The experiment config: pydantic sections composed into one `ExperimentConfig`, YAML + dotted overrides."""

from toolbox.config.loader import load_config
from toolbox.config.schema import ExperimentConfig

__all__ = ["ExperimentConfig", "load_config"]
