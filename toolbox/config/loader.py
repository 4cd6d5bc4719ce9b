"""Load an `ExperimentConfig` from YAML files and ``a.b.c=value`` overrides."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.core.registry import format_validation_error

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


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


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}``; values are parsed as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {arg!r} is not of the form a.b.c=value")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {key}: cannot parse {raw!r}: {err}") from None
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is set to a value and also used as a section")
            node = child
        node[parts[-1]] = value
    return out


def default_name(path: str) -> str | None:
    """The ``name`` a named section (``algorithm``, ``task``, ``rollout.engine``, ...) has when a config omits it."""
    model: Any = ExperimentConfig
    value: Any = None
    for part in path.split("."):
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        value = field.get_default(call_default_factory=True)
        model = field.annotation
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return name if isinstance(name, str) else None


def merge(base: dict[str, Any], over: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Recursive dict merge; ``over`` wins. A list index key ('callbacks.0.x') edits that list element.

    A named section whose ``name`` changes (``algorithm.name=online_dpo`` over a GRPO base) is replaced,
    not merged: the previous component's options do not apply to the new one.
    """
    out = dict(base)
    for key, value in over.items():
        current = out.get(key)
        where = f"{path}.{key}" if path else key
        if isinstance(current, dict) and isinstance(value, dict) and _renamed(current, value, where):
            out[key] = value
        elif isinstance(current, dict) and isinstance(value, dict):
            out[key] = merge(current, value, where)
        elif isinstance(current, list) and isinstance(value, dict) and all(k.isdigit() for k in value):
            items = list(current)
            for idx, item in value.items():
                i = int(idx)
                if i >= len(items):
                    raise ConfigError(f"override {key}.{idx}: {key} has only {len(items)} entries")
                items[i] = merge(items[i], item) if isinstance(items[i], dict) and isinstance(item, dict) else item
            out[key] = items
        else:
            out[key] = value
    return out


def _renamed(current: dict[str, Any], value: dict[str, Any], path: str) -> bool:
    if "name" not in value:
        return False
    return current.get("name", default_name(path)) != value["name"]


def with_defaults(model: type[BaseModel], data: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``data`` plus the schema default of every spec dict or list that ``over`` edits inside but ``data`` omits.

    Without this, ``callbacks.0.name=x`` or ``rollout.engine.max_batch_size=64`` on an experiment that
    leaves those fields at their defaults would replace the whole default instead of editing it.
    """
    out = dict(data)
    for key, value in over.items():
        field = model.model_fields.get(key)
        if field is None or not isinstance(value, dict):
            continue
        ann = field.annotation
        if inspect.isclass(ann) and issubclass(ann, BaseModel):
            current = out.get(key)
            if current is None or isinstance(current, dict):
                sub = with_defaults(ann, current or {}, value)
                if sub or key in out:
                    out[key] = sub
        elif key not in out:
            default = field.get_default(call_default_factory=True)
            if isinstance(default, (dict, list)):
                out[key] = default
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def read_experiment(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """An experiment YAML with its ``base:`` experiment (if any) merged underneath it."""
    if path in seen:
        raise ConfigError(f"{path}: base experiments form a cycle: {' -> '.join(map(str, (*seen, path)))}")
    data = _read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    return merge(read_experiment(experiment_path(str(base)), (*seen, path)), data)


def load_config(args: list[str] | None = None) -> ExperimentConfig:
    """Build the config from ``experiment=NAME`` (default ``grpo_tiny``) and dotted overrides."""
    overrides = parse_overrides(args or [])
    name = str(overrides.pop("experiment", "grpo_tiny"))
    path = experiment_path(name)
    data = read_experiment(path)
    data = merge(with_defaults(ExperimentConfig, data, overrides), overrides)
    data["experiment"] = Path(name).stem
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{path}: " + format_validation_error(err, "")) from None


def dump_config(cfg: ExperimentConfig, path: Path) -> None:
    """Write the resolved config, the exact input to reproduce the run."""
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
