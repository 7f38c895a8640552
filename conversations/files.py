"""A user's documents in the conversation store: the records and the store interface
(`FileStore`, part of `ConversationStore`). Both stores implement it and pass
`tests/integration/test_store_conformance.py`.

Contracts:

* A file is stored with its chunks in one call (`add_file`), idempotent on its id
  (the first one stored is kept). Chunks never change; a file is not edited, only
  deleted (`delete_file`, its chunks with it).
* A file's name is stored as it is shown (`display_filename`): `add_file` stores and
  returns it without control or bidi-control characters, so lists and citations show
  what a user can read.
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

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from schemas.files import Citation
from schemas.tools import ToolStep

UNNAMED = "upload"
"""The name of a file whose name is nothing once made safe to show."""
_INVISIBLE = frozenset(
    "\u00ad\u061c\u180e\u200b\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff"
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u206a\u206b\u206c\u206d"
    "\u206e\u206f\ufff9\ufffa\ufffb"
)
"""Format characters that change how the text around them shows or show nothing: the
bidi marks, embeddings, overrides and isolates, zero-width spaces and joiners that are
not a script's (ZWJ and ZWNJ stay: emoji and several scripts need them), the soft
hyphen, the byte-order mark, interlinear annotation."""


def display_filename(name: str) -> str:
    """`name` as lists and citations show it: white space of any kind (tabs, line
    ends, line and paragraph separators) becomes a space, the other control characters
    (C0, DEL, C1), the characters of `_INVISIBLE` and lone surrogates are dropped, runs
    of spaces become one and the ends are trimmed; `UNNAMED` if nothing is left. The
    same name again gives itself."""
    kept: list[str] = []
    for char in name:
        if char.isspace():
            kept.append(" ")
        elif unicodedata.category(char) not in ("Cc", "Cs") and char not in _INVISIBLE:
            kept.append(char)
    return " ".join("".join(kept).split()) or UNNAMED


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
        """Store the file (its name as `display_filename` gives it) and its chunks, and
        return it as stored; a file_id already stored is returned unchanged."""

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
