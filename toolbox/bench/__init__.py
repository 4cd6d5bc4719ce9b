"""Benchmarks: ``python -m toolbox.bench NAME [options]``. Each NAME is a module here with ``main(argv) -> int``."""
