"""Reading an experiment's datasets when its config is checked, so a bad row fails before any actor starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.core.errors import ConfigError
from toolbox.data.offline import OfflineDataConfig
from toolbox.data.rows import is_local
from toolbox.data.tasks import TASKS

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


def check_data(exp: ExperimentConfig) -> None:
    """Offline records and a local ``dataset`` task's prompts, read with ``exp.data``'s bad-row policy.

    Hands the policy to the offline data section (which carries it to the learner ranks). A hub dataset
    is read when the run builds it, not here (checking a config needs no network).
    """
    if isinstance(exp.algorithm, OfflineDataConfig):
        exp.algorithm.check_rows(exp.data)
    path = getattr(exp.task, "path", "")
    if exp.task.name == "dataset" and is_local(path):
        try:
            TASKS.build(exp.task, inject={"data": exp.data})
        except ConfigError as err:
            raise ConfigError(f"task.path: {err}") from None
