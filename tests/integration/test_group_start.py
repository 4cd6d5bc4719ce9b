"""Groups started with ``wait=False`` load concurrently (real Ray): the roles start side by side, not one after another."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from toolbox.actors.group import WorkerGroup
from toolbox.actors.resolve import node_info

from toolbox.core.errors import WorkerError

pytestmark = pytest.mark.integration


class Waiter:
    """Its constructor waits (up to ``within_s``) for ``path`` to exist: a model that takes long to load."""

    def __init__(self, path: str, within_s: float = 60.0) -> None:
        deadline = time.monotonic() + within_s
        while not Path(path).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {within_s}s")
            time.sleep(0.05)

    def ready(self) -> dict[str, str]:
        return node_info()


class Maker:
    """Its constructor creates ``path``, releasing the `Waiter`s; ``fail`` makes it raise instead."""

    def __init__(self, path: str, fail: bool = False) -> None:
        if fail:
            raise ValueError("no model at /nonexistent")
        Path(path).touch()

    def ready(self) -> dict[str, str]:
        return node_info()


def test_a_group_started_without_waiting_loads_while_the_next_one_starts(ray_session: None, tmp_path: Path) -> None:
    # Sequentially, the waiters' group would time out: only the maker's constructor (started after it) releases it.
    flag = str(tmp_path / "loaded")
    waiters = WorkerGroup("rollout", Waiter, 2, lambda r: {"path": flag}, timeout_s=60, cpus=0.01, wait=False)
    maker = WorkerGroup("learner", Maker, 1, lambda r: {"path": flag}, timeout_s=60, cpus=0.01)
    try:
        assert waiters.started() is waiters and len(waiters.node_ids) == 2 and all(waiters.nodes)
        assert waiters.started() is waiters  # waits once
    finally:
        waiters.shutdown()
        maker.shutdown()


def test_a_failed_constructor_surfaces_at_started_naming_role_and_rank(ray_session: None, tmp_path: Path) -> None:
    group = WorkerGroup("reward", Maker, 1, lambda r: {"path": str(tmp_path / "x"), "fail": True}, timeout_s=60,
                        cpus=0.01, wait=False)
    try:
        with pytest.raises(WorkerError, match=r"(?s)reward rank 0: ready died: .*ValueError: no model at /nonexistent"):
            group.started()
    finally:
        group.shutdown()
