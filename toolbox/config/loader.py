"""Load an `ExperimentConfig` from YAML files and ``a.b.c=value`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from toolbox.config.schema import ExperimentConfig
from toolbox.core.errors import ConfigError
from toolbox.core.paths import CONFIG_DIR, DEFAULT_EXPERIMENT, experiment_path
from toolbox.core.registry import format_validation_error


class Replace(dict):  # type: ignore[type-arg]
    """A mapping given whole on the command line (``reward.spec={name: exact_match}``): it replaces the value
    it lands on instead of being merged into it."""


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}``; values are parsed as YAML scalars/lists.

    A mapping value comes back as a `Replace`, so `merge` puts it in place of the old value.
    """
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {arg!r} is not of the form a.b.c=value")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override {key}: cannot parse {raw!r}: {err}") from None
        if isinstance(value, dict):
            value = Replace(value)
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {key}: {part} is set to a value and also used as a section")
            node = child
        node[parts[-1]] = value
    return out


def schema_default(path: str) -> Any:
    """The schema's default of the field at dotted ``path`` (``rollout.engine``, ``callbacks``); None if no such field."""
    model: Any = ExperimentConfig
    value: Any = None
    for part in path.split("."):
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        value = field.get_default(call_default_factory=True)
        model = field.annotation
    return value


def default_name(path: str) -> str | None:
    """The ``name`` a named section (``algorithm``, ``task``, ``rollout.engine``, ...) has when a config omits it."""
    value = schema_default(path)
    name = value.get("name") if isinstance(value, dict) else getattr(value, "name", None)
    return name if isinstance(name, str) else None


def merge(base: dict[str, Any], over: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Recursive dict merge; ``over`` wins. A list index key ('callbacks.0.x') edits that list element.

    A named section whose ``name`` changes (``algorithm.name=online_dpo`` over a GRPO base, or a spec nested
    anywhere: ``reward.spec.components.0.name=format``) is replaced, not merged: the previous component's
    options do not apply to the new one. A `Replace` (a mapping given whole on the command line) replaces
    the old value. An index edit of a list the
    base leaves out edits the schema's default list (``callbacks.0.name=x`` on an experiment without
    ``callbacks``).
    """
    out = dict(base)
    for key, value in over.items():
        where = f"{path}.{key}" if path else key
        current = out[key] if key in out else _default_list(where, value)
        out[key] = _merged(current, value, where)
    return out


def _merged(current: Any, value: Any, where: str) -> Any:
    """``value`` laid over ``current`` (the value at ``where`` before the override)."""
    if isinstance(value, Replace):
        return dict(value)
    if isinstance(current, dict) and isinstance(value, dict):
        return value if _renamed(current, value, where) else merge(current, value, where)
    if isinstance(current, list) and _is_index_edit(value):
        items = list(current)
        for idx, item in value.items():
            i = int(idx)
            if i >= len(items):
                raise ConfigError(f"override {where}.{idx}: {where} has only {len(items)} entries")
            items[i] = _merged(items[i], item, f"{where}.{idx}")
        return items
    return value


def _is_index_edit(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(k, str) and k.isdigit() for k in value)


def _default_list(path: str, value: Any) -> Any:
    """The schema's default list at ``path`` as plain data, when ``value`` edits it by index; else None."""
    default = schema_default(path) if _is_index_edit(value) else None
    if not isinstance(default, list):
        return None
    return [item.model_dump(exclude_unset=True) if isinstance(item, BaseModel) else item for item in default]


def _renamed(current: dict[str, Any], value: dict[str, Any], path: str) -> bool:
    if "name" not in value:
        return False
    return current.get("name", default_name(path)) != value["name"]


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def read_experiment(path: Path, seen: tuple[Path, ...] = (), layers: list[Layer] | None = None) -> dict[str, Any]:
    """An experiment YAML with its ``base:`` experiment (if any) merged underneath it.

    ``layers`` (when given) receives each file's own data, base first, to tell where a value came from.
    """
    if path in seen:
        raise ConfigError(f"{path}: base experiments form a cycle: {' -> '.join(map(str, (*seen, path)))}")
    data = _read_yaml(path)
    base = data.pop("base", None)
    merged = data if base is None else merge(read_experiment(experiment_path(str(base)), (*seen, path), layers), data)
    if layers is not None:
        layers.append((str(path), data))
    return merged


Layer = tuple[str, dict[str, Any]]  # (where it came from, the data it set)


