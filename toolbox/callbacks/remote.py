"""Publishing the driver's part of a run staged locally (config, metrics, samples) to its remote
``trainer.run_root`` (`toolbox.core.storage`); checkpoints are written to the store by the learner ranks
themselves.

Not a selectable callback: the experiment attaches it whenever ``trainer.run_root`` is a URL, after the
configured callbacks, so what they write at an event (the metrics line of a checkpoint) is published with it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from toolbox.core.events import Event, EventBus
from toolbox.core.storage import RemoteDir, publish_run

log = logging.getLogger(__name__)


class RemotePublish:
    """The run directory goes to ``remote`` at each saved checkpoint and at the end of the run."""

    def __init__(self, remote: RemoteDir, run_dir: Path) -> None:
        self.remote, self.run_dir = remote, run_dir

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(Event.CHECKPOINT_SAVED, self._publish)
        bus.subscribe(Event.FIT_END, self._publish)

    def _publish(self, event: Event, payload: dict[str, Any]) -> None:
        count = publish_run(self.remote, self.run_dir)
        log.info("run directory published to %s (%d files) at %s", self.remote.url, count, event.value)
