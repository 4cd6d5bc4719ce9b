"""``python -m toolbox.run [experiment=NAME] [a.b.c=value ...] [--dry-run [--gpu-gib=80]]``: run one experiment as one
Ray job.

``--dry-run`` prints the settings, the actors and placement groups, the batch arithmetic and a memory estimate
per learner rank, and starts nothing (`toolbox.driver.dry_run`)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from toolbox.callbacks.console import stderr_console
from toolbox.callbacks.files import CurvePlot, start_plots, wait_for_plots
from toolbox.core.errors import ConfigError, WorkerError
from toolbox.core.memory import RunMemory
from toolbox.driver.local_ray import EarlyRay, early_start_wanted
from toolbox.driver.local_ray import shutdown as shutdown_ray
from toolbox.driver.startup import StartupClock
from toolbox.driver.watchdog import start as start_watchdog

log = logging.getLogger("toolbox")


def entry_point(argv: list[str] | None, help_text: str) -> tuple[Console, list[str] | None]:
    """What every driver entry point does first: quiet worker env, a stderr console, the arguments.

    The arguments are ``None`` when ``-h``/``--help`` asked for ``help_text`` (then printed).
    """
    from toolbox.driver.local_ray import WORKER_ENV

    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    console = stderr_console()
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in {"-h", "--help"}:
        # escape(): "[a.b.c=value ...]" and error texts would otherwise be read as rich markup and vanish.
        console.print(escape(help_text))
        return console, None
    return console, args


def main(argv: list[str] | None = None, early_ray: bool = False) -> int:
    """Exit codes: 0 done, 1 a worker failed, 2 a bad config. ``early_ray`` (``python -m toolbox.run``): a local Ray
    instance starts while the config loads, where nothing asks for another (`toolbox.driver.local_ray.EarlyRay`)."""
    clock = StartupClock()  # from this process's launch (`toolbox.driver.startup`)
    clock.mark("launch")
    console, args = entry_point(argv, (__doc__ or "") + "\nExperiments live in configs/experiments/; see "
                                "docs/configuration.md for every field.")
    if args is None:
        return 0
    early = EarlyRay() if early_ray and early_start_wanted(args) else None
    from toolbox.config import load_config

    dry = "--dry-run" in args
    gpu_gib = next((float(a.partition("=")[2]) for a in args if a.startswith("--gpu-gib=")), None)
    try:
        cfg = load_config([a for a in args if a != "--dry-run" and not a.startswith("--gpu-gib=")])
    except ConfigError as err:
        return config_error(console, err, early)
    if dry:
        from toolbox.driver.dry_run import print_dry_run

        return print_dry_run(cfg, gpu_gib=gpu_gib)
    return run(cfg, console, clock, early)


def config_error(console: Console, err: ConfigError, early: EarlyRay | None = None) -> int:
    """Say what is wrong (at once), then end the local instance started early, if any; returns 2."""
    console.print(f"[bold red]config error[/]: {escape(str(err))}")
    if early is not None:
        early.abandon()
    return 2


def run(cfg, console: Console, clock: StartupClock | None = None,  # noqa: ANN001 - ExperimentConfig, lazily
        early: EarlyRay | None = None) -> int:
    """``clock``: marks the start-up phases (`toolbox.driver.startup`); they are printed with the results. ``early``: the
    local instance `main` started before the config was loaded, used if the config asks for that one."""
    from toolbox import engines, rewards  # noqa: F401  (register built-ins)
    from toolbox.driver.experiment import ExperimentBuilder
    from toolbox.driver.ray_connect import ray_init_kwargs

    started = time.perf_counter()
    try:
        builder = ExperimentBuilder(cfg)
    except ConfigError as err:
        return config_error(console, err, early)
    console.print(f"run directory: [bold]{builder.run_dir}[/]")
    builder.clock = clock
    builder.mark("config")
    stop = SignalStop()  # SIGTERM/SIGINT unwind the run: Ray shut down, exit 128 + signal
    started_ray, watchdog, code = start_ray(cfg, builder, console, stop, early)
    if code is not None:
        return code
    CurvePlot.background = True  # the dashboard is drawn once the actors are gone, while Ray shuts down (`start_plots`)
    # A local instance's daemons and workers are this process's descendants: its peak counts them all.
    memory = RunMemory(whole_run=started_ray and str(ray_init_kwargs(cfg)["address"]) == "local").start()
    try:
        trainer = builder.build_trainer()
        summary = trainer.fit()
        end_workers(builder, started_ray)
        start_plots()
        console.print(f"results: {builder.run_dir}  (total wall time incl. start-up: {time.perf_counter() - started:.0f}s)")
        if clock is not None and clock.done:
            console.print(f"start-up: {clock.summary()}")
        console.print(f"memory: {memory.finish(builder.run_dir)}")
        return 0 if summary else 1
    except ConfigError as err:  # what only the cluster tells (e.g. a local run_root on several nodes)
        console.print(f"[bold red]config error[/]: {escape(str(err))}")
        return 2
    except WorkerError as err:
        console.print(f"[bold red]worker failure[/]: {escape(str(err))}")
        print_resume_hint(console, builder.run_dir)
        return 1
    except KeyboardInterrupt:
        return stop.report(console, builder.run_dir)
    finally:
        memory.stop()
        if started_ray:
            shutdown_ray()
        if early is not None:
            early.close()
        wait_for_plots()
        CurvePlot.background = False
        stop.end(watchdog, 0)


def end_workers(builder: Any, local: bool) -> None:
    """The run's actors killed, and on a local instance gone, before the dashboard is drawn: the ~90 MiB matplotlib
    takes in the driver never adds to the workers' memory at the run's peak."""
    from toolbox.driver.local_ray import wait_gone, worker_processes

    workers = worker_processes() if local else []
    builder.shutdown()
    wait_gone(workers)


def start_ray(cfg, builder: Any, console: Console, stop: SignalStop,  # noqa: ANN001 - ExperimentConfig, lazily
              early: EarlyRay | None) -> tuple[bool, subprocess.Popen[bytes] | None, int | None]:
    """Connect to Ray, or start a local instance, unless the run is in local mode or Ray is already up; the driver's
    own loading runs meanwhile (`ExperimentBuilder.warm_up`). Returns whether this call started Ray, the watchdog
    (it ends what a SIGKILL of this process would leave of a local instance), and an exit code when Ray could not
    be reached or a signal came first (then nothing is left running)."""
    import ray

    from toolbox.driver.ray_connect import connect_ray, ray_init_kwargs

    if cfg.ray.local_mode or (early is None and ray.is_initialized()):
        return False, None, None
    watchdog = early.watchdog if early is not None else start_watchdog()
    warming = builder.warm_up()  # the driver's own loading, while Ray's processes start
    try:
        if early is None or not early.take(ray_init_kwargs(cfg)):
            connect_ray(cfg)  # bounded by ray.connect_timeout_s; no address: a new local instance
    except ConfigError as err:
        console.print(f"[bold red]config error[/]: {escape(str(err))}")
        return False, watchdog, stop.end(watchdog, 2)
    except KeyboardInterrupt:
        return False, watchdog, stop.end(watchdog, stop.report(console, builder.run_dir))
    stop.install()
    warming.join()
    builder.mark("ray_init")
    return True, watchdog, None


class SignalStop:
    """While a run goes on, SIGTERM and SIGINT raise `KeyboardInterrupt` in the main thread, where Ray's waits
    check for signals, so the run unwinds: its actors and the Ray instance it started are shut down, and the
    driver exits with 128 + the signal's number. A second signal gets the default behaviour (Ctrl-C twice:
    quit at once)."""

    def __init__(self) -> None:
        self.signum = signal.SIGINT  # a KeyboardInterrupt without a signal seen here: Ctrl-C as Python saw it
        self.previous: dict[int, Any] = {}
        self.install()

    def install(self) -> None:
        """(Again) after ``ray.init``, whose crash handler takes SIGTERM over (and aborts the driver)."""
        if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
            return
        for s in (signal.SIGTERM, signal.SIGINT):
            handler = signal.signal(s, self._handle)
            self.previous.setdefault(s, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signal.Signals(signum)
        self.restore()
        raise KeyboardInterrupt(self.signum.name)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

    def end(self, watchdog: subprocess.Popen[bytes] | None, code: int) -> int:
        """Once Ray is shut down (or never started): the default handlers back, the watchdog gone; returns ``code``."""
        self.restore()
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        return code

    def report(self, console: Console, run_dir: Path) -> int:
        console.print(f"[bold red]stopped[/] by {self.signum.name}: shutting down the run's actors")
        print_resume_hint(console, run_dir)
        return 128 + int(self.signum)


def print_resume_hint(console: Console, run_dir: Path) -> None:
    """The run directory, and the exact command that resumes it when it has a complete checkpoint."""
    from toolbox.trainers.checkpoints import resume_command

    command = resume_command(run_dir)
    if command is None:
        console.print(f"run directory: {run_dir} (no complete checkpoint to resume from)")
    else:
        # soft_wrap: the command stays one line however narrow the console, so it can be copied as it is
        console.print(f"run directory: {run_dir}\nresume it with: {escape(command)}", soft_wrap=True)


def leave(code: int) -> None:
    """``sys.exit(code)``; after a run that ended well, without the interpreter's teardown of the torch, transformers
    and Ray modules the driver imported (0.8 s after a default run on 2 cores, up to 1.5 s under load; measured
    against ``os._exit``): by then the run has closed its files, trackers, dashboard and Ray instance."""
    if code == 0:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)


if __name__ == "__main__":
    leave(main(early_ray=True))
