"""What a sweep keeps across `Tuner.restore` beyond Tune's own experiment state.

Tune saves the trials and the search algorithm with the experiment, not the scheduler: a restored
ASHA starts with empty rungs, so the trials of a resumed sweep are compared with nothing and none is
stopped. `ResumableASHA` writes its state (`ASHAScheduler.save`) after every result, atomically, and
reads it back when a restored sweep adds its first trial. `TrialsEnded` records the trials that ended
(finished, stopped by the scheduler, or failed), which is how a sweep tells that it was interrupted:
Tune marks the trials it stops on an interrupt TERMINATED as well.

These classes live in their own module so that unpickling them (Tune stores the scheduler and the
callbacks in ``tuner.pkl``) finds them; importing it imports Ray Tune.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.schedulers import ASHAScheduler


class ResumableASHA(ASHAScheduler):
    """``ASHAScheduler(**kwargs)`` that keeps its rungs in ``state_path``."""

    def __init__(self, state_path: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.state_path, self.loaded = str(state_path), False

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if not self.loaded:  # the first trial of this scheduler object: a restored one finds its saved rungs
            self.loaded = True
            if Path(self.state_path).exists():
                self.restore(self.state_path)
        super().on_trial_add(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        decision = super().on_trial_result(tune_controller, trial, result)
        self.save(self.state_path + ".tmp")
        os.replace(self.state_path + ".tmp", self.state_path)
        return decision


class TrialsEnded(Callback):
    """Appends the id of every trial that ends (done, stopped by the scheduler, failed) to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def ended(self) -> set[str]:
        return set(json.loads(Path(self.path).read_text())) if Path(self.path).exists() else set()

    def _add(self, trial: Any) -> None:
        Path(self.path + ".tmp").write_text(json.dumps(sorted(self.ended() | {trial.trial_id})))
        os.replace(self.path + ".tmp", self.path)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._add(trial)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._add(trial)
