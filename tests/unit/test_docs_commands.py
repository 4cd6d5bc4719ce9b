"""The commands the docs mark runnable still run: every fenced block right after a line ``<!-- runnable -->``.

A doctest over the markdown: each non-comment line of a marked shell block (a trailing ``\\`` joins lines), and a
marked ``python`` block as a whole, runs from the repository root with the venv's ``bin`` first on the ``PATH``
and must exit 0. Only commands that finish in
seconds on a CPU are marked (``--dry-run``, ``toolbox config``, ``--help``), so this stays a unit test; a block
whose commands would start Ray or train is left unmarked. A marker not followed by a fenced block is an error,
so a marker cannot sit in the docs checking nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^(```+|~~~+)\s*(\w*)[^\n]*\n(.*?)^\1\s*$", re.S | re.M)
SHELLS = {"bash", "sh", "shell", "console", ""}
PYTHON = "python"


@dataclass(frozen=True)
class Command:
    """One command of a marked block: the page, the line it starts on, and the text."""

    page: str
    line: int
    text: str
    python: bool = False  # a whole python block, run by the interpreter, rather than one shell command

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: " + ("(python block)" if self.python else self.text)


def marked_commands(page: Path, root: Path = REPO) -> list[Command]:
    """Every command in the blocks of ``page`` that follow the marker; ValueError for a marker with no block."""
    text, name, found = page.read_text(), str(page.relative_to(root)), []
    for marker in re.finditer(rf"^{re.escape(MARKER)}[ \t]*$", text, re.M):  # on a line of its own, not in prose
        line = text.count("\n", 0, marker.start()) + 1
        block = FENCE.match(text, marker.end() + 1)
        if block is None or text[marker.end():block.start()].strip():
            raise ValueError(f"{name}:{line}: {MARKER} is not followed directly by a fenced code block")
        first = text.count("\n", 0, block.start(3)) + 1
        if block.group(2) == PYTHON:
            found.append(Command(name, first, block.group(3), python=True))
        elif block.group(2) in SHELLS:
            found += commands_of(block.group(3), name, first)
        else:
            raise ValueError(f"{name}:{line}: a runnable block is a shell or python block, not {block.group(2)!r}")
    return found


def commands_of(body: str, page: str, first_line: int) -> list[Command]:
    """The commands of one block: comment lines dropped, ``\\``-continued lines joined."""
    out, pending, start = [], "", first_line
    for offset, raw in enumerate(body.splitlines()):
        line = raw.strip()
        if not pending:
            start = first_line + offset
            if not line or line.startswith("#"):
                continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        out.append(Command(page, start, pending + line))
        pending = ""
    return out


def docs_pages() -> list[Path]:
    return sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])


def all_commands() -> list[Command]:
    return [command for page in docs_pages() for command in marked_commands(page)]


def run(command: Command, timeout_s: float = 540) -> subprocess.CompletedProcess[str]:
    """``command`` from the repository root; seconds on a quiet CPU, the limit is for a machine shared with others."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [sys.executable, "-c", command.text] if command.python else ["bash", "-c", command.text]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.mark.parametrize("command", all_commands(), ids=str)
def test_a_runnable_command_in_the_docs_exits_0(command: Command) -> None:
    done = run(command)
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"


def test_the_docs_mark_commands_runnable() -> None:
    pages = {command.page for command in all_commands()}
    assert {"docs/getting-started.md", "docs/development.md", "docs/write-a-reward.md", "docs/write-a-loss.md"} <= pages


def test_a_marked_block_runs_each_command_and_a_failure_names_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text(f"# probe\n\n{MARKER}\n```bash\n# a comment\ntrue\nexit \\\n  3\n```\n\n```bash\nfalse\n```\n")

    commands = marked_commands(page, tmp_path)

    assert [(c.line, c.text) for c in commands] == [(6, "true"), (7, "exit 3")]  # the unmarked block is not run
    assert run(commands[0]).returncode == 0 and run(commands[1]).returncode == 3
    assert str(commands[1]) == "probe.md:7: exit 3"


def test_a_python_block_runs_as_one_program(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text(f"{MARKER}\n```python\nx = 2\nassert x == 3, 'x is 2'\n```\n")

    [command] = marked_commands(page, tmp_path)
    done = run(command)

    assert str(command) == "probe.md:3: (python block)"
    assert done.returncode == 1 and "AssertionError: x is 2" in done.stderr


def test_a_marker_without_a_block_or_on_a_yaml_block_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text(f"# probe\n\n{MARKER}\nSome prose.\n\n```bash\ntrue\n```\n")
    with pytest.raises(ValueError, match=r"^probe.md:3: .* is not followed directly by a fenced"):
        marked_commands(page, tmp_path)
    page.write_text(f"# probe\n\n{MARKER}\n```yaml\na: 1\n```\n")
    with pytest.raises(ValueError, match=r"^probe.md:3: a runnable block is a shell or python block, not 'yaml'"):
        marked_commands(page, tmp_path)


def test_commands_of_joins_continued_lines() -> None:
    body = "toolbox run \\\n    a=1 \\\n    b=2\n# not a command\ntoolbox config\n"
    assert [(c.line, c.text) for c in commands_of(body, "p.md", 10)] == [
        (10, "toolbox run a=1 b=2"), (14, "toolbox config")]
    assert shlex.split(commands_of(body, "p.md", 1)[0].text) == ["toolbox", "run", "a=1", "b=2"]
