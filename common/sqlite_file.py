"""One SQLite file used from asyncio: the conversation store and the token ledger share it.

One connection in WAL mode, autocommit with explicit transactions; every call runs
in a worker thread under a lock, so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class SQLiteFile:
    """The connection handling of a SQLite-backed class; subclasses create their schema."""

    def __init__(
        self,
        path: Path | str,
        *,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = str(path)
        self._busy_timeout_s = busy_timeout_s
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def open(self) -> None:
        if self._conn is None:
            await asyncio.to_thread(self._open)

    async def close(self) -> None:
        if self._conn is not None:
            await self._run(lambda conn: conn.close())
            self._conn = None

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        raise NotImplementedError

    def _open(self) -> None:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout_s,
            isolation_level=None,  # autocommit; transactions are explicit
            check_same_thread=False,  # used from to_thread workers, under self._lock
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # durable enough under WAL, far faster
        self._create_schema(conn)
        self._conn = conn

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise RuntimeError(f"{type(self).__name__} is not open")

        def locked() -> T:
            with self._lock:
                return work(conn)

        return await asyncio.to_thread(locked)


class transaction:
    """BEGIN IMMEDIATE … COMMIT, or ROLLBACK on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
