"""Every ``toolbox bench NAME --option`` the docs show names a benchmark that exists and options its parser takes.

The benchmarks take minutes, so the docs cannot run them; this reads each one's argument parser instead (its
``add_argument`` calls, found with `ast`), so a renamed option or benchmark fails here, not in a reader's shell.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from tests.unit.test_docs_commands import docs_pages
from toolbox.bench.__main__ import available

REPO = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"(?:toolbox bench|python -m toolbox\.bench) ([a-z_]+)((?: +[^\s`|>#]+)*)")


def options_of(bench: str) -> set[str]:
    """The ``--options`` of ``toolbox.bench.<bench>``'s parser and of the private modules it imports them from."""
    found: set[str] = set()
    names = [bench] + [p.stem for p in (REPO / "toolbox" / "bench").glob("_*.py")]
    for name in names:
        tree = ast.parse((REPO / "toolbox" / "bench" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                found |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return found


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(page:line, benchmark, its --options) of every bench command in the README and the docs."""
    out = []
    for page in docs_pages():
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in COMMAND.finditer(line):
                words = shlex.split(match.group(2).replace("\\", " "), posix=True) if match.group(2) else []
                flags = [w.split("=")[0] for w in words if w.startswith("--")]
                out.append((f"{page.relative_to(REPO)}:{number}", match.group(1), flags))
    return out


def test_the_docs_show_bench_commands() -> None:
    assert len({bench for _, bench, _ in documented_commands()}) >= 10


@pytest.mark.parametrize(("where", "bench", "flags"), documented_commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_documented_bench_command_uses_a_real_benchmark_and_options(where: str, bench: str, flags: list[str]) -> None:
    assert bench in available(), f"{where}: no benchmark {bench!r} (benchmarks: {available()})"
    unknown = sorted(set(flags) - options_of(bench) - {"--help"})
    assert not unknown, f"{where}: toolbox bench {bench} takes no {unknown}"
