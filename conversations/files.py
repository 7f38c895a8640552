"""A user's documents in the conversation store: the records and the store interface
(`FileStore`, part of `ConversationStore`). Both stores implement it and pass
`tests/integration/test_store_conformance.py`.

Contracts:

* A file is stored with its chunks in one call (`add_file`), idempotent on its id
  (the first one stored is kept). Chunks never change; a file is not edited, only
  deleted (`delete_file`, its chunks with it).
* Ownership is by (org_id, user_id), as for conversations: `list_files` lists one
  owner's; `delete_file` deletes only its owner's (False otherwise, as for an unknown
  id). Reads by id (`get_file`, `file_chunks`) do not check who asks: the caller
  compares the record's owner with its own first (`conversations.store.owns`).
* A chunk's `vector` is its embedding (little-endian float32 bytes, unit length) by
  the file's `embedding_model`.
* Citations: the chunks an answer's prompt carried, saved once per answer message
  (`save_citations`) and read back per conversation (`list_citations`); deleting the
  conversation deletes them. They keep a file's name and snippet, so they still read
  after the file is deleted.
* Tool steps: the server-tool calls and results of an answer (server-side tools), saved
  per answer message once it ends (`save_tool_steps`), read back per conversation
  (`list_tool_steps`), deleted with the conversation, exactly as citations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from schemas.files import Citation
from schemas.tools import ToolStep


@dataclass(frozen=True, slots=True)
class StoredFile:
    """An uploaded file: who owns it, what it was, and how it was chunked and embedded.
    `created_at` 0 in `add_file`: the store clock's time."""

    file_id: str
    org_id: str
    user_id: str
    filename: str
    content_type: str
    purpose: str
    size_bytes: int
    chunk_count: int
    embedding_model: str
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class FileChunk:
    file_id: str
    chunk_index: int
    text: str
    vector: bytes


class FileStore(Protocol):
    async def add_file(self, file: StoredFile, chunks: Sequence[FileChunk]) -> StoredFile:
        """Store the file and its chunks; a file_id already stored is returned unchanged."""

    async def get_file(self, file_id: str) -> StoredFile | None: ...

    async def list_files(self, user_id: str, *, org_id: str) -> list[StoredFile]:
        """The files of (`org_id`, `user_id`), newest first."""

    async def delete_file(self, file_id: str, user_id: str, *, org_id: str) -> bool:
        """Delete it and its chunks; False if it is not a file of (`org_id`, `user_id`)."""

    async def file_chunks(self, file_ids: Sequence[str]) -> list[FileChunk]:
        """Every chunk of these files: file by file as named, each in chunk order."""

    async def save_citations(self, conversation_id: str, message_id: str,
                             citations: Sequence[Citation]) -> None:  # fmt: skip
        """What the answer `message_id` cites (replacing what was saved for it)."""

    async def list_citations(self, conversation_id: str) -> dict[str, list[Citation]]:
        """The citations of the conversation's answers: message_id -> citations in order."""

    async def save_tool_steps(self, conversation_id: str, message_id: str,
                              steps: Sequence[ToolStep]) -> None:  # fmt: skip
        """Keep the server-tool calls and results of an answer (replacing any kept)."""

    async def list_tool_steps(self, conversation_id: str) -> dict[str, list[ToolStep]]:
        """The tool steps of the conversation's answers: message_id -> steps in order."""


def tool_steps_json(steps: Sequence[ToolStep]) -> str:
    """How both stores keep an answer's server-tool steps: one JSON array."""
    return orjson.dumps([step.model_dump(exclude_defaults=True) for step in steps]).decode()


def tool_steps_of(text: str) -> list[ToolStep]:
    return [ToolStep.model_validate(item) for item in orjson.loads(text)]


def citations_json(citations: Sequence[Citation]) -> str:
    """How both stores keep an answer's citations: one JSON array."""
    return orjson.dumps(list(citations)).decode()


def citations_of(text: str) -> list[Citation]:
    return [Citation(**item) for item in orjson.loads(text)]
