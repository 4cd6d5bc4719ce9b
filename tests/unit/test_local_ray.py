"""`early_start_wanted`: a local instance starts before the config loads only where nothing can ask for another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolbox.driver.local_ray import NON_TEMPORAL_BYTES, WORKER_ENV, early_start_wanted, glibc_tunables


@pytest.fixture(autouse=True)
def no_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_the_default_run_and_plain_overrides_start_early() -> None:
    assert early_start_wanted([])
    assert early_start_wanted(["trainer.total_steps=3", "experiment=dapo_tiny"])  # a base chain without ray:


@pytest.mark.parametrize("args", [["ray.num_cpus=2"], ["ray.local_mode=true"], ["--dry-run"], ["--help"],
                                  ["experiment=does_not_exist"]])
def test_anything_that_may_ask_for_another_cluster_does_not(args: list[str]) -> None:
    assert not early_start_wanted(args)


def test_an_address_in_the_environment_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert not early_start_wanted([])


def test_a_ray_section_anywhere_in_the_base_chain_does_not(tmp_path: Path) -> None:
    (tmp_path / "root.yaml").write_text("ray: {num_cpus: 2}\n")
    (tmp_path / "mid.yaml").write_text(f"base: {tmp_path / 'root.yaml'}\ntrainer: {{total_steps: 2}}\n")
    (tmp_path / "plain.yaml").write_text("base: grpo_tiny\n")
    assert not early_start_wanted([f"experiment={tmp_path / 'mid.yaml'}"])
    assert early_start_wanted([f"experiment={tmp_path / 'plain.yaml'}"])


def test_shutdown_ends_the_autoscaler_monitor_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child running Ray's monitor script (here one that ignores SIGTERM, as the real one blocks in its handler)
    is killed before ``ray.shutdown``; another child is left alone."""
    import subprocess
    import sys

    import ray

    from toolbox.driver.local_ray import MONITOR_SCRIPT, shutdown

    script = tmp_path / MONITOR_SCRIPT
    script.parent.mkdir(parents=True)
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)\n")
    other = tmp_path / "other.py"
    other.write_text("import time\ntime.sleep(60)\n")
    monitor, bystander = (subprocess.Popen([sys.executable, str(path)]) for path in (script, other))
    seen = []
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append(monitor.poll()))
    try:
        shutdown()
        assert monitor.wait(timeout=10) == -9 and seen and bystander.poll() is None
    finally:
        for proc in (monitor, bystander):
            proc.kill()
            proc.wait()


def test_a_lean_head_asks_for_no_monitor_and_imports_no_dashboard_package_only_within_the_block() -> None:
    """Inside `lean_head` the head parameters ``ray.init`` builds ask for no autoscaler monitor, whatever else they
    say, and Ray's check of the dashboard's packages answers as Ray's own does (all installed here) without
    importing them; outside, Ray's own are back."""
    from ray._private import parameter, services, utils

    from toolbox.driver.local_ray import lean_head

    params, check, get_node = parameter.RayParams, utils.get_dashboard_dependency_error, services.get_node
    probe = "import sys\nfrom toolbox.driver.local_ray import lean_head\nfrom ray._private import utils\n" \
            "with lean_head():\n    print(utils.get_dashboard_dependency_error(), 'aiohttp' in sys.modules)\n"
    with lean_head():
        inside = parameter.RayParams(num_cpus=2)
        assert utils.get_dashboard_dependency_error() is None
        assert services.get_node is not get_node
    assert parameter.RayParams is params and utils.get_dashboard_dependency_error is check
    assert services.get_node is get_node
    assert isinstance(inside, params) and inside.no_monitor and inside.num_cpus == 2
    assert not params(num_cpus=2).no_monitor and check() is None  # Ray's own answer: installed
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert fresh.stdout.split() == ["None", "False"], fresh.stderr[-2000:]


