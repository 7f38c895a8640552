"""HTTP models of a user's documents (`/v1/files`, shaped as OpenAI's files API) and of
the citations an answer grounded on them carries (apart from the Kafka events).

A file is uploaded as multipart (`file`, `purpose`), split into chunks and embedded;
a turn that names `file_ids` gets the chunks most similar to its message in its
prompt, and its answer cites them (`Citation`: in the stream's `event: citations`
and on the stored message).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

PURPOSES = ("assistants", "user_data")
"""The OpenAI purposes of a file to search; any other is refused."""

FilePurpose = Literal["assistants", "user_data"]

MAX_FILES_PER_TURN = 20
"""The most files one turn may name (`file_ids`)."""


class FileObject(BaseModel):
    """A stored file, as OpenAI's `file` object, with how it was chunked."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"
    content_type: str = Field(description="text/plain, text/markdown or application/pdf")
    chunks: int = Field(description="the pieces it was split into, each embedded")


class FileList(BaseModel):
    """A page of the caller's files, as OpenAI's cursor pages."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool = Field(description="more follow: pass `last_id` as `after`")
    first_id: str | None
    last_id: str | None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


# A dataclass, not a model: the stores build it from rows as the API shows it.
@pydantic_dataclass(frozen=True, slots=True)
class Citation:
    """A chunk of a file that went into an answer's prompt."""

    file_id: str
    filename: str
    chunk_index: int
    score: float
    """Cosine similarity of the chunk to the user's message (-1 to 1)."""
    snippet: str
    """The start of the chunk's text."""


class CitationsPayload(BaseModel):
    """`event: citations` of a native stream, before the answer's first delta."""

    citations: list[Citation]
