"""Exceptions that say what went wrong and where."""

from __future__ import annotations


class ToolboxError(Exception):
    """Base class for every error this package raises on purpose."""


class ConfigError(ToolboxError):
    """A config value is wrong; the message names the field path and what is allowed."""


class RegistryError(ToolboxError):
    """A registry lookup or registration failed."""


class WorkerError(ToolboxError):
    """A worker in a group failed, died or timed out.

    The message always names the role, the rank and (where known) the node, so a
    failed step in a run of many actors points at the one that broke.
    """

    def __init__(self, role: str, rank: int, node: str | None, what: str) -> None:
        where = f"{role} rank {rank}" + (f" on node {node}" if node else "")
        super().__init__(f"{where}: {what}")
        self.role, self.rank, self.node = role, rank, node