def test_a_missing_dashboard_package_gets_ray_s_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """One module of Ray's list not found (a namespace package's part here): Ray's check answers, with its error."""
    import importlib.util

    from toolbox.driver.local_ray import dashboard_deps_error

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "opentelemetry.proto" else find_spec(name, *a))
    missing = ImportError("No module named 'opentelemetry.proto'")
    assert dashboard_deps_error(lambda: missing) is missing
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert dashboard_deps_error(lambda: missing) is None


def test_ray_is_asked_for_the_node_once_the_gcs_lists_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node table is polled until it lists the node, then Ray's own call answers; a poll that fails leaves the
    wait to Ray's call all the same, and the table's connection is closed either way."""
    from ray._private import services, state

    from toolbox.driver.local_ray import registered_node

    tables: list[list[dict[str, str]]] = [[], [{"NodeID": "other"}], [{"NodeID": "other"}, {"NodeID": "n1"}]]
    polls, closed = [], []

    class Table:
        def _initialize_global_state(self, options: object) -> None:
            pass

        def node_table(self) -> list[dict[str, str]]:
            polls.append(1)
            if not tables:
                raise RuntimeError("GCS gone")
            return tables.pop(0)

        def disconnect(self) -> None:
            closed.append(1)

    monkeypatch.setattr(state, "GlobalState", Table)
    monkeypatch.setattr(services, "_get_gcs_client_options", lambda address: address)
    asked = []
    assert registered_node(lambda a, n: asked.append((a, n, len(polls))) or "record", "gcs:1", "n1") == "record"
    assert asked == [("gcs:1", "n1", 3)] and closed == [1]
    assert registered_node(lambda a, n: "record", "gcs:1", "n1") == "record" and closed == [1, 1]


def test_a_ray_with_other_internals_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray._private import parameter, services, utils

    from toolbox.driver.local_ray import lean_head

    class OlderParams:
        def __init__(self, num_cpus: int | None = None) -> None:
            self.num_cpus = num_cpus

    monkeypatch.setattr(parameter, "RayParams", OlderParams)
    monkeypatch.delattr(utils, "get_dashboard_dependency_error")
    monkeypatch.delattr(services, "get_node")
    with lean_head():
        assert parameter.RayParams is OlderParams and not hasattr(utils, "get_dashboard_dependency_error")
        assert not hasattr(services, "get_node")


def test_workers_get_the_non_temporal_threshold_unless_the_environment_sets_one() -> None:
    threshold = f"glibc.cpu.x86_non_temporal_threshold={NON_TEMPORAL_BYTES:#x}"
    assert glibc_tunables("") == threshold
    assert glibc_tunables("glibc.malloc.arena_max=2") == f"glibc.malloc.arena_max=2:{threshold}"
    assert glibc_tunables("glibc.cpu.x86_non_temporal_threshold=0x4000") == "glibc.cpu.x86_non_temporal_threshold=0x4000"


LOADER = Path("/lib64/ld-linux-x86-64.so.2")


@pytest.mark.skipif(not LOADER.exists(), reason="not x86-64 glibc")
def test_glibc_reads_the_workers_threshold() -> None:
    """glibc ignores a tunable it does not know: its loader's diagnostics show the threshold a worker starts with."""
    env = {**os.environ, "GLIBC_TUNABLES": WORKER_ENV["GLIBC_TUNABLES"]}
    out = subprocess.run([str(LOADER), "--list-diagnostics"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("this glibc's loader has no --list-diagnostics (glibc before 2.33)")
    assert f"x86.cpu_features.non_temporal_threshold={NON_TEMPORAL_BYTES:#x}" in out.stdout.splitlines()


@pytest.mark.parametrize(("set_to", "want"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_workers_wait_passively_unless_the_environment_says_otherwise(set_to: str | None, want: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | ({"OMP_WAIT_POLICY": set_to} if set_to else {})
    code = "from toolbox.driver.local_ray import WORKER_ENV; print(WORKER_ENV['OMP_WAIT_POLICY'])"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == want
