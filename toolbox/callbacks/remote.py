"""Publishing a run staged locally to its remote ``trainer.run_root`` (`toolbox.core.storage`).

Not a selectable callback: the experiment attaches it whenever ``trainer.run_root`` is a URL, after the
configured callbacks, so what they write at an event (the metrics line of a checkpoint) is published with it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from toolbox.core.events import Event, EventBus
from toolbox.core.storage import COMPLETE, RemoteDir, publish_checkpoint, publish_run
from toolbox.trainers.watch import BEST

log = logging.getLogger(__name__)


class RemotePublish:
    """Each saved checkpoint (files, then its marker) and the rest of the run directory go to ``remote``; at the
    end of the run the whole directory (metrics, samples, the exported model) once more."""

    def __init__(self, remote: RemoteDir, run_dir: Path, keep_checkpoints: int) -> None:
        self.remote, self.run_dir, self.keep = remote, run_dir, keep_checkpoints
        self.published_best = ""  # best.json of the best checkpoint last published

    def attach(self, bus: EventBus) -> None:
        bus.subscribe(Event.CHECKPOINT_SAVED, self._checkpoint)
        bus.subscribe(Event.FIT_END, self._end)

    def _checkpoint(self, _: Event, payload: dict[str, Any]) -> None:
        url = publish_checkpoint(self.remote, Path(payload["path"]), self.keep)
        publish_run(self.remote, self.run_dir)
        self._best()
        log.info("checkpoint published to %s", url)

    def _end(self, _: Event, payload: dict[str, Any]) -> None:
        count = publish_run(self.remote, self.run_dir)
        self._best()
        log.info("run directory published to %s (%d files)", self.remote.url, count)

    def _best(self) -> None:
        """``checkpoints/best`` (``trainer.keep_best``), when it changed since it was last published (it is made
        just after a checkpoint's event, so it goes with the next checkpoint or the end of the run)."""
        info = self.run_dir / "checkpoints" / BEST / "best.json"
        if not info.is_file() or info.read_text() == self.published_best:
            return
        self.remote.remove(f"checkpoints/{BEST}/{COMPLETE}")
        self.remote.put_tree(info.parent, f"checkpoints/{BEST}", last=COMPLETE)
        self.published_best = info.read_text()
