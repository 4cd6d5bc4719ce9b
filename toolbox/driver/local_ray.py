"""The local Ray instance a run starts for itself: its workers' environment, its start, and its early start.

`start_local` starts a new local instance whose processes inherit `WORKER_ENV`. `EarlyRay` starts one before the
driver has loaded its config (`python -m toolbox.run` only): ``ray.init`` of a local instance takes about 4 s on 2
cores (GCS, raylet, agents) and the config load before it 1.5-2 s (the schema imports torch), during which the
second core idles. It starts only where nothing can ask for another cluster (`early_start_wanted`: no ``ray.*``
override, no RAY_ADDRESS, no ``ray:`` section in the experiment file or the files it is based on, not a dry run);
the run then compares the ``ray.init`` arguments its resolved config asks for with the ones used, and shuts the
early instance down to start its own where they differ. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from toolbox.core.paths import DEFAULT_EXPERIMENT, experiment_path

log = logging.getLogger(__name__)

# glibc's memcpy stores around the cache (non-temporal stores) only above a size it derives from the L3 size the CPU
# reports: 192 MiB on the project's 2-core VM (cpuid reports the host's 256 MiB L3), tens of MiB on most servers,
# while most weight tensors are 0.1-30 MiB. A worker's large copies are written for another process to read (a
# shared weight slot, an object-store put), so they go around the cache from this size on: 1.5x faster into a
# weight slot on that VM (`toolbox bench weight_sync`). A GLIBC_TUNABLES of the driver's environment that sets the
# threshold itself wins; other tunables there are kept.
NON_TEMPORAL_BYTES = 1 << 20
_THRESHOLD = "glibc.cpu.x86_non_temporal_threshold"


def glibc_tunables(current: str) -> str:
    """``current`` (a GLIBC_TUNABLES value) with the non-temporal threshold set to `NON_TEMPORAL_BYTES` unless it
    sets one already."""
    if _THRESHOLD in current:
        return current
    return ":".join(filter(None, [current, f"{_THRESHOLD}={NON_TEMPORAL_BYTES:#x}"]))


# A worker's torch threads (an OpenMP team) wait for each other at the end of every parallel op. By default
# libgomp's waiting threads spin first, burning a core that another role's process needs: a learner with two threads
# and an engine with one on 2 cores is the project's 2-core setting. Passive waiters sleep: a GRPO step on SmolLM2
# 9.95 s against 15.5 s, on the 25M model 1.32 s against 1.95 s (`toolbox bench roofline`, docs/benchmarks.md); a
# training step alone is as fast either way. A value in the driver's environment wins.
OMP_WAIT = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")

# Quiet worker processes: transformers' load/save bars would drown the run's own progress.
WORKER_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
              "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": OMP_WAIT,
              "GLIBC_TUNABLES": glibc_tunables(os.environ.get("GLIBC_TUNABLES", ""))}
# Ray's own settings for a run's local instance (Ray reads ``RAY_<setting>`` from each of its processes' environment).
# A restarted actor whose caller lost a call mid-flight (its process or node died) waits this long for the lost call
# before it runs the ones queued behind it; Ray's 30 s stalled every self-healed rollout worker for 30 s (a removed
# node: run done 4 s after the node was gone instead of 35 s, tests/e2e/test_multinode.py). Calls are sent in order,
# so only a lost call leaves such a gap. The KubeRay image sets the same (deploy/docker/Dockerfile); a value in the
# driver's environment wins.
#
# A raylet connects to its own object store (a thread it has just started) and a worker to its raylet through a
# Unix socket; where the socket is not listening yet, Ray waits `raylet_client_connect_timeout_milliseconds` (1 s)
# before the next try. A local head's raylet missed its store's socket in 5 of 12 starts and each such start took
# 1 s longer (`ray.init` 3.2-3.4 s against 2.0-2.5 s); 50 ms between tries (as patient: 200 tries) left 0 of 12 with
# a wait over 50 ms. Measured by the raylet's log of each start ("Plasma store debug dump" to "ObjectManager server
# started"), docs/benchmarks.md.
RAY_ENV = {"RAY_actor_scheduling_queue_max_reorder_wait_seconds": "5",
           "RAY_raylet_client_connect_timeout_milliseconds": "50", "RAY_raylet_client_num_connect_attempts": "200"}


def ray_env() -> dict[str, str]:
    """`RAY_ENV`, with the values this process's environment sets instead."""
    return {key: os.environ.get(key, value) for key, value in RAY_ENV.items()}


