"""One retry policy for calls that cross a network: exponential backoff with full jitter, a deadline, and
retries only of errors the caller says are retryable; every retry is counted.

Written here rather than taken from a library because the whole policy is a dozen lines and the package
already depends on nothing that provides it; `RetryPolicy.call` is the one loop every caller goes through.
What it does not do: retry a call that is not idempotent safely (the caller decides what is retryable), or
cancel a call in flight (the callee's own timeout does).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)
T = TypeVar("T")

_counts: Counter[str] = Counter()
_unreported = [0]  # retries no result has carried yet (`take_retries`)
_lock = threading.Lock()


class RetryPolicy(BaseModel):
    """How a failed call is tried again: up to ``attempts`` tries, pauses doubling from ``first_pause_s`` up to
    ``max_pause_s`` (each drawn uniformly below its bound: full jitter), never past ``deadline_s`` from the first try."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    attempts: int = Field(4, ge=1, description="Tries in all (1: no retry).")
    first_pause_s: float = Field(0.5, ge=0, description="Upper bound of the pause before the first retry.")
    max_pause_s: float = Field(8.0, ge=0, description="Upper bound of any one pause.")
    deadline_s: float = Field(120.0, gt=0, description="No retry starts later than this after the first try.")

    def pause(self, retry: int, rng: random.Random | None = None) -> float:
        """The pause before retry number ``retry`` (0-based): uniform in [0, min(max, first * 2^retry)]."""
        bound = min(self.max_pause_s, self.first_pause_s * 2 ** retry)
        return (rng or random).uniform(0, bound)

    def call(self, fn: Callable[[], T], *, what: str, retryable: Callable[[BaseException], bool],
             sleep: Callable[[float], None] = time.sleep, level: int = logging.WARNING) -> T:
        """``fn()``, tried again while it raises a retryable error and tries and time are left; the last error
        is raised as it was. ``what`` names the call in the log (each retry at ``level``) and in `retry_counts`."""
        start = time.monotonic()
        for retry in range(self.attempts):
            try:
                return fn()
            except Exception as err:
                pause = self.pause(retry)
                last = retry == self.attempts - 1 or not retryable(err)
                if last or time.monotonic() - start + pause > self.deadline_s:
                    raise
                with _lock:
                    _counts[what] += 1
                    _unreported[0] += 1
                log.log(level, "%s failed (%s: %s); retry %d of %d in %.2fs", what, type(err).__name__, err,
                        retry + 1, self.attempts - 1, pause)
                sleep(pause)
        raise AssertionError("unreachable: the last try returns or raises")


def retry_counts() -> dict[str, int]:
    """Retries made in this process so far, per ``what``."""
    with _lock:
        return dict(_counts)


def take_retries() -> int:
    """Retries made in this process that no one has taken yet; each is handed out once. A rollout or reward worker
    attaches them to the batch or scores it returns, the driver adds its own (remote storage) to the step's
    metrics, so a step's ``retries`` counts every retry of every process once, in-process groups included."""
    with _lock:
        count, _unreported[0] = _unreported[0], 0
    return count


def transient(err: BaseException) -> bool:
    """Errors worth another try on any transport: connection failures and timeouts (OSError covers both,
    ``TimeoutError`` and ``ConnectionError`` included). A missing file or a refused permission is not."""
    return isinstance(err, OSError) and not isinstance(err, FileNotFoundError | PermissionError | IsADirectoryError
                                                               | NotADirectoryError | FileExistsError)
