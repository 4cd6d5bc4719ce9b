"""transformers' lazy-import map, kept in a file instead of rebuilt by every process.

``import transformers``, and again its ``transformers.models`` package, builds the map behind its lazy imports by
reading every model file it ships (2,600 files in transformers 5) and parsing their ``__all__`` and ``@requires``
lines (``transformers.utils.import_utils.define_import_structure``). Every process does it again: each Ray worker
(learner ranks, engines, reward workers), each driver, each test process. `install` wraps that function so the map
of a directory is built once and read back from ``$TOOLBOX_IMPORT_CACHE`` (default ``~/.cache/toolbox/imports``)
afterwards: ``import transformers`` with a tokenizer class 0.79 s -> 0.41 s, transformers' Qwen2 model code 3.85 s ->
3.1 s on a 2-core AVX2 VM (``python -X importtime``; `toolbox bench startup` shows it in a whole run).

An entry holds for one directory while no ``.py`` file under it changes: it is keyed by transformers' version, the
directory, and the newest modification time and number of its ``.py`` files (a walk of 15 ms over transformers'
models). ``TOOLBOX_IMPORT_CACHE=off`` turns the cache off. A transformers without the function (or where it
takes other arguments) is left as it is. Hand-written because transformers keeps no such cache; `install` runs when
``toolbox`` is imported (`toolbox/__init__.py`), before any of toolbox's modules imports transformers.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ENV = "TOOLBOX_IMPORT_CACHE"
DEFAULT_DIR = "~/.cache/toolbox/imports"
TARGET = "transformers.utils.import_utils"
MARK = "_toolbox_cached"  # on the wrapper: the module is patched already
Structure = dict[frozenset[str], dict[str, set[str]]]  # backends -> module -> exported names


def cache_dir() -> Path | None:
    """Where the maps live: ``$TOOLBOX_IMPORT_CACHE``, else ``~/.cache/toolbox/imports``; ``None`` when the variable
    says ``off``."""
    value = os.environ.get(ENV, DEFAULT_DIR)
    return None if value.strip().lower() in {"off", "0", "false", "no"} else Path(value).expanduser()


@functools.cache
def stamp(directory: str) -> list[int]:
    """The newest modification time (ns) and the number of the ``.py`` files under ``directory``: an edited, added
    or removed module file changes it."""
    newest, count = 0, 0
    pending = [directory]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append(entry.path)
                elif entry.name.endswith(".py"):
                    newest, count = max(newest, entry.stat().st_mtime_ns), count + 1
    return [newest, count]


def encode(structure: Structure) -> list[list[Any]]:
    return [[sorted(backends), {module: sorted(names) for module, names in modules.items()}]
            for backends, modules in structure.items()]


def decode(rows: list[list[Any]]) -> Structure:
    return {frozenset(backends): {module: set(names) for module, names in modules.items()} for backends, modules in rows}


def cached(real: Callable[..., Structure], version: str, where: Path) -> Callable[..., Structure]:
    """``real`` (``define_import_structure(module_path, prefix=None)``) answered from the file ``where`` holds for
    transformers ``version`` where it has an entry of the same stamp; else computed, and the file rewritten. The
    file is read once a process (transformers asks for a few directories) and again before each write, so that
    entries other processes wrote meanwhile are kept."""
    file = where / f"transformers-{version}.json"

    @functools.cache
    def entries() -> dict[str, Any]:
        try:
            found = json.loads(file.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    @functools.wraps(real)
    def define_import_structure(module_path: str | os.PathLike[str], prefix: str | None = None) -> Structure:
        directory = str(Path(module_path).resolve())
        if os.path.isfile(directory):
            directory = os.path.dirname(directory)
        key = json.dumps([directory, prefix])
        try:
            entry = entries().get(key)
            if entry is not None and entry["stamp"] == stamp(directory):
                return decode(entry["structure"])
        except (OSError, KeyError, TypeError, ValueError):  # an unreadable entry: build it again
            pass
        structure = real(module_path, prefix)
        with contextlib.suppress(OSError, TypeError, ValueError):  # a read-only home or a map JSON cannot hold
            entries.cache_clear()
            current = entries()
            current[key] = {"stamp": stamp(directory), "structure": encode(structure)}
            write_atomic(file, json.dumps(current))
        return structure

    setattr(define_import_structure, MARK, True)
    return define_import_structure


def write_atomic(file: Path, text: str) -> None:
    """``text`` into ``file`` through a temporary file in its directory: processes that write at once leave one
    whole file, never a mix."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def patch(module: ModuleType, where: Path) -> None:
    """Wrap ``module.define_import_structure`` (transformers' import utilities) once."""
    real = getattr(module, "define_import_structure", None)
    if real is None or getattr(real, MARK, False):
        return
    installed = getattr(sys.modules.get("transformers"), "__version__", None)  # set before it imports its utilities
    if installed is None:
        return
    module.define_import_structure = cached(real, str(installed), where)  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds transformers' import utilities as the path finder does, and patches the module once it has run."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            patch(module, self.where)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Cache transformers' import map from now on in this process (nothing with ``TOOLBOX_IMPORT_CACHE=off``).
    Already imported, transformers' utilities are patched in place: its ``transformers.models`` package, imported
    later, still reads the cache."""
    where = cache_dir()
    if where is None:
        return
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        patch(loaded, where)
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder(where))
