"""`FileStore` on SQLite (`conversations.files`): the `files`, `file_chunks` and
`citations` tables of `sqlite_schema`, mixed into `SQLiteStore`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import astuple, replace

from common.sqlite_file import SQLiteFile, transaction
from conversations.files import (
    FileChunk,
    StoredFile,
    citations_json,
    citations_of,
    display_filename,
    tool_steps_json,
    tool_steps_of,
)
from conversations.sqlite_schema import FILE_COLUMNS
from schemas.files import Citation
from schemas.tools import ToolStep


class SQLiteFiles(SQLiteFile):
    """The file methods of `SQLiteStore`."""

    async def add_file(self, file: StoredFile, chunks: Sequence[FileChunk]) -> StoredFile:
        new = replace(
            file,
            filename=display_filename(file.filename),
            created_at=file.created_at or self._clock(),
        )
        placeholders = ", ".join("?" * len(FILE_COLUMNS.split(",")))

        def add(conn: sqlite3.Connection) -> StoredFile:
            with transaction(conn):
                found = _get_file(conn, file.file_id)
                if found is not None:
                    return found
                conn.execute(
                    f"INSERT INTO files ({FILE_COLUMNS}) VALUES ({placeholders})", astuple(new)
                )
                conn.executemany(
                    "INSERT INTO file_chunks VALUES (?, ?, ?, ?)", [astuple(c) for c in chunks]
                )
            return new

        return await self._run(add)

    async def get_file(self, file_id: str) -> StoredFile | None:
        return await self._run(lambda conn: _get_file(conn, file_id))

    async def list_files(self, user_id: str, *, org_id: str) -> list[StoredFile]:
        def select(conn: sqlite3.Connection) -> list[StoredFile]:
            rows = conn.execute(
                f"SELECT {FILE_COLUMNS} FROM files WHERE org_id = ? AND user_id = ?"
                " ORDER BY created_at DESC, file_id",
                (org_id, user_id),
            )
            return [StoredFile(*row) for row in rows]

        return await self._run(select)

    async def delete_file(self, file_id: str, user_id: str, *, org_id: str) -> bool:
        if not org_id:
            return False

        def delete(conn: sqlite3.Connection) -> bool:
            with transaction(conn):
                gone = conn.execute(
                    "DELETE FROM files WHERE file_id = ? AND org_id = ? AND user_id = ?",
                    (file_id, org_id, user_id),
                ).rowcount
                if gone:
                    conn.execute("DELETE FROM file_chunks WHERE file_id = ?", (file_id,))
            return bool(gone)

        return await self._run(delete)

    async def file_chunks(self, file_ids: Sequence[str]) -> list[FileChunk]:
        def select(conn: sqlite3.Connection) -> list[FileChunk]:
            found = []
            for file_id in dict.fromkeys(file_ids):
                rows = conn.execute(
                    "SELECT file_id, chunk_index, content, vector FROM file_chunks"
                    " WHERE file_id = ? ORDER BY chunk_index",
                    (file_id,),
                )
                found += [FileChunk(f, i, text, bytes(v)) for f, i, text, v in rows]
            return found

        return await self._run(select)

    async def save_citations(self, conversation_id: str, message_id: str,
                             citations: Sequence[Citation]) -> None:  # fmt: skip
        text = citations_json(citations)
        await self._run(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO citations VALUES (?, ?, ?)",
                (conversation_id, message_id, text),
            )
        )

    async def list_citations(self, conversation_id: str) -> dict[str, list[Citation]]:
        def select(conn: sqlite3.Connection) -> dict[str, list[Citation]]:
            rows = conn.execute(
                "SELECT message_id, citations FROM citations WHERE conversation_id = ?",
                (conversation_id,),
            )
            return {message_id: citations_of(text) for message_id, text in rows}

        return await self._run(select)

    async def save_tool_steps(self, conversation_id: str, message_id: str,
                              steps: Sequence[ToolStep]) -> None:  # fmt: skip
        text = tool_steps_json(steps)
        await self._run(
            lambda conn: conn.execute(
                "INSERT OR REPLACE INTO tool_steps VALUES (?, ?, ?)",
                (conversation_id, message_id, text),
            )
        )

    async def list_tool_steps(self, conversation_id: str) -> dict[str, list[ToolStep]]:
        def select(conn: sqlite3.Connection) -> dict[str, list[ToolStep]]:
            rows = conn.execute(
                "SELECT message_id, steps FROM tool_steps WHERE conversation_id = ?",
                (conversation_id,),
            )
            return {message_id: tool_steps_of(text) for message_id, text in rows}

        return await self._run(select)


def _get_file(conn: sqlite3.Connection, file_id: str) -> StoredFile | None:
    row = conn.execute(f"SELECT {FILE_COLUMNS} FROM files WHERE file_id = ?", (file_id,)).fetchone()
    return StoredFile(*row) if row else None
