"""The conversation store on SQLite: the one-machine default.

One `sqlite3` connection per store, used from worker threads
(`asyncio.to_thread`) under a lock (`sqlite_file.py`), so the event loop never
waits on disk.
WAL mode and a busy timeout let a gateway process and a recorder process
share one file: readers never block the writer, and a writer waits for the
other process's write instead of failing. Files made by an older chatpipe
gain the newer columns on open.

API keys are hashed under the key secret the store is opened with (`key_secret`);
a store opened without one (a recorder, `chatpipe keys list`) can list and revoke
keys but not add or find one.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import astuple, replace
from pathlib import Path

from common.sqlite_file import transaction
from conversations.sqlite_files import SQLiteFiles
from conversations.sqlite_orgs import SQLiteOrgs
from conversations.sqlite_schema import (
    API_KEY_COLUMNS,
    CONVERSATION_COLUMNS,
    MESSAGE_COLUMNS,
    REQUEST_COLUMNS,
    api_key_row,
    conversation_row,
    create_schema,
    message_row,
    message_values,
)
from conversations.store import (
    ApiKey,
    Conversation,
    ConversationPage,
    NewMessage,
    NoKeySecret,
    RequestRecord,
    StoredMessage,
    Summary,
    TurnUsage,
    branch_ends,
    check_answer_start,
    decode_cursor,
    derived_key_id,
    encode_cursor,
    hash_api_key,
)
from conversations.tree import ConversationTree, parent_key
from schemas.lifecycle import RequestStatus

__all__ = ["SQLiteStore", "hash_api_key"]


class SQLiteStore(SQLiteOrgs, SQLiteFiles):
    """`ConversationStore` on one SQLite file (or ":memory:" for tests).

    Message seq numbers start at 1 and are assigned inside a write
    transaction, so two processes appending to one conversation never collide.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        key_secret: bytes | None = None,
        busy_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(path, busy_timeout_s=busy_timeout_s, clock=clock)
        self._key_secret = key_secret

    # --- conversations ------------------------------------------------------------

    async def create_conversation(
        self, conversation_id: str, user_id: str, title: str = "", *, org_id: str
    ) -> Conversation:
        def create(conn: sqlite3.Connection) -> Conversation:
            conn.execute(
                f"INSERT OR IGNORE INTO conversations ({CONVERSATION_COLUMNS})"
                " VALUES (?, ?, ?, ?, '', ?)",
                (conversation_id, user_id, title, self._clock(), org_id),
            )
            found = _get_conversation(conn, conversation_id)
            assert found is not None
            return found

        return await self._run(create)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        return await self._run(lambda conn: _get_conversation(conn, conversation_id))

    async def list_conversations(
        self, user_id: str, *, org_id: str, limit: int = 50, cursor: str | None = None
    ) -> ConversationPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        after = decode_cursor(cursor) if cursor else (float("inf"), "")

        def select(conn: sqlite3.Connection) -> ConversationPage:
            rows = conn.execute(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE org_id = ?"
                " AND user_id = ?"
                " AND (created_at < ? OR (created_at = ? AND conversation_id > ?))"
                " ORDER BY created_at DESC, conversation_id LIMIT ?",
                (org_id, user_id, after[0], after[0], after[1], limit + 1),
            ).fetchall()
            page = [conversation_row(row) for row in rows[:limit]]
            more = len(rows) > limit
            return ConversationPage(page, encode_cursor(page[-1]) if more else None)

        return await self._run(select)

    async def rename_conversation(
        self, conversation_id: str, user_id: str, title: str, *, org_id: str
    ) -> Conversation | None:
        if not org_id:
            return None

        def rename(conn: sqlite3.Connection) -> Conversation | None:
            conn.execute(
                "UPDATE conversations SET title = ?"
                " WHERE conversation_id = ? AND org_id = ? AND user_id = ?",
                (title, conversation_id, org_id, user_id),
            )
            found = _get_conversation(conn, conversation_id)
            return found if _owned(found, org_id, user_id) else None

        return await self._run(rename)

    async def set_auto_title(self, conversation_id: str, title: str) -> None:
        await self._run(
            lambda conn: conn.execute(
                "UPDATE conversations SET auto_title = ? WHERE conversation_id = ?",
                (title, conversation_id),
            )
        )

    async def delete_conversation(self, conversation_id: str, user_id: str, *, org_id: str) -> bool:
        if not org_id:
            return False

        def delete(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                gone = conn.execute(
                    "DELETE FROM conversations"
                    " WHERE conversation_id = ? AND org_id = ? AND user_id = ?",
                    (conversation_id, org_id, user_id),
                ).rowcount
                if gone:
                    for table in (
                        "messages",
                        "branch_choices",
                        "summaries",
                        "embeddings",
                        "citations",
                        "tool_steps",
                        "requests",
                    ):
                        conn.execute(
                            f"DELETE FROM {table} WHERE conversation_id = ?", (conversation_id,)
                        )
            return bool(gone)

        return await self._run(delete)

    # --- messages -----------------------------------------------------------------

    async def delete_messages(self, conversation_id: str, message_ids: Collection[str]) -> int:
        def delete(conn: sqlite3.Connection) -> int:
            with transaction(conn):
                doomed = branch_ends(_list_messages(conn, conversation_id), message_ids)
                for message in doomed:
                    key = (conversation_id, message.message_id)
                    for table, column in _KEPT_PER_MESSAGE:
                        conn.execute(
                            f"DELETE FROM {table} WHERE conversation_id = ? AND {column} = ?", key
                        )
                    conn.execute(
                        "DELETE FROM branch_choices WHERE conversation_id = ? AND parent_key = ?",
                        key,
                    )
            return len(doomed)

        return await self._run(delete)

    async def add_message(self, message: NewMessage) -> StoredMessage:
        return await self._run(lambda conn: self._add_message(conn, message))

    async def get_message(self, message_id: str) -> StoredMessage | None:
        return await self._run(lambda conn: _get_message(conn, message_id))

    async def start_answer(self, message: NewMessage, request: RequestRecord) -> StoredMessage:
        check_answer_start(message, request)
        return await self._run(lambda conn: self._add_message(conn, message, request))

    async def finish_answer(self, message: NewMessage) -> bool:
        def finish(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "UPDATE messages SET content = ?, tokens = ?, prompt_tokens = ?,"
                " cached_tokens = ?, model = ?, status = ? WHERE message_id = ? AND status = ?",
                (message.content, message.tokens, message.prompt_tokens, message.cached_tokens,
                 message.model, message.status.value, message.message_id,
                 RequestStatus.IN_PROGRESS.value),
            )  # fmt: skip
            return cursor.rowcount > 0

        return await self._run(finish)

    async def get_request(self, request_id: str) -> RequestRecord | None:
        row = await self._run(
            lambda conn: conn.execute(
                f"SELECT {REQUEST_COLUMNS} FROM requests WHERE request_id = ?", (request_id,)
            ).fetchone()
        )
        return RequestRecord(*row) if row else None

    async def in_progress_requests(self, conversation_id: str) -> list[str]:
        def select(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT request_id FROM messages WHERE conversation_id = ? AND status = ?"
                " AND request_id IS NOT NULL ORDER BY seq",
                (conversation_id, RequestStatus.IN_PROGRESS.value),
            )
            return [request_id for (request_id,) in rows]

        return await self._run(select)

    async def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        return await self._run(lambda conn: _list_messages(conn, conversation_id))

    async def get_tree(self, conversation_id: str) -> ConversationTree:
        def select(conn: sqlite3.Connection) -> ConversationTree:
            return ConversationTree.of(
                _list_messages(conn, conversation_id), _choices(conn, conversation_id)
            )

        return await self._run(select)

    async def select_message(
        self, conversation_id: str, user_id: str, message_id: str, *, org_id: str
    ) -> bool:
        def select(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                if not _owned(_get_conversation(conn, conversation_id), org_id, user_id):
                    return False
                tree = ConversationTree.of(_list_messages(conn, conversation_id), {})
                path = tree.path_to(message_id)
                conn.executemany(
                    "INSERT OR REPLACE INTO branch_choices VALUES (?, ?, ?)",
                    [(conversation_id, parent_key(m.parent_id), m.message_id) for m in path],
                )
            return bool(path)

        return await self._run(select)

    async def message_usage(self, conversation_id: str) -> list[TurnUsage]:
        def select(conn: sqlite3.Connection) -> list[TurnUsage]:
            rows = conn.execute(
                "SELECT message_id, seq, model, prompt_tokens, cached_tokens, tokens"
                " FROM messages WHERE conversation_id = ? AND role = 'assistant' ORDER BY seq",
                (conversation_id,),
            )
            return [TurnUsage(*row) for row in rows]

        return await self._run(select)

    # --- context ------------------------------------------------------------------

    async def save_summary(
        self, conversation_id: str, through_message_id: str, content: str
    ) -> None:
        await self._run(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?)",
                (conversation_id, through_message_id, content, self._clock()),
            )
        )

    async def list_summaries(self, conversation_id: str) -> list[Summary]:
        def select(conn: sqlite3.Connection) -> list[Summary]:
            rows = conn.execute(
                "SELECT conversation_id, through_message_id, content, created_at FROM summaries"
                " WHERE conversation_id = ? ORDER BY created_at, through_message_id",
                (conversation_id,),
            )
            return [Summary(*row) for row in rows]

        return await self._run(select)

    async def save_embeddings(
        self, conversation_id: str, model: str, vectors: Mapping[str, bytes]
    ) -> None:
        rows = [(conversation_id, model, mid, vector) for mid, vector in vectors.items()]
        await self._run(
            lambda conn: conn.executemany(
                "INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?, ?)", rows
            )
        )

    async def load_embeddings(self, conversation_id: str, model: str) -> dict[str, bytes]:
        def select(conn: sqlite3.Connection) -> dict[str, bytes]:
            rows = conn.execute(
                "SELECT message_id, vector FROM embeddings WHERE conversation_id = ? AND model = ?",
                (conversation_id, model),
            )
            return {message_id: bytes(vector) for message_id, vector in rows}

        return await self._run(select)

    # --- API keys -----------------------------------------------------------------

    async def add_api_key(self, key: str, owner: ApiKey) -> None:
        key_hash = self._hash(key)
        o = owner
        values = (key_hash, o.key_id or derived_key_id(key_hash), o.user_id, o.org_id,
                  o.tier.value, o.name, o.created_at or self._clock(), o.expires_at,
                  o.revoked_at, o.max_concurrent_requests)  # fmt: skip
        await self._run(
            lambda conn: conn.execute(
                f"INSERT OR IGNORE INTO api_keys (key_hash, {API_KEY_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
        )

    async def find_api_key(self, key: str) -> ApiKey | None:
        key_hash = self._hash(key)

        def select(conn: sqlite3.Connection) -> ApiKey | None:
            row = conn.execute(
                f"SELECT {API_KEY_COLUMNS} FROM api_keys WHERE key_hash = ?", (key_hash,)
            ).fetchone()
            return api_key_row(row) if row else None

        return await self._run(select)

    async def list_api_keys(self) -> list[ApiKey]:
        def select(conn: sqlite3.Connection) -> list[ApiKey]:
            rows = conn.execute(
                f"SELECT {API_KEY_COLUMNS} FROM api_keys ORDER BY created_at, key_id"
            )
            return [api_key_row(row) for row in rows]

        return await self._run(select)

    async def revoke_api_key(self, key_id: str) -> bool:
        def revoke(conn: sqlite3.Connection) -> bool:
            conn.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                (self._clock(), key_id),
            )
            found = conn.execute("SELECT 1 FROM api_keys WHERE key_id = ?", (key_id,))
            return found.fetchone() is not None

        return await self._run(revoke)

    # --- plumbing -----------------------------------------------------------------

    def _hash(self, key: str) -> str:
        if self._key_secret is None:
            raise NoKeySecret()
        return hash_api_key(key, self._key_secret)

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        create_schema(conn)

    def _add_message(
        self, conn: sqlite3.Connection, message: NewMessage, request: RequestRecord | None = None
    ) -> StoredMessage:
        # IMMEDIATE takes the write lock before reading MAX(seq), so another
        # process cannot pick the same seq between our read and our insert.
        with transaction(conn):
            stored = _get_message(conn, message.message_id)
            if stored is not None:
                return stored
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
                prompt_tokens=message.prompt_tokens,
                cached_tokens=message.cached_tokens,
                alias=message.alias,
            )
            placeholders = ", ".join("?" * len(MESSAGE_COLUMNS.split(",")))
            conn.execute(
                f"INSERT INTO messages ({MESSAGE_COLUMNS}) VALUES ({placeholders})",
                message_values(stored),
            )
            conn.execute(
                "INSERT OR REPLACE INTO branch_choices VALUES (?, ?, ?)",
                (stored.conversation_id, parent_key(stored.parent_id), stored.message_id),
            )
            if request is not None:
                conn.execute(
                    f"INSERT OR IGNORE INTO requests ({REQUEST_COLUMNS})"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    astuple(replace(request, created_at=stored.created_at)),
                )
            return stored


