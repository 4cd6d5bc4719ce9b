"""Named registries: every name a config can select lives in one.

`Registry.build({"name": "exact_match", ...}, inject={...})` validates the
remaining keys against the entry's pydantic config (if it has one) and passes an
injected dependency only when the factory's signature accepts it. Third-party
packages add entries through the ``toolbox.plugins`` entry-point group: each
entry point is a module (or callable) that is imported/called once, and registers
its entries as a side effect.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from toolbox.core.errors import ConfigError, RegistryError

T = TypeVar("T")
PLUGIN_GROUP = "toolbox.plugins"


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered factory and, optionally, the pydantic model of its options."""

    name: str
    factory: Callable[..., T]
    config: type[BaseModel] | None


class Registry(Generic[T]):
    """A name -> factory table for one extension point. Refuses duplicate names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

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

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def get(self, name: str) -> Entry[T]:
        load_plugins()
        if name not in self._entries:
            raise RegistryError(f"unknown {self.kind} {name!r}; registered: {', '.join(self.names()) or 'none'}")
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        load_plugins()
        return name in self._entries

    def validate(self, spec: Mapping[str, Any], path: str) -> dict[str, Any]:
        """Check ``spec`` ({"name": ..., **options}) and return it with defaults filled in.

        Errors name the config path (``reward.spec.timeout_s``) and the allowed values.
        """
        name = spec.get("name")
        if not isinstance(name, str) or name not in self:
            raise ConfigError(f"{path}.name: {name!r} is not a registered {self.kind}; allowed: {self.names()}")
        options = {k: v for k, v in spec.items() if k != "name"}
        entry = self.get(name)
        if entry.config is None:
            if options:
                raise ConfigError(f"{path}: {self.kind} {name!r} takes no options, got {sorted(options)}")
            return {"name": name}
        try:
            model = entry.config.model_validate(options)
        except ValidationError as err:
            raise ConfigError(_format_validation(err, path)) from None
        return {"name": name, **model.model_dump()}

    def build(self, spec: Mapping[str, Any], inject: Mapping[str, Any] | None = None) -> T:
        """Construct the entry named by ``spec['name']``.

        Options are validated by the entry's config model and passed as a ``config``
        argument when the factory takes one, else as keyword arguments. Injected
        dependencies are passed only if the factory's signature names them.
        """
        name = spec["name"]
        entry = self.get(name)
        options = {k: v for k, v in spec.items() if k != "name"}
        params = inspect.signature(entry.factory).parameters
        kwargs = {k: v for k, v in (inject or {}).items() if k in params}
        if entry.config is not None:
            cfg = entry.config.model_validate(options)
            if "config" in params:
                kwargs["config"] = cfg
            else:
                kwargs.update(cfg.model_dump())
        else:
            kwargs.update(options)
        return entry.factory(**kwargs)


def _format_validation(err: ValidationError, path: str, tagged: Collection[str] = ()) -> str:
    """One line per error: its field path, what is wrong, and the value given.

    ``tagged`` names top-level fields that hold a tagged union: pydantic puts the tag after
    them (``algorithm.grpo.lr``), which is not a path a user can write, so it is dropped.
    """
    lines = []
    for e in err.errors():
        parts = list(e["loc"])
        if len(parts) >= 2 and parts[0] in tagged:
            del parts[1]
        loc = ".".join(str(p) for p in (path, *parts) if p != "")
        lines.append(f"{loc}: {e['msg']}" + (f" (got {e['input']!r})" if "input" in e and e["type"] != "missing" else ""))
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
