"""Imports point down the layers of docs/architecture.md: a module imports (at run time, lazily included) only from
its own layer or below, and no import cycle spans two packages. Imports under ``if TYPE_CHECKING:`` are annotations,
not dependencies, and do not count.

The imports that still point up are listed in `KNOWN_UPWARD`, the cycles in `KNOWN_CYCLES`, each with what would
remove it; a new one fails the test, and so does an entry that no longer holds (the lists only shrink).
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
    "driver": ("driver",),
}
RANK = {name: i for i, (_, names) in enumerate(LAYERS.items()) for name in names}
TOP = len(LAYERS)

KNOWN_UPWARD: dict[tuple[str, str], str] = {}


# Cycles between packages (each a set of the packages whose modules form one strongly connected component).
KNOWN_CYCLES: dict[frozenset[str], str] = {}


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
    assert not KNOWN_UPWARD.keys() - found, f"gone, strike them from KNOWN_UPWARD: {sorted(KNOWN_UPWARD.keys() - found)}"


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports at run time. Importing ``a.b.c`` runs ``a`` and ``a.b`` too, so those count,
    except a module's own parent packages (a package and the modules in it are one unit)."""
    names = dict(modules())
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets: set[str] = set()
        for target in runtime_imports(ast.parse(path.read_text(), str(path))):
            parts = target.split(".")
            targets |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)} & names.keys()
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def package_of(module: str) -> str:
    """``toolbox.X``: the top-level package or module a module belongs to."""
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_import_cycle_spans_two_packages() -> None:
    spanning = {frozenset(map(package_of, c)): c for c in cycles(import_graph()) if len(set(map(package_of, c))) > 1}
    new = {packages: c for packages, c in spanning.items() if packages not in KNOWN_CYCLES}
    assert not new, "import cycles across packages:\n" + "\n".join(f"  {sorted(c)}" for c in new.values())
    assert not KNOWN_CYCLES.keys() - spanning.keys(), "gone, strike them from KNOWN_CYCLES: " + \
        str([sorted(p) for p in KNOWN_CYCLES.keys() - spanning.keys()])


def test_the_cycle_scan_sees_a_cycle() -> None:
    graph = {"toolbox.config.schema": {"toolbox.algorithms.grpo"}, "toolbox.algorithms.grpo": {"toolbox.trainers.base"},
             "toolbox.trainers.base": {"toolbox.config.schema"}, "toolbox.core.errors": set()}
    assert cycles(graph) == [{"toolbox.config.schema", "toolbox.algorithms.grpo", "toolbox.trainers.base"}]


def test_the_scan_sees_an_upward_import() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import toolbox.driver.experiment\n"
                     "def f():\n    from toolbox.algorithms import ALGORITHMS\n")
    assert list(runtime_imports(tree)) == ["typing", "toolbox.algorithms"]
    assert rank_of("toolbox.objectives.gspo") < rank_of("toolbox.algorithms.grpo") < rank_of("toolbox.run")  # type: ignore[operator]