_KEPT_PER_MESSAGE = (
    ("messages", "message_id"),
    ("branch_choices", "child_id"),
    ("summaries", "through_message_id"),
    ("embeddings", "message_id"),
    ("citations", "message_id"),
    ("tool_steps", "message_id"),
    ("requests", "message_id"),
)
"""A message and what is kept of it, by the column naming it."""


def _owned(conversation: Conversation | None, org_id: str, user_id: str) -> bool:
    return (conversation is not None and bool(org_id)
            and (conversation.org_id, conversation.user_id) == (org_id, user_id))  # fmt: skip


def _get_conversation(conn: sqlite3.Connection, conversation_id: str) -> Conversation | None:
    row = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()
    return conversation_row(row) if row else None


def _get_message(conn: sqlite3.Connection, message_id: str) -> StoredMessage | None:
    row = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE message_id = ?", (message_id,)
    ).fetchone()
    return message_row(row) if row else None


def _list_messages(conn: sqlite3.Connection, conversation_id: str) -> list[StoredMessage]:
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    )
    return [message_row(row) for row in rows]


def _choices(conn: sqlite3.Connection, conversation_id: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT parent_key, child_id FROM branch_choices WHERE conversation_id = ?",
        (conversation_id,),
    )
    return dict(rows.fetchall())
