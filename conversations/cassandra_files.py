"""`FileStore` on Cassandra (`conversations.files`): the `files`, `files_by_owner`,
`file_chunks` and `citations` tables of `cassandra_schema`, as the base of
`CassandraStore`.

Adding a file claims its id first (`INSERT … IF NOT EXISTS` on `files`: of two
writers only the first stores), then writes its chunks, then its entry in its
owner's list, so a file is listed only once its chunks are there. Should a writer
die before the end, the file is not listed; adding it again completes it.
Deleting takes the file row with a condition on its owner, then the list entry
and the chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import astuple, replace

from conversations import cassandra_schema as cql
from conversations.cassandra_session import Rows
from conversations.files import (
    FileChunk,
    StoredFile,
    citations_json,
    citations_of,
    display_filename,
    tool_steps_json,
    tool_steps_of,
)
from schemas.files import Citation
from schemas.tools import ToolStep

_FILE_FIELDS = [c.strip() for c in cql.FILE_COLUMNS.split(",")]


class CassandraFiles:
    """The file methods of `CassandraStore` (which runs the statements: `_run`)."""

    _clock: Callable[[], float]

    async def _run(self, name: str, values: tuple) -> Rows:
        raise NotImplementedError

    async def add_file(self, file: StoredFile, chunks: Sequence[FileChunk]) -> StoredFile:
        new = replace(
            file,
            filename=display_filename(file.filename),
            created_at=file.created_at or self._clock(),
        )
        rows = await self._run("insert_file", astuple(new))
        if not cql.applied(rows):
            stored = _file_of(rows[0])
            if await self._run("select_file_chunks", (stored.file_id,)):
                return stored  # a repeat: the first one stays
            new = stored  # its writer died before its chunks: complete it
        # one write each: a batch of many chunks passes Cassandra's batch size limit
        await asyncio.gather(*(self._run("insert_file_chunk", astuple(c)) for c in chunks))
        await self._run("insert_file_by_owner", astuple(new))
        return new

    async def get_file(self, file_id: str) -> StoredFile | None:
        rows = await self._run("select_file", (file_id,))
        return _file_of(rows[0]) if rows else None

    async def list_files(self, user_id: str, *, org_id: str) -> list[StoredFile]:
        rows = await self._run("select_files_by_owner", (org_id, user_id))
        return [_file_of(row) for row in rows]

    async def delete_file(self, file_id: str, user_id: str, *, org_id: str) -> bool:
        found = await self.get_file(file_id)
        owner = (org_id, user_id)
        if found is None or not org_id or (found.org_id, found.user_id) != owner:
            return False
        if not cql.applied(await self._run("delete_file", (file_id, *owner))):
            return False  # deleted meanwhile
        await asyncio.gather(
            self._run("delete_file_by_owner", (*owner, found.created_at, file_id)),
            self._run("delete_file_chunks", (file_id,)),
        )
        return True

    async def file_chunks(self, file_ids: Sequence[str]) -> list[FileChunk]:
        ids = list(dict.fromkeys(file_ids))
        found = await asyncio.gather(*(self._run("select_file_chunks", (i,)) for i in ids))
        return [
            FileChunk(r["file_id"], r["chunk_index"], r["content"] or "", bytes(r["vector"]))
            for rows in found for r in sorted(rows, key=lambda r: r["chunk_index"])
        ]  # fmt: skip

    async def save_citations(self, conversation_id: str, message_id: str,
                             citations: Sequence[Citation]) -> None:  # fmt: skip
        await self._run(
            "insert_citations", (conversation_id, message_id, citations_json(citations))
        )

    async def list_citations(self, conversation_id: str) -> dict[str, list[Citation]]:
        rows = await self._run("select_citations", (conversation_id,))
        return {row["message_id"]: citations_of(row["citations"]) for row in rows}

    async def save_tool_steps(self, conversation_id: str, message_id: str,
                              steps: Sequence[ToolStep]) -> None:  # fmt: skip
        await self._run("insert_tool_steps", (conversation_id, message_id, tool_steps_json(steps)))

    async def list_tool_steps(self, conversation_id: str) -> dict[str, list[ToolStep]]:
        rows = await self._run("select_tool_steps", (conversation_id,))
        return {row["message_id"]: tool_steps_of(row["steps"]) for row in rows}


def _file_of(row: cql.Row) -> StoredFile:
    return StoredFile(**{name: row[name] for name in _FILE_FIELDS})
