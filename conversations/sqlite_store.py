"""The conversation store on SQLite: the one-machine default (DESIGN §8, §10).

One `sqlite3` connection per store, used from worker threads
(`asyncio.to_thread`) under a lock, so the event loop never waits on disk.
WAL mode and a busy timeout let a gateway process and a recorder process
share one file: readers never block the writer, and a writer waits for the
other process's write instead of failing.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from conversations.store import ApiKey, Conversation, NewMessage, StoredMessage
from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    title TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS conversations_by_user ON conversations (user_id, created_at);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    parent_id TEXT,
    model TEXT,
    status TEXT NOT NULL,
    request_id TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages (parent_id, seq);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    org_id TEXT NOT NULL,
    tier TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""

_MESSAGE_COLUMNS = (
    "message_id, conversation_id, seq, role, content, parent_id, model, tokens,"
    " status, request_id, created_at"
)


def hash_api_key(key: str) -> str:
    """The stored form of an API key: hex sha256, so a leaked table leaks no keys."""
    return hashlib.sha256(key.encode()).hexdigest()


class SQLiteStore:
    """`ConversationStore` on one SQLite file (or ":memory:" for tests).

    Message seq numbers start at 1 and are assigned inside a write
    transaction, so two processes appending to one conversation never collide.
    """

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

    async def create_conversation(
        self, conversation_id: str, user_id: str, title: str = ""
    ) -> Conversation:
        """Create it, or return the one already stored under this id unchanged."""

        def create(conn: sqlite3.Connection) -> Conversation:
            conn.execute(
                "INSERT OR IGNORE INTO conversations VALUES (?, ?, ?, ?)",
                (conversation_id, user_id, title, self._clock()),
            )
            found = _get_conversation(conn, conversation_id)
            assert found is not None
            return found

        return await self._run(create)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        return await self._run(lambda conn: _get_conversation(conn, conversation_id))

    async def list_conversations(self, user_id: str) -> list[Conversation]:
        def select(conn: sqlite3.Connection) -> list[Conversation]:
            rows = conn.execute(
                "SELECT conversation_id, user_id, title, created_at FROM conversations"
                " WHERE user_id = ? ORDER BY created_at DESC, conversation_id",
                (user_id,),
            )
            return [Conversation(*row) for row in rows]

        return await self._run(select)

    async def add_message(self, message: NewMessage) -> StoredMessage:
        return await self._run(lambda conn: self._add_message(conn, message))

    async def get_message(self, message_id: str) -> StoredMessage | None:
        return await self._run(lambda conn: _get_message(conn, message_id))

    async def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        def select(conn: sqlite3.Connection) -> list[StoredMessage]:
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?"
                " ORDER BY seq",
                (conversation_id,),
            )
            return [_message(row) for row in rows]

        return await self._run(select)

    async def find_reply(self, parent_id: str) -> StoredMessage | None:
        def select(conn: sqlite3.Connection) -> StoredMessage | None:
            row = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE parent_id = ?"
                " ORDER BY seq DESC LIMIT 1",
                (parent_id,),
            ).fetchone()
            return _message(row) if row else None

        return await self._run(select)

    async def add_api_key(self, key: str, owner: ApiKey) -> None:
        created_at = owner.created_at or self._clock()
        await self._run(
            lambda conn: conn.execute(
                "INSERT OR IGNORE INTO api_keys VALUES (?, ?, ?, ?, ?)",
                (hash_api_key(key), owner.user_id, owner.org_id, owner.tier.value, created_at),
            )
        )

    async def find_api_key(self, key: str) -> ApiKey | None:
        def select(conn: sqlite3.Connection) -> ApiKey | None:
            row = conn.execute(
                "SELECT user_id, org_id, tier, created_at FROM api_keys WHERE key_hash = ?",
                (hash_api_key(key),),
            ).fetchone()
            return ApiKey(row[0], row[1], Tier(row[2]), row[3]) if row else None

        return await self._run(select)

    def _open(self) -> None:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout_s,
            isolation_level=None,  # autocommit; transactions are explicit
            check_same_thread=False,  # used from to_thread workers, under self._lock
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # durable enough under WAL, far faster
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise RuntimeError("SQLiteStore is not open")

        def locked() -> T:
            with self._lock:
                return work(conn)

        return await asyncio.to_thread(locked)

    def _add_message(self, conn: sqlite3.Connection, message: NewMessage) -> StoredMessage:
        # IMMEDIATE takes the write lock before reading MAX(seq), so another
        # process cannot pick the same seq between our read and our insert.
        conn.execute("BEGIN IMMEDIATE")
        try:
            stored = _get_message(conn, message.message_id)
            if stored is None:
                (seq,) = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE conversation_id = ?",
                    (message.conversation_id,),
                ).fetchone()
                stored = StoredMessage(
                    message_id=message.message_id,
                    conversation_id=message.conversation_id,
                    seq=seq,
                    role=message.role,
                    content=message.content,
                    parent_id=message.parent_id,
                    model=message.model,
                    tokens=message.tokens,
                    status=message.status,
                    request_id=message.request_id,
                    created_at=self._clock(),
                )
                conn.execute(
                    f"INSERT INTO messages ({_MESSAGE_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        stored.message_id, stored.conversation_id, stored.seq,
                        stored.role.value, stored.content, stored.parent_id, stored.model,
                        stored.tokens, stored.status.value, stored.request_id, stored.created_at,
                    ),
                )  # fmt: skip
            conn.execute("COMMIT")
            return stored
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _get_conversation(conn: sqlite3.Connection, conversation_id: str) -> Conversation | None:
    row = conn.execute(
        "SELECT conversation_id, user_id, title, created_at FROM conversations"
        " WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()
    return Conversation(*row) if row else None


def _get_message(conn: sqlite3.Connection, message_id: str) -> StoredMessage | None:
    row = conn.execute(
        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE message_id = ?", (message_id,)
    ).fetchone()
    return _message(row) if row else None


def _message(row: tuple) -> StoredMessage:
    (message_id, conversation_id, seq, role, content, parent_id, model, tokens,
     status, request_id, created_at) = row  # fmt: skip
    return StoredMessage(
        message_id=message_id,
        conversation_id=conversation_id,
        seq=seq,
        role=Role(role),
        content=content,
        parent_id=parent_id,
        model=model,
        tokens=tokens,
        status=RequestStatus(status),
        request_id=request_id,
        created_at=created_at,
    )
