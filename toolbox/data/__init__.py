"""Prompt sources and built-in verifiable tasks."""

from toolbox.agents import calc as _calc  # noqa: E402, F401 - registers the `tool_add` task (and calculator tools)
from toolbox.data import dataset_task as _dataset_task  # noqa: E402, F401 - registers the `dataset` task
