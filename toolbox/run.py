"""``python -m toolbox.run [experiment=NAME] [a.b.c=value ...]``: run one experiment as one Ray job."""

from __future__ import annotations

import logging
import os
import sys
import time

from rich.console import Console
from rich.markup import escape

from toolbox.callbacks.console import stderr_console
from toolbox.core.errors import ConfigError, WorkerError

log = logging.getLogger("toolbox")


def entry_point(argv: list[str] | None, help_text: str) -> tuple[Console, list[str] | None]:
    """What every driver entry point does first: quiet worker env, a stderr console, the arguments.

    The arguments are ``None`` when ``-h``/``--help`` asked for ``help_text`` (then printed).
    """
    from toolbox.experiment import WORKER_ENV

    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    console = stderr_console()
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in {"-h", "--help"}:
        # escape(): "[a.b.c=value ...]" and error texts would otherwise be read as rich markup and vanish.
        console.print(escape(help_text))
        return console, None
    return console, args


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 a worker failed, 2 a bad config."""
    console, args = entry_point(argv, (__doc__ or "") + "\nExperiments live in configs/experiments/; see "
                                "docs/configuration.md for every field.")
    if args is None:
        return 0
    from toolbox.config import load_config

    try:
        cfg = load_config(args)
    except ConfigError as err:
        console.print(f"[bold red]config error[/]: {escape(str(err))}")
        return 2
    return run(cfg, console)


def run(cfg, console: Console) -> int:  # noqa: ANN001 - ExperimentConfig, imported lazily
    import ray

    from toolbox import engines, rewards  # noqa: F401  (register built-ins)
    from toolbox.experiment import ExperimentBuilder, ray_init_kwargs

    started = time.perf_counter()
    try:
        builder = ExperimentBuilder(cfg)
    except ConfigError as err:
        console.print(f"[bold red]config error[/]: {escape(str(err))}")
        return 2
    console.print(f"run directory: [bold]{builder.run_dir}[/]")
    started_ray = False
    if not cfg.ray.local_mode and not ray.is_initialized():
        ray.init(**ray_init_kwargs(cfg))
        started_ray = True
    try:
        trainer = builder.build_trainer()
        summary = trainer.fit()
        console.print(f"results: {builder.run_dir}  (total wall time incl. start-up: {time.perf_counter() - started:.0f}s)")
        return 0 if summary else 1
    except WorkerError as err:
        console.print(f"[bold red]worker failure[/]: {escape(str(err))}")
        console.print(f"run directory (resume with trainer.resume_from={builder.run_dir}): {builder.run_dir}")
        return 1
    finally:
        if started_ray:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
