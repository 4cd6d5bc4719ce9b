"""Named registries: every name a config can select lives in one.

A config selects an entry with a *spec*: ``{"name": "exact_match", **options}``. `Registry.parse`
validates it into a typed `Spec` whose model (`Registry.spec_model`) is built from the entry: a
``name: Literal[name]`` field plus the fields (and validators) of the entry's pydantic config.
`Registry.build(spec, inject={...})` constructs the entry from a typed spec or a plain dict, passing
an injected dependency only when the factory's signature accepts it. A config field declares
``Annotated[SerializeAsAny[Spec], SpecOf(REGISTRY, default="name")]`` to hold one.

Third-party packages add entries through the ``toolbox.plugins`` entry-point group: each entry point
is a module (or callable) that is imported/called once, and registers its entries as a side effect.
A registry defined low in the layers whose built-in entries live higher up (the algorithm registry, in
config/, filled by toolbox/algorithms/) names its registration module (``builtins``) the same way: it is
imported on the first lookup, so the low layer never imports the high one.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError, create_model
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError, core_schema

from toolbox.core.errors import ConfigError, RegistryError

T = TypeVar("T")
PLUGIN_GROUP = "toolbox.plugins"
# Errors whose message already says what was given: the formatter adds no "(got ...)".
_SELF_DESCRIBING = {"missing", "unregistered", "no_options"}


class Spec(BaseModel):
    """A selection of one registry entry: its ``name`` and, in the per-entry subclass, its options."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Registered name of the entry.")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered factory and, optionally, the pydantic model of its options."""

    name: str
    factory: Callable[..., T]
    config: type[BaseModel] | None


class Registry(Generic[T]):
    """A name -> factory table for one extension point. Refuses duplicate names."""

    def __init__(self, kind: str, builtins: str = "") -> None:
        """``builtins``: the module whose import registers the built-in entries (imported on the first lookup)."""
        self.kind, self.builtins = kind, builtins
        self._entries: dict[str, Entry[T]] = {}
        self._spec_models: dict[str, type[BaseModel]] = {}

    def _load(self) -> None:
        """The built-in entries, then every plugin's, registered (once) before a lookup."""
        if self.builtins:
            importlib.import_module(self.builtins)  # a no-op once imported
        load_plugins()

    def register(
        self, name: str, *, config: type[BaseModel] | None = None
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: ``@REWARDS.register("exact_match", config=ExactMatchConfig)``."""

        def deco(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                prev = self._entries[name].factory
                raise RegistryError(
                    f"{self.kind} {name!r} is already registered (by {prev.__module__}.{prev.__qualname__}); "
                    f"pick another name for {factory.__module__}.{factory.__qualname__}"
                )
            self._entries[name] = Entry(name, factory, config)
            return factory

        return deco

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's temporary entry), so later lookups, checks and docs no longer see it."""
        if name not in self._entries:
            raise RegistryError(f"{self.kind} {name!r} is not registered")
        del self._entries[name]
        self._spec_models.pop(name, None)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def get(self, name: str) -> Entry[T]:
        self._load()
        if name not in self._entries:
            raise RegistryError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names()) or 'none'}")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries

    def spec_model(self, name: str) -> type[BaseModel]:
        """The pydantic model of a spec selecting ``name`` (built once).

        A `Spec` subclass with ``name: Literal[name]`` and the entry config's fields and validators; an
        entry without a config takes no options. A config that declares ``name`` itself (an algorithm's)
        already is the whole section, so it is its own spec model.
        """
        model = self._spec_models.get(name)
        if model is None:
            config = self.get(name).config
            if config is not None and "name" in config.model_fields:
                model = config
            else:
                bases = (Spec,) if config is None else (config, Spec)
                title = "".join(part.title() for part in f"{name} {self.kind}".replace("_", " ").split()) + "Spec"
                tag = cast(Any, Literal)[name]
                model = create_model(title, __base__=bases, __module__=__name__,
                                     name=(tag, Field(name, description=f"Selects the {self.kind} {name!r}.")))
            self._spec_models[name] = model
        return model

    def parse(self, spec: Any, default: str | None = None) -> BaseModel:
        """Validate ``spec`` ({"name": ..., **options}; ``name`` may be left out when ``default`` names it).

        Raises a pydantic `ValidationError` located at the spec's own fields (``name``, ``timeout_s``), so a
        config field holding a spec reports the full path (``reward.spec.timeout_s``). A spec already built
        by this registry passes through.
        """
        if isinstance(spec, BaseModel):
            name = getattr(spec, "name", None)
            if isinstance(name, str) and type(spec) is self._spec_models.get(name):
                return spec
            spec = spec.model_dump()
        if not isinstance(spec, Mapping):
            article = "an" if self.kind[:1] in set("aeiou") else "a"
            raise _error("not_a_spec", f"must be a mapping with a 'name' ({article} {self.kind} spec)", (), spec)
        name = spec.get("name", default)
        if not isinstance(name, str) or name not in self:
            raise _error("unregistered", f"{name!r} is not a registered {self.kind}; allowed: {self.names()}",
                         ("name",), name)
        model = self.spec_model(name)
        options = sorted(k for k in spec if k != "name")
        if self.get(name).config is None and options:
            raise _error("no_options", f"{self.kind} {name!r} takes no options, got {options}", (), dict(spec))
        return model.model_validate({"name": name, **spec})

    def validate(self, spec: Any, path: str) -> dict[str, Any]:
        """Check ``spec`` and return it with defaults filled in, as a dict.

        Errors are `ConfigError`s naming the config path (``reward.spec.timeout_s``) and the allowed values.
        """
        try:
            return self.parse(spec).model_dump()
        except ValidationError as err:
            raise ConfigError(_format_validation(err, path)) from None

    def build(self, spec: BaseModel | Mapping[str, Any], inject: Mapping[str, Any] | None = None) -> T:
        """Construct the entry that ``spec`` (typed, or a ``{"name": ..., **options}`` dict) selects.

        Options are validated by the entry's config model and passed as a ``config`` argument when the
        factory takes one, else as keyword arguments. Injected dependencies are passed only if the
        factory's signature names them.
        """
        typed = self.parse(spec)
        entry = self.get(typed.model_dump(include={"name"})["name"])  # every spec model has a `name`
        params = inspect.signature(entry.factory).parameters
        kwargs = {k: v for k, v in (inject or {}).items() if k in params}
        if entry.config is not None:
            # The typed spec subclasses the config; the factory gets the config class itself.
            cfg = entry.config.model_validate({k: getattr(typed, k) for k in entry.config.model_fields})
            if "config" in params:
                kwargs["config"] = cfg
            else:
                kwargs.update(cfg.model_dump())
        return entry.factory(**kwargs)