GCS_PROCESS = "gcs_server"  # the name of Ray's GCS process, the first of the head processes a start launches
LOCAL_DEFAULTS: dict[str, Any] = {"address": "local", "include_dashboard": False}  # `ray_init_kwargs`, no ray: section
MONITOR_SCRIPT = "autoscaler/_private/monitor.py"  # Ray's autoscaler monitor, one process of a local head


# What the workers of a local instance started by `start_local` inherit, by the instance's GCS address.
_INHERITED: dict[str, dict[str, str]] = {}


def start_local(kwargs: dict[str, Any]) -> None:
    """``ray.init`` of a new local instance whose processes inherit `WORKER_ENV` and `RAY_ENV`: set in this
    process's environment while the head processes start (the raylet passes its environment on to every worker),
    then restored.

    Why not a runtime env: Ray starts a worker process per CPU ahead, with the raylet's environment, and hands
    one to an actor only when their runtime envs match; actors without one (`actor_env` is empty here) take
    them, instead of each waiting for a new process (tests/integration/test_local_start.py)."""
    import ray

    explicit = "runtime_env" in kwargs  # asked for explicitly: Ray's way, WORKER_ENV is not inherited
    values = ray_env() | ({} if explicit else WORKER_ENV)
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        with lean_head() as monitor_left_out:
            ray.init(**kwargs)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if not explicit:
        _INHERITED[ray.get_runtime_context().gcs_address] = dict(WORKER_ENV)
    if not monitor_left_out:  # a Ray whose head parameters lack ``no_monitor`` started it all the same
        end_monitor()


@contextlib.contextmanager
def lean_head() -> Iterator[bool]:
    """Within: a ``ray.init`` that starts a local instance does without three parts of Ray's start that a local head
    has no use for, each in the seconds where Ray's start, the driver's imports and the actors' share 2 cores.

    - Ray's autoscaler monitor: it scales a cluster, and a local instance has nothing to scale; it holds nothing of
      the run's (a run's own placement timeouts name what cannot be placed). Its process is about 0.6 CPU s (the
      autoscaler's imports) and ~50 MiB for the whole run (`toolbox bench default_run` counts every process); at
      shutdown it holds Ray up (see `shutdown`).
    - importing the dashboard's packages into this process: Ray asks whether they are installed (the answer picks
      the dashboard agent's minimal mode) by importing them all (aiohttp, grpc, OpenTelemetry, OpenCensus,
      prometheus_client), in the thread that starts the head processes, between the GCS and the API server whose
      address ``ray.init`` waits for. `dashboard_deps_error` answers without loading them.
    - a second of waiting for the raylet: `registered_node`.

    Launch to step 1 of the default run: docs/benchmarks.md, "A leaner head start". ``ray.init`` has no argument
    for any of them: its head parameters (``ray._private.parameter.RayParams``, which ``ray start --no-monitor``
    sets), its check (``ray._private.utils.get_dashboard_dependency_error``) and its wait for the node
    (``ray._private.services.get_node``) are looked up inside the call, so each is swapped for the duration of the
    block (``unittest.mock.patch.object``: set, and put back however the block ends). A Ray whose names differ is
    left as it is. Yields whether the monitor is left out (where it is not, `end_monitor` ends it once the instance
    is up)."""
    from unittest import mock

    from ray._private import parameter, services, utils

    with contextlib.ExitStack() as swaps:
        monitor_left_out = "no_monitor" in inspect.signature(parameter.RayParams).parameters
        if monitor_left_out:
            swaps.enter_context(mock.patch.object(parameter, "RayParams", _without_monitor(parameter.RayParams)))
        for module, name, wrapper in ((utils, "get_dashboard_dependency_error", dashboard_deps_error),
                                      (services, "get_node", registered_node)):
            original = getattr(module, name, None)
            if original is not None:  # each wrapper takes Ray's own function first
                swaps.enter_context(mock.patch.object(module, name, functools.partial(wrapper, original)))
        yield monitor_left_out


def _without_monitor(params: type) -> type:
    """Ray's head parameters ``params`` with ``no_monitor`` set."""
    class WithoutMonitor(params):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{"no_monitor": True, **kwargs})

    return WithoutMonitor


DASHBOARD_DEPS = "ray.dashboard.optional_deps"  # the module whose imports are Ray's list of the dashboard's packages


