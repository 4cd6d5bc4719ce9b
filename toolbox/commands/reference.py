"""The generated reference pages: docs/configuration.md (every config field with its type, default and description,
each registry-selected section expanded per entry) and docs/components.md (every name a config can select), written
by ``toolbox docs`` and checked against the checkout by tests/unit/test_docs.py."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from toolbox.core.registry import Registry, SpecOf

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    return text or str(annotation).replace("typing.", "").replace("toolbox.", "")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


Row = tuple[str, str, str, str]


def config_rows(model: type[BaseModel], prefix: str = "", expanding: tuple[Registry[Any], ...] = ()) -> list[Row]:
    """(path, type, default, description) for every field, recursing into sub-models.

    ``expanding`` holds the registries whose entries are being listed above this model: a spec nested in one of
    its own entries (``weighted_sum.components``) gets one row, not an endless expansion.
    """
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        if _selects_by_name(field) is not None:
            rows += _variant_rows(path, field, expanding)
            continue
        subs = _models_in(field.annotation)
        default = "" if field.is_required() else repr(field.get_default(call_default_factory=True))
        if subs and not isinstance(field.annotation, types.UnionType) and len(subs) == 1:
            rows.append((path, subs[0].__name__, "", field.description or ""))
            rows += config_rows(subs[0], path + ".", expanding)
            continue
        rows.append((path, _type_name(field.annotation), default if len(default) < 60 else "(see below)",
                     field.description or ""))
        for sub in subs:
            rows += config_rows(sub, f"{path}[{sub.__name__}].", expanding)
    return rows


def _variant_rows(path: str, field: FieldInfo, expanding: tuple[Registry[Any], ...]) -> list[Row]:
    """A section whose class the registry picks by ``name`` (algorithm, engine, reward, task, callbacks):
    one row naming the choices and the default, then each entry's options (``path[name=x].option``)."""
    registry = _selects_by_name(field)
    assert registry is not None
    many = typing.get_origin(field.annotation) is list
    kind = ("list, each " if many else "") + "one of " + ", ".join(registry.names())
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    names = [d.name for d in default] if many and default is not None else getattr(default, "name", None)
    rows = [(path, kind, "" if default is None else repr(names), field.description or "")]
    if registry in expanding:
        return rows
    item = f"{path}.<i>" if many else path
    for tag in registry.names():
        rows += [row for row in config_rows(registry.spec_model(tag), f"{item}[name={tag}].", (*expanding, registry))
                 if row[0] != f"{item}[name={tag}].name"]
    return rows


def _selects_by_name(field: FieldInfo) -> Registry[Any] | None:
    """The registry a field (or its list items) selects from by ``name``: a `SpecOf` field, or the algorithm."""
    from toolbox.config.algorithm import AlgorithmConfig

    if _models_in(field.annotation) == [AlgorithmConfig]:
        from toolbox.algorithms import ALGORITHMS

        return ALGORITHMS
    for meta in [*field.metadata, *_metadata_in(field.annotation)]:
        if isinstance(meta, SpecOf):
            return meta.registry
    return None


def _metadata_in(annotation: Any) -> list[Any]:
    """Every ``Annotated`` metadata object inside ``annotation`` (``list[Annotated[X, m]]`` -> [m])."""
    out: list[Any] = list(getattr(annotation, "__metadata__", ()))
    for arg in typing.get_args(annotation):
        out += _metadata_in(arg)
    return out


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def registries() -> dict[str, Any]:
    from toolbox import engines, rewards  # noqa: F401
    from toolbox.agents.env import TEXT_ENVS
    from toolbox.agents.tools import TOOLS
    from toolbox.algorithms import ALGORITHMS
    from toolbox.callbacks import CALLBACKS
    from toolbox.data.tasks import TASKS
    from toolbox.engines import ENGINES
    from toolbox.learner.optimizers import OPTIMIZERS
    from toolbox.models.causal_lm import MODELS
    from toolbox.objectives.registry import LOSS_FAMILIES
    from toolbox.rewards import REWARDS
    from toolbox.rl.advantages import ADVANTAGES

    return {"algorithm": ALGORITHMS, "model": MODELS, "engine": ENGINES, "reward": REWARDS, "task": TASKS,
            **{f"{family} loss": losses for family, losses in LOSS_FAMILIES.items()}, "advantage": ADVANTAGES,
            "optimizer": OPTIMIZERS, "callback": CALLBACKS, "text_env": TEXT_ENVS, "tool": TOOLS}


def components_markdown() -> str:
    parts = ["# Component catalog\n\nGenerated by `toolbox docs`; every name a config can select.\n"]
    for kind, registry in registries().items():
        rows = []
        for name in registry.names():
            entry = registry.get(name)
            doc = (inspect.getdoc(entry.factory) or "").split("\n")[0]
            options = ", ".join(entry.config.model_fields) if entry.config else ""
            rows.append((f"`{name}`", doc, options))
        parts.append(f"## {kind}\n\n" + _table(rows, ("name", "what", "options")) + "\n")
    return "\n".join(parts)


def configuration_markdown() -> str:
    from toolbox.config.schema import ExperimentConfig

    rows = [(f"`{p}`", t, f"`{d}`" if d else "", desc) for p, t, d, desc in config_rows(ExperimentConfig)]
    return ("# Configuration reference\n\nGenerated by `toolbox docs` from the pydantic models. "
            "Override any field as `a.b.c=value`; `experiment=NAME` picks configs/experiments/NAME.yaml.\n\n"
            + _table(rows, ("field", "type", "default", "description")) + "\n")
