"""Imports point down the layers of docs/architecture.md: a module imports (at run time, lazily included) only from
its own layer or below. Imports under ``if TYPE_CHECKING:`` are annotations, not dependencies, and do not count.

The imports that still point up are listed in `KNOWN_UPWARD`, each with what would remove it; a new one fails the
test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Low to high. A top-level module or package of toolbox that is not named here is an entry point (the top).
LAYERS: dict[str, tuple[str, ...]] = {
    "core": ("core",),
    "library": ("engines", "envs", "rewards", "objectives", "rl", "learner", "data", "models", "agents", "evaluation",
                "serving", "tracing", "callbacks"),
    "config": ("config",),
    "actors": ("actors",),
    "trainers": ("trainers",),
    "algorithms": ("algorithms",),
    "driver": ("experiment", "dry_run", "startup", "cold_start", "local_ray", "gpu_plan", "watchdog", "tune_state"),
}
RANK = {name: i for i, (_, names) in enumerate(LAYERS.items()) for name in names}
TOP = len(LAYERS)

KNOWN_UPWARD: dict[tuple[str, str], str] = {
    ("toolbox.callbacks.files", "toolbox.plot"): "the curve drawing belongs in the library, the CLI beside it",
    ("toolbox.callbacks.remote", "toolbox.trainers.watch"): "the watched-metric names belong below the callbacks",
    ("toolbox.config.loader", "toolbox.algorithms"): "algorithm configs registered, not imported by config/",
    ("toolbox.config.schema", "toolbox.algorithms"): "algorithm configs registered, not imported by config/",
}


def rank_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "toolbox" or len(parts) < 2:
        return None
    return RANK.get(parts[1], TOP)


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the ``toolbox`` package (``actors/`` installs as ``toolbox.actors``)."""
    for root, prefix in ((REPO / "toolbox", "toolbox"), (REPO / "actors", "toolbox.actors")):
        for path in sorted(root.rglob("*.py")):
            name = ".".join((prefix, *path.relative_to(root).with_suffix("").parts))
            yield name.removesuffix(".__init__"), path


def runtime_imports(tree: ast.AST) -> Iterator[str]:
    """Absolute imports anywhere in ``tree`` (function bodies too), skipping ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
            continue
        if isinstance(child, ast.Import):
            yield from (alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            yield child.module
        yield from runtime_imports(child)


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for name, path in modules():
        here = rank_of(name)
        for target in runtime_imports(ast.parse(path.read_text(), str(path))):
            there = rank_of(target)
            if here is not None and there is not None and there > here:
                found.add((name, target))
    return found


def test_imports_point_down() -> None:
    found = upward_imports()
    new = sorted(found - KNOWN_UPWARD.keys())
    assert not new, "imports that point up the layers (docs/architecture.md):\n" + "\n".join(f"  {a} -> {b}" for a, b in new)


def test_the_scan_sees_an_upward_import() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import toolbox.experiment\n"
                     "def f():\n    from toolbox.algorithms import ALGORITHMS\n")
    assert list(runtime_imports(tree)) == ["typing", "toolbox.algorithms"]
    assert rank_of("toolbox.objectives.gspo") < rank_of("toolbox.algorithms.grpo") < rank_of("toolbox.run")  # type: ignore[operator]