@dataclass(frozen=True)
class SpecOf:
    """``Annotated`` metadata of a config field holding a spec of ``registry``: validates by dispatching on ``name``.

    ``default`` is the name a spec that leaves ``name`` out selects (``rollout.engine.max_batch_size=64`` edits
    the default engine). Use with ``SerializeAsAny[Spec]`` so a dump keeps every option of the chosen entry.
    """

    registry: Registry[Any]
    default: str | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self.parse, handler(source))

    def parse(self, value: Any) -> Spec:
        """``value`` validated into the spec model of the entry it names."""
        spec = self.registry.parse(value, self.default)
        if not isinstance(spec, Spec):  # a registry whose configs declare `name` (algorithms) holds no specs
            raise TypeError(f"{self.registry.kind} {spec!r}: its config declares `name`; SpecOf is for spec registries")
        return spec

    def make_default(self) -> Spec:
        """The default spec (the ``default`` entry with its default options): a field's ``default_factory``."""
        return self.parse({})


def _error(kind: str, message: str, loc: tuple[str, ...], value: Any) -> ValidationError:
    """A one-line `ValidationError` of type ``kind`` at ``loc`` (relative to the spec)."""
    detail = InitErrorDetails(type=PydanticCustomError(kind, "{message}", {"message": message}), loc=loc, input=value)
    return ValidationError.from_exception_data("spec", [detail])


def _format_validation(err: ValidationError, path: str, tagged: Collection[str] = (),
                       origin: Callable[[tuple[Any, ...]], str] | None = None) -> str:
    """One line per error: its field path, what is wrong, the value given and, when ``origin`` says (from the
    error's location), where that value came from (a YAML file, a command-line override).

    ``tagged`` names top-level fields that hold a tagged union: pydantic puts the tag after
    them (``algorithm.grpo.lr``), which is not a path a user can write, so it is dropped.
    """
    lines = []
    for e in err.errors():
        parts = list(e["loc"])
        if len(parts) >= 2 and parts[0] in tagged:
            del parts[1]
        loc = ".".join(str(p) for p in (path, *parts) if p != "")
        given = "input" in e and e["type"] not in _SELF_DESCRIBING
        source = origin(tuple(parts)) if origin is not None else ""
        lines.append(f"{loc}: {e['msg']}" + (f" (got {e['input']!r})" if given else "")
                     + (f"  [from {source}]" if source else ""))
    return "invalid config:\n  " + "\n  ".join(lines)


_plugins_loaded = False


def load_plugins() -> None:
    """Import every ``toolbox.plugins`` entry point once so its registrations take effect."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        obj = ep.load()
        if callable(obj):
            obj()


format_validation_error = _format_validation
spec_error = _error
