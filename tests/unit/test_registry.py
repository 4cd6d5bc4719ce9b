"""`toolbox.core.registry`: duplicate names, dependency injection, option validation, entry-point plugins."""

from __future__ import annotations

import re
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError

from toolbox.core import registry as registry_mod
from toolbox.core.errors import ConfigError, RegistryError
from toolbox.core.registry import Registry, Spec, SpecOf


class ScaleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    factor: float = Field(2.0, gt=0, description="Multiplier.")
    label: str = Field("x", description="A name.")


def make_registry() -> Registry:
    reg: Registry = Registry("widget")

    @reg.register("scale", config=ScaleConfig)
    def scale(config: ScaleConfig, model_path: str) -> dict[str, Any]:
        return {"config": config, "model_path": model_path}

    @reg.register("flat", config=ScaleConfig)
    def flat(factor: float, label: str) -> dict[str, Any]:
        return {"factor": factor, "label": label}

    @reg.register("plain")
    def plain(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    return reg


WIDGETS = make_registry()


@pytest.fixture(autouse=True)
def no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registry lookups load plugins once; keep the real environment's entry points out of these tests."""
    monkeypatch.setattr(registry_mod, "_plugins_loaded", True)


def first_widget() -> None:
    """A function whose qualified name shows up in the duplicate message."""


def second_widget() -> None:
    """Another one."""


def test_duplicate_name_refused_naming_both() -> None:
    reg: Registry = Registry("widget")
    reg.register("a")(first_widget)
    with pytest.raises(RegistryError) as info:
        reg.register("a")(second_widget)
    msg = str(info.value)
    assert "'a' is already registered" in msg
    assert f"{__name__}.first_widget" in msg and f"{__name__}.second_widget" in msg
    assert reg.get("a").factory is first_widget


def test_unknown_name_lists_registered() -> None:
    with pytest.raises(RegistryError, match=r"unknown widget 'nope'; registered: flat, plain, scale"):
        make_registry().get("nope")


def test_build_injects_only_accepted_deps() -> None:
    reg = make_registry()
    out = reg.build({"name": "scale", "factor": 3.0}, inject={"model_path": "/m", "seed": 7})
    assert out["model_path"] == "/m" and out["config"] == ScaleConfig(factor=3.0)
    # A factory without a `config` parameter gets validated options as keyword arguments.
    assert reg.build({"name": "flat"}, inject={"model_path": "/m"}) == {"factor": 2.0, "label": "x"}
    # No config model: no options; **kwargs does not name any injected dependency.
    assert reg.build({"name": "plain"}, inject={"seed": 1}) == {}
    with pytest.raises(ValidationError, match=r"widget 'plain' takes no options, got \['a'\]"):
        reg.build({"name": "plain", "a": 1})


def test_build_accepts_a_typed_spec() -> None:
    reg = make_registry()
    spec = reg.parse({"name": "scale", "factor": 3.0})
    assert reg.parse(spec) is spec  # already typed: passes through
    out = reg.build(spec, inject={"model_path": "/m"})
    assert type(out["config"]) is ScaleConfig and out["config"] == ScaleConfig(factor=3.0)


def test_build_validates_options() -> None:
    with pytest.raises(ValidationError, match="factor"):
        make_registry().build({"name": "scale", "factor": -1.0}, inject={"model_path": ""})


def test_validate_fills_defaults() -> None:
    reg = make_registry()
    assert reg.validate({"name": "scale", "label": "y"}, "section.spec") == {"name": "scale", "factor": 2.0, "label": "y"}
    assert reg.validate({"name": "plain"}, "p") == {"name": "plain"}


def test_validate_errors_name_the_path() -> None:
    reg = make_registry()
    with pytest.raises(ConfigError, match=r"section\.spec\.name: 'zzz' is not a registered widget; allowed: \['flat', 'plain', 'scale'\]"):
        reg.validate({"name": "zzz"}, "section.spec")
    with pytest.raises(ConfigError, match=r"section\.spec\.factor: .*greater than 0"):
        reg.validate({"name": "scale", "factor": 0}, "section.spec")
    with pytest.raises(ConfigError, match=r"section\.spec\.colour: Extra inputs"):
        reg.validate({"name": "scale", "colour": "red"}, "section.spec")
    with pytest.raises(ConfigError, match=r"p: widget 'plain' takes no options, got \['a'\]"):
        reg.validate({"name": "plain", "a": 1}, "p")
    with pytest.raises(ConfigError, match="None is not a registered"):
        reg.validate({}, "p")


def test_spec_model_is_the_entry_config_with_a_literal_name() -> None:
    reg = make_registry()
    model = reg.spec_model("scale")
    assert model is reg.spec_model("scale")  # built once
    assert issubclass(model, ScaleConfig) and issubclass(model, Spec) and model.__name__ == "ScaleWidgetSpec"
    assert list(model.model_fields) == ["name", "factor", "label"]
    assert reg.parse({"name": "scale"}).model_dump() == {"name": "scale", "factor": 2.0, "label": "x"}
    assert list(reg.spec_model("plain").model_fields) == ["name"]


class Holder(BaseModel):
    """A config with one spec field (default entry 'scale') and a list of specs."""

    model_config = ConfigDict(extra="forbid")
    one: Annotated[SerializeAsAny[Spec], SpecOf(WIDGETS, default="scale")] = Field(
        default_factory=SpecOf(WIDGETS, default="scale").make_default)
    many: list[Annotated[SerializeAsAny[Spec], SpecOf(WIDGETS)]] = Field(default_factory=list)


def test_spec_field_dispatches_on_name_and_dumps_every_option() -> None:
    held = Holder.model_validate({"one": {"label": "y"}, "many": [{"name": "plain"}, {"name": "flat", "factor": 4}]})
    assert type(held.one) is WIDGETS.spec_model("scale")  # no name: the field's default entry
    assert held.model_dump() == {"one": {"name": "scale", "factor": 2.0, "label": "y"},
                                 "many": [{"name": "plain"}, {"name": "flat", "factor": 4.0, "label": "x"}]}
    assert Holder().model_dump()["one"] == {"name": "scale", "factor": 2.0, "label": "x"}


@pytest.mark.parametrize(("data", "message"), [
    ({"one": {"factor": 0}}, r"holder\.one\.factor: Input should be greater than 0 \(got 0\)"),
    ({"many": [{"name": "plain"}, {"name": "zzz"}]},
     r"holder\.many\.1\.name: 'zzz' is not a registered widget; allowed: \['flat', 'plain', 'scale'\]$"),
    ({"many": [{"name": "flat", "colour": 1}]}, r"holder\.many\.0\.colour: Extra inputs are not permitted"),
    ({"one": "scale"}, r"holder\.one: must be a mapping with a 'name' \(a widget spec\) \(got 'scale'\)$"),
])
def test_spec_field_errors_name_the_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Holder.model_validate(data)
    assert re.search(message, registry_mod.format_validation_error(info.value, "holder"), re.MULTILINE)


class FakeEntryPoint:
    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def load(self) -> Any:
        return self.obj


def test_plugins_load_once_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    reg: Registry = Registry("widget")
    calls: list[str] = []

    def plugin() -> None:
        calls.append("plugin")
        reg.register("from_plugin")(lambda: "made by plugin")

    groups: list[str] = []

    def entry_points(group: str) -> list[FakeEntryPoint]:
        groups.append(group)
        return [FakeEntryPoint(plugin), FakeEntryPoint(object.__new__(type("Module", (), {})))]

    monkeypatch.setattr(registry_mod.importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(registry_mod, "_plugins_loaded", False)
    assert "from_plugin" in reg
    assert reg.build({"name": "from_plugin"}) == "made by plugin"
    assert reg.names() == ["from_plugin"]
    assert groups == [registry_mod.PLUGIN_GROUP] and calls == ["plugin"]  # loaded exactly once


def test_unregister_removes_an_entry_and_its_spec_model() -> None:
    reg: Registry[Any] = Registry("widget")
    reg.register("temp")(lambda: "t")
    reg.spec_model("temp")
    reg.unregister("temp")
    assert "temp" not in reg and reg.names() == []
    with pytest.raises(RegistryError, match="widget 'temp' is not registered"):
        reg.unregister("temp")