def dashboard_deps_error(ray_check: Callable[[], ImportError | None]) -> ImportError | None:
    """``ray_check``'s answer (None: the dashboard's packages are installed), found without importing them where
    they all are: each module `DASHBOARD_DEPS` imports is looked up (``importlib.util.find_spec``: its package
    itself, or inside a namespace package, whose parts ship separately, the module). Where one is missing, Ray's
    check (its import) says which and why. A package that is there but fails to import is the one case where the
    answers differ: the dashboard agent, started in its full mode, then fails at the start, naming it."""
    import importlib.util

    def installed(name: str) -> bool:
        package = importlib.util.find_spec(name.split(".")[0])
        if package is None or package.origin is not None:  # missing, or a regular package that ships its modules
            return package is not None
        return importlib.util.find_spec(name) is not None

    names = _dashboard_modules()
    return None if names and all(installed(name) for name in names) else ray_check()


@functools.cache
def _dashboard_modules() -> frozenset[str]:
    """The modules `DASHBOARD_DEPS` imports (none where it cannot be found): read once per process, as Ray's start
    asks twice (the API server's command, the dashboard agent's)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(DASHBOARD_DEPS)
    if spec is None or spec.origin is None:
        return frozenset()
    tree = ast.parse(Path(spec.origin).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return frozenset(names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module})


def registered_node(ray_get_node: Callable[[str, str], Any], gcs_address: str, node_id: str) -> Any:
    """``ray_get_node(gcs_address, node_id)`` (Ray's node record), called once the node is in the GCS's node table,
    which is polled every 20 ms (for at most 30 s, Ray's own limit; any error of the poll leaves the wait to Ray).

    Why: ``ray.init`` asks for the new node while its raylet is still registering, and Ray's client then retries
    after a fixed second; the raylet registers a fraction of a second into it, and the rest of the second passes
    with every process of the run idle (the raylet's and the GCS's logs show nothing between the registration and
    the driver's connect). ``ray.init`` of a local instance: 3.7 s against 4.35 median, 5 of 6 alternating pairs
    faster (docs/benchmarks.md, "A leaner head start")."""
    from ray._private import services, state

    table = state.GlobalState()
    try:
        table._initialize_global_state(services._get_gcs_client_options(gcs_address))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(node["NodeID"] == node_id for node in table.node_table()):
            time.sleep(0.02)
    except Exception:  # noqa: BLE001 - Ray's own wait below reports what is wrong
        log.debug("polling the GCS's node table failed; Ray's own wait follows", exc_info=True)
    finally:
        table.disconnect()
    return ray_get_node(gcs_address, node_id)


def end_monitor() -> None:
    """Kill Ray's autoscaler monitor among this process's children: a local instance's that started one (a plain
    ``ray.init``, or one outside `lean_head`); a SIGKILL loses nothing (`lean_head` says why). A
    cluster this process merely connected to is left alone: its monitor is not a child."""
    import psutil

    for proc in psutil.Process().children():
        try:
            if any(arg.endswith(MONITOR_SCRIPT) for arg in proc.cmdline()):
                proc.kill()  # reaped by Ray's own handle on it
                _until_dead(proc)
        except psutil.Error:  # gone meanwhile
            continue


def _until_dead(proc: Any, timeout_s: float = 2.0) -> None:
    """Return once the killed child ``proc`` no longer runs (a zombie until Ray's handle reaps it: not waited for
    here, which would reap it under Ray), or after ``timeout_s``: a kill lands asynchronously."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)


def shutdown() -> None:
    """``ray.shutdown()``, with the autoscaler monitor of a local instance this process started ended first.

    Why: Ray's shutdown stops the GCS before the monitor, whose SIGTERM handler then tries to record its end in the
    GCS and waits until Ray kills it a second later (``ray._private.node._kill_process_impl``): 1.0 of the 1.35 s a
    local instance took to shut down on 2 cores. `start_local` starts none; an instance started otherwise (a plain
    ``ray.init``) has one."""
    import ray

    end_monitor()
    ray.shutdown()


RAY_DAEMONS = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")  # Ray's own processes titled ``ray::``


def worker_processes() -> list[Any]:
    """The processes among this process's descendants that run Ray actors or tasks (Ray titles them
    ``ray::Class`` or ``ray::Class.method``): a local instance's busy workers, none for a cluster's."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            title = (proc.cmdline() or [""])[0]
        except psutil.Error:  # gone meanwhile
            continue
        if title.startswith("ray::") and not title.startswith(RAY_DAEMONS):
            found.append(proc)
    return found


def wait_gone(procs: list[Any], timeout_s: float = 3.0) -> None:
    """Return once ``procs`` (`worker_processes`, their actors killed) have exited, or after ``timeout_s``."""
    import psutil

    psutil.wait_procs(procs, timeout=timeout_s)


def actor_env() -> dict[str, str]:
    """The env vars an actor must be given (its runtime env): those of `WORKER_ENV` its worker process does not
    inherit already (all of them, unless this process started the local instance it is connected to)."""
    import ray

    inherited = _INHERITED.get(ray.get_runtime_context().gcs_address, {}) if ray.is_initialized() else {}
    return {k: v for k, v in WORKER_ENV.items() if inherited.get(k) != v}


def early_start_wanted(args: list[str]) -> bool:
    """Whether a run of ``args`` (``python -m toolbox.run`` arguments) starts a local instance with `LOCAL_DEFAULTS`
    as far as can be told without loading its config: nothing on the command line, in the environment or in the
    experiment's YAML files (its ``base:`` chain) names a cluster or sets a ``ray`` field, and it is not a dry run.
    A file that cannot be read says no (the config load reports it)."""
    if os.environ.get("RAY_ADDRESS") or any(a.startswith("ray.") or a in {"--dry-run", "-h", "--help"} for a in args):
        return False
    name = next((a.partition("=")[2] for a in args if a.startswith("experiment=")), DEFAULT_EXPERIMENT)
    seen: set[str] = set()
    try:
        while name and name not in seen:
            seen.add(name)
            data = yaml.safe_load(experiment_path(name).read_text()) or {}
            if not isinstance(data, dict) or "ray" in data:
                return False
            name = str(data.get("base") or "")
    except Exception:  # noqa: BLE001 - any doubt: no early start, and load_config says what is wrong
        return False
    return True


class EarlyRay:
    """A local instance with `LOCAL_DEFAULTS` starting in a thread from construction (its watchdog first: what a
    SIGKILL of the driver would leave of it is ended, `toolbox.driver.watchdog`).

    The thread lives until `close`: Ray starts the head processes with ``PR_SET_PDEATHSIG``, which Linux fires when
    the *thread* that started them ends, not the process."""

    def __init__(self) -> None:
        from toolbox.driver.watchdog import start as start_watchdog

        self.watchdog: subprocess.Popen[bytes] | None = start_watchdog()
        self.error: BaseException | None = None
        self.started, self.released = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._start, name="toolbox-early-ray", daemon=True)
        self.thread.start()
        self._wait_for_gcs()

    def _wait_for_gcs(self, within_s: float = 2.0) -> None:
        """Return once the thread has started Ray's GCS process (or ended, or ``within_s`` passed).

        Why: until then the thread runs Python (``import ray``, the instance's temp directory and ports) and shares the interpreter
        lock with whatever the caller does next (the config, toolbox's and torch's imports), which held the GCS
        back by about a second; every later step of Ray's start (the API server, the raylet, its agents) waits
        on the one before it. From there on the thread mostly waits on those processes, and the caller's imports
        run beside them. Launch to step 1 of the default run: 0.2-0.4 s shorter (docs/benchmarks.md)."""
        import psutil

        me, deadline = psutil.Process(), time.monotonic() + within_s
        while not self.started.is_set() and time.monotonic() < deadline:
            try:
                if any(child.name() == GCS_PROCESS for child in me.children()):
                    return
            except psutil.Error:  # a child that ended between the listing and its name
                pass
            time.sleep(0.01)

    def _start(self) -> None:
        quiet = _NotMainThreadWarning()
        ray_log = logging.getLogger("ray._private.worker")
        ray_log.addFilter(quiet)
        try:
            start_local(dict(LOCAL_DEFAULTS))
        except BaseException as err:  # noqa: BLE001 - handed to the main thread by `take`
            self.error = err
        finally:
            ray_log.removeFilter(quiet)
            self.started.set()
        self.released.wait()

    def take(self, kwargs: dict[str, Any]) -> bool:
        """Once started: ``True`` when ``kwargs`` (the resolved config's ``ray.init`` arguments) ask for this very
        instance; ``False`` when they ask for another (it is shut down: start that one). Its start's error, if any,
        is raised here."""
        self.started.wait()
        if self.error is not None:
            raise self.error
        if kwargs == LOCAL_DEFAULTS:
            return True
        shutdown()
        self.close()
        return False

    def close(self) -> None:
        """Once the instance is shut down: the thread that started it may end."""
        self.released.set()

    def abandon(self) -> None:
        """The run will not start (a bad config, already reported): the instance shut down once started, without
        Ray's line announcing it, and the watchdog ended."""
        import ray

        announce = logging.getLogger("ray._private.worker")
        level = announce.level
        announce.setLevel(logging.WARNING)
        self.started.wait()
        announce.setLevel(level)
        if ray.is_initialized():
            shutdown()
        self.close()
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()


class _NotMainThreadWarning(logging.Filter):
    """Drops Ray's warning that a ``ray.init`` outside the main thread sets no SIGTERM handler: the run sets its own
    (`toolbox.commands.run.SignalStop`) once the instance is up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()
