"""The http engine resumes exactly: the per-request seeds after a checkpoint come back with the rollout worker's state.

A rollout worker's checkpoint holds its process's RNG streams (`RolloutWorker.get_state`); the http engine draws
its request seeds from them, so a new worker (a resumed run's: engine built afresh, then the state loaded) sends
the server the seeds the uninterrupted worker sent. Against the fake `toolbox.commands.serve` of
``test_http_engine_weights``; no Ray (the worker shell is called in-process).
"""

from __future__ import annotations

from typing import Any

from toolbox.actors.rollout import RolloutWorker

from tests.unit.test_http_engine_weights import GROUPS, SAMPLING, FakeServe, engine, fake, tok_dir  # noqa: F401


def step_seeds(worker: RolloutWorker, state: FakeServe) -> list[Any]:
    """The seeds of one generate call's requests, in the order they were sent."""
    before = len(state.completions)
    worker.generate(GROUPS, SAMPLING)
    return sorted(r["seed"] for r in state.completions[before:])


def test_seeds_after_a_checkpoint_come_back_on_resume(fake: tuple[FakeServe, str], tok_dir: str) -> None:  # noqa: F811
    state, url = fake

    def start() -> RolloutWorker:  # a worker process starting: the engine is built with the run's seed
        return RolloutWorker(rank=0, build=lambda rank: engine(tok_dir, url))

    whole = start()
    step_1 = step_seeds(whole, state)
    checkpoint = whole.get_state()
    step_2, step_3 = step_seeds(whole, state), step_seeds(whole, state)

    resumed = start()
    resumed.set_state(checkpoint)
    assert [step_seeds(resumed, state), step_seeds(resumed, state)] == [step_2, step_3]
    assert step_seeds(start(), state) == step_1 != step_2  # without the state, a new worker starts over