def origin(layers: list[Layer], loc: tuple[Any, ...]) -> str:
    """Where the value at ``loc`` came from: the last layer that set it, something inside it, or the section
    around it (a file, or the command-line override); empty when no layer did (a default)."""
    for depth in (len(loc), len(loc) - 1):
        for where, data in reversed(layers):
            if depth > 0 and _sets(data, loc[:depth]):
                return where
    return ""


def _sets(data: Any, loc: tuple[Any, ...]) -> bool:
    node = data
    for part in loc:
        if isinstance(node, dict) and str(part) in node:
            node = node[str(part)]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return False
    return True


GROUPS = ("data", "algorithm", "model")  # config groups, laid over the experiment in this order


def split_groups(args: list[str]) -> tuple[dict[str, str], list[str]]:
    """``model=NAME`` / ``data=NAME`` / ``algorithm=NAME`` (a bare name or a YAML path, not a mapping) picked out of
    the arguments as group selections; the rest are overrides."""
    groups: dict[str, str] = {}
    rest = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key in GROUPS and value and not value.lstrip().startswith("{"):
            groups[key] = value
        else:
            rest.append(arg)
    return groups, rest


def group_fragment(group: str, name: str) -> tuple[str, dict[str, Any]]:
    """(where it came from, its data) of the fragment ``group=name``: ``configs/GROUP/NAME.yaml`` (or a YAML path).
    A fragment is a partial experiment: it sets whatever sections it needs. ``algorithm=NAME`` without a fragment
    selects the registered algorithm NAME with its defaults."""
    path = Path(name) if Path(name).suffix in {".yaml", ".yml"} else CONFIG_DIR / group / f"{name}.yaml"
    if path.is_file():
        return f"{group}={name} ({path})", _read_yaml(path)
    if group == "algorithm":
        from toolbox.config.algorithm import ALGORITHMS

        if name in ALGORITHMS:
            return f"{group}={name}", {"algorithm": {"name": name}}
    shipped = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
    also = " or a registered algorithm" if group == "algorithm" else ""
    raise ConfigError(f"{group}={name}: no {path}{also}; shipped {group} fragments: {shipped}")


def compose(args: list[str]) -> tuple[dict[str, Any], list[Layer], Path]:
    """The experiment's data from ``experiment=NAME`` (default ``grpo_tiny``), the group fragments (data, then
    algorithm, then model) and the dotted overrides, with the layers that set it (first to last) and its file."""
    groups, rest = split_groups(args)
    overrides = parse_overrides(rest)
    name = str(overrides.pop("experiment", DEFAULT_EXPERIMENT))
    path = experiment_path(name)
    layers: list[Layer] = []
    data = read_experiment(path, layers=layers)
    for group in GROUPS:
        if group in groups:
            where, fragment = group_fragment(group, groups[group])
            data = merge(data, fragment)
            layers.append((where, fragment))
    data = merge(data, overrides)
    data["experiment"] = Path(name).stem
    layers += [(f"command line: {arg}", parse_overrides([arg])) for arg in rest if not arg.startswith("experiment=")]
    return data, layers, path


def load_config(args: list[str] | None = None) -> ExperimentConfig:
    """Build the config from ``experiment=NAME`` (default ``grpo_tiny``), group fragments and dotted overrides."""
    return load_config_with_origins(args)[0]


def load_config_with_origins(args: list[str] | None = None) -> tuple[ExperimentConfig, list[Layer]]:
    """`load_config`, and the layers that set it: `origin` tells where any value came from."""
    data, layers, path = compose(args or [])
    try:
        return ExperimentConfig.model_validate(data), layers
    except ValidationError as err:
        message = format_validation_error(err, "", origin=lambda loc: origin(layers, loc))
        raise ConfigError(f"experiment {path}: {message}") from None


def origins(cfg: ExperimentConfig, layers: list[Layer]) -> list[tuple[str, Any, str]]:
    """(dotted path, value, where it came from: a file, a group, the command line, or ``default``) of every leaf:
    the last layer that set it (a value a later layer's switch of ``name`` threw away is still named after it)."""
    out: list[tuple[str, Any, str]] = []

    def walk(node: Any, loc: tuple[Any, ...]) -> None:
        if isinstance(node, dict) and node:
            for key, child in node.items():
                walk(child, (*loc, key))
        elif isinstance(node, list) and node and any(isinstance(x, dict) for x in node):
            for i, child in enumerate(node):
                walk(child, (*loc, i))
        else:
            where = next((w for w, data in reversed(layers) if _sets(data, loc)), "default")
            out.append((".".join(map(str, loc)), node, where))

    walk(cfg.model_dump(mode="json"), ())
    return out


def dump_config(cfg: ExperimentConfig, path: Path) -> None:
    """Write the resolved config, the exact input to reproduce the run."""
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
