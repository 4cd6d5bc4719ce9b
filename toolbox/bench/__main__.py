"""Dispatch ``python -m toolbox.bench NAME ...`` to ``toolbox.bench.NAME.main``."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import toolbox.bench as bench


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in available():
        print(f"usage: python -m toolbox.bench NAME [options]\nbenchmarks: {', '.join(available())}", file=sys.stderr)
        return 0 if argv and argv[0] in {"-h", "--help"} else 2
    return int(importlib.import_module(f"toolbox.bench.{argv[0]}").main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
