"""MkDocs hook (``hooks:`` in mkdocs.yml): pages that cannot go stale, filled in from the code at build time.

- ``<!-- config-fields: NAME -->`` becomes the table of algorithm NAME's config fields (its pydantic model,
  through `toolbox.commands.reference.config_rows`, the function that writes docs/configuration.md).
- ``<!-- error-catalog -->`` becomes every error message the code raises with a message of its own: toolbox's
  errors (``ConfigError``, ``WorkerError``, ``RowError``, ``RegistryError``), the command line's ``SystemExit``
  messages, and the built-in exceptions a library call raises to its caller (``ValueError``, ``RuntimeError``,
  ...; inside an actor they reach the user as ``<role> rank <r> ... raised: ValueError: ...``). Each is read
  from the source with `ast`: the literal parts of the message, with ``…`` where a value is filled in at run
  time, and the file and line that raise it.

Runs offline (no network): it imports toolbox and reads files of this checkout.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ERRORS = {"ConfigError", "WorkerError", "RowError", "RegistryError", "SystemExit", "ValueError", "RuntimeError",
          "TypeError", "FileNotFoundError", "ImportError", "TimeoutError"}
FIELDS = re.compile(r"<!-- config-fields: (\w+) -->")
CATALOG = "<!-- error-catalog -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = FIELDS.sub(lambda m: algorithm_fields(m.group(1)), markdown)
    if CATALOG in markdown:
        markdown = markdown.replace(CATALOG, error_catalog())
    return markdown


def algorithm_fields(name: str) -> str:
    from toolbox.algorithms import ALGORITHMS
    from toolbox.commands.reference import _table, config_rows

    rows = [(f"`algorithm.{p}`", t, f"`{d}`" if d else "", desc)
            for p, t, d, desc in config_rows(ALGORITHMS.spec_model(name)) if p != "name"]
    return _table(rows, ("field", "type", "default", "description"))


def _message(node: ast.expr) -> str:
    """The literal text of a message expression; ``…`` for every part computed at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_message(v) if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message(node.left) + _message(node.right)
    return "…"


def raised_errors(path: Path) -> list[tuple[int, str, str]]:
    """(line, error class, message) of every call of an error class in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ERRORS and node.args:
            text = _message(node.args[-1])  # WorkerError(role, rank, node, what): the message is the last
            if sum(c.isalpha() for c in text) >= 12:  # "…: …" says nothing; the hand-written sections explain those
                out.append((node.lineno, node.func.id, " ".join(text.split())))
    return sorted(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


# How each kind of error reaches the user: the catalog's sections, in this order.
REACHES = [
    ("Config errors: `config error: ...`, exit 2, before anything starts", {"ConfigError", "RegistryError"}),
    ("Data rows: `<file>:<row>: ...`", {"RowError"}),
    ("Worker failures: `<role> rank <r> on node <ip>: ...`, exit 1", {"WorkerError"}),
    ("Command line: `toolbox <command>: ...`", {"SystemExit"}),
    ("Inside a worker or a library call: `... raised: ValueError: ...`", ERRORS),
]


def error_catalog() -> str:
    """One section per way an error reaches the user (`REACHES`), each a table of message and raise site."""
    rows: dict[str, list[str]] = {title: [] for title, _ in REACHES}
    for path in sorted([*(ROOT / "toolbox").rglob("*.py"), *(ROOT / "actors").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        for line, kind, text in raised_errors(path):
            title = next(title for title, kinds in REACHES if kind in kinds)
            rows[title].append(f"| {_cell(text)} | {kind} | `{rel}:{line}` |")
    return "\n".join(f"### {title}\n\n| message | error | raised at |\n|---|---|---|\n" + "\n".join(found) + "\n"
                     for title, found in rows.items() if found)
