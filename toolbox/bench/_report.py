"""A benchmark's tables on the console (rich) and as a markdown report (``--report PATH``).

A table is a `Table` value (title, column headers, rows of cells already formatted), so the console and the
report show the very same figures. A report file holds one ``## `` section per benchmark: writing a section
replaces the one with the same heading and keeps the others, so several benchmarks share one file
(``docs/benchmarks/smollm2.md``). Each section states the machine, the date, the versions of the libraries both
sides run on and the exact command, which is what a reader needs to reproduce or distrust a figure.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "transformers", "trl")


@dataclass(frozen=True)
class Table:
    """One table: a title, its column headers and rows of formatted cells."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)


def print_tables(tables: list[Table], lines: Sequence[str] = ()) -> None:
    """Each table on the console, then ``lines`` as plain text."""
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(width=200)
    for table in tables:
        shown = RichTable(title=table.title)
        for header in table.headers:
            shown.add_column(header, justify="right")
        for cells in table.rows:
            shown.add_row(*cells)
        console.print(shown)
    for line in lines:
        console.print(line, markup=False, highlight=False)


def markdown_table(table: Table) -> str:
    """``table`` as a GitHub markdown table under its title in bold; a ``|`` in a cell is escaped."""
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([f"**{table.title}**", "", row(table.headers), "|" + "---|" * len(table.headers),
                      *(row(cells) for cells in table.rows)])


def cpu_model() -> str:
    """The CPU's model name and the vector extensions that decide float speed (AVX2, AVX-512, AMX)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name
    if found := re.search(r"^model name\s*:\s*(.+)$", info, re.M):
        name = found.group(1).strip()
    if found := re.search(r"^flags\s*:\s*(.+)$", info, re.M):
        flags = set(found.group(1).split())
    extensions = [e for e, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX512-BF16", "avx512_bf16"),
                                    ("AMX", "amx_bf16")) if flag in flags]
    return f"{name} ({', '.join(extensions) or 'no AVX2'})"


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed version of each package ('not installed' where absent), and toolbox's git commit."""
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["toolbox"] = git_commit()
    return out


def git_commit() -> str:
    """The checkout's short commit, with ``+changes`` when the work tree differs; 'unknown' outside git."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "toolbox", "actors"], cwd=here,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+changes" if dirty else head


def command_line(bench: str, argv: list[str]) -> str:
    """The command as typed: ``toolbox bench NAME ARGS``, behind ``nice -n N`` when this process runs niced."""
    niceness = os.nice(0)
    prefix = f"nice -n {niceness} " if niceness else ""
    return prefix + shlex.join(["toolbox", "bench", bench, *argv])


def environment_lines(command: str, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Markdown bullet lines: machine, date, load, library versions and the command."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    found = ", ".join(f"{k} {v}" for k, v in versions(packages).items())
    return [f"- Machine: {cpu_model()}, {os.cpu_count()} cores, {memory_gib:.0f} GiB memory, {platform.system()}",
            f"- Date: {stamp}; load average at the end {load}",
            f"- Versions: Python {platform.python_version()}, {found}",
            f"- Command: `{command}`"]


def section(heading: str, tables: list[Table], notes: list[str], command: str,
            packages: tuple[str, ...] = PACKAGES) -> str:
    """A report section: ``## heading``, the environment, the tables, then ``notes`` (one paragraph each)."""
    parts = [f"## {heading}", "\n".join(environment_lines(command, packages)), *map(markdown_table, tables), *notes]
    return "\n\n".join(parts) + "\n"


def write_section(path: str | Path, text: str) -> None:
    """Put ``text`` (a `section`, first line ``## heading``) into the report at ``path``: in place of the section with
    that heading, else appended; a new file starts with a title line."""
    heading = text.splitlines()[0]
    if not heading.startswith("## "):
        raise ValueError(f"a report section starts with '## ', not {heading!r}")
    target = Path(path)
    old = target.read_text() if target.exists() else "# Benchmark reports\n\nWritten by `toolbox bench ... --report`.\n"
    blocks = re.split(r"(?m)^(?=## )", old)
    head, sections = blocks[0], blocks[1:]
    same = [i for i, block in enumerate(sections) if block.splitlines()[0] == heading]
    if same:
        sections[same[0]] = text
    else:
        sections.append(text)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n\n".join(block.strip("\n") for block in [head, *sections]) + "\n")
