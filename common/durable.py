"""Writing through a store that fails for a while (locked, unreachable, timing out):
the stages that persist what they read retry with backoff and hold their place in the
topic meanwhile, instead of dead-lettering good events."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_TRANSIENT_NAMES = {
    "Unavailable",
    "NoHostAvailable",
    "OperationTimedOut",
    "WriteTimeout",
    "ReadTimeout",
    "CoordinationFailure",
}


def is_transient(error: BaseException) -> bool:
    """A store error that goes away by itself (SQLite busy or locked, Cassandra
    unavailable or timing out, a network error): retry, do not dead-letter."""
    return (
        isinstance(error, sqlite3.OperationalError | OSError | TimeoutError)
        or type(error).__name__ in _TRANSIENT_NAMES
    )


async def retried(
    write: Callable[[], Awaitable[T]], what: str, give_up_after_s: float | None = None
) -> T:
    """`write()` until it succeeds; a transient failure waits and tries again (by
    default forever: the stage stalls rather than lose the event; with
    `give_up_after_s`, the last failure raises once that time has passed), any other
    failure raises."""
    attempt = 0
    deadline = None if give_up_after_s is None else time.monotonic() + give_up_after_s
    while True:
        try:
            return await write()
        except Exception as error:
            if not is_transient(error) or (deadline is not None and time.monotonic() > deadline):
                raise
            delay = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
            log.warning("%s failed (%s); retrying in %.1f s", what, error, delay)
            attempt += 1
            await asyncio.sleep(delay)
