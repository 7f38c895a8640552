"""Native API routes over the caller's documents, shaped as OpenAI's files API:
upload (multipart `file` + `purpose`: text, Markdown or PDF), list, read, delete.

An upload is checked (its size and type, costing nothing), admitted (rate limited as
one request and one file, `gateway.admission`), read and chunked in a limited process
(`retrieval.extraction`), charged the tokens its chunks make the embedding model read,
then embedded and stored before the answer (`retrieval.documents`, off the event
loop); a turn then names it in `file_ids`. A user only ever sees their
own files — own by (org, user) — any other id is 404 `file_not_found`, as an unknown
one is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from math import ceil
from pathlib import PurePath
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile

from common.embeddings import embedding_model_name
from conversations.files import StoredFile
from conversations.store import ApiKey
from gateway.admission.gates import Admission
from gateway.admission.rate_limits import CHARS_PER_TOKEN
from gateway.deps import Deps, StoreDep
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.native.grounding import owned_file
from gateway.refusals import NotFound, Refused, TooLarge, Unacceptable, Unavailable
from retrieval.documents import Documents, FileTooLarge, TooManyChunks, Upload
from retrieval.extract import (
    FileTooComplex,
    TextTooLong,
    TooManyPages,
    UnreadableFile,
    UnsupportedFile,
)
from retrieval.extraction import ExtractionBusy
from schemas.files import FileDeleted, FileList, FileObject, FilePurpose

router = APIRouter(tags=["files"])

MAX_FILENAME_CHARS = 255
MAX_PAGE = 10_000
"""The most files one list answers (OpenAI's limit)."""
BUSY_RETRY_AFTER_S = 5
"""Retry-After of a 503 `files_busy`: every extraction process busy, the queue full."""


def _documents(deps: Deps) -> Documents:
    if deps.documents is None:
        raise Unavailable("files_unavailable", "this gateway keeps no files")
    return deps.documents


DocumentsDep = Annotated[Documents, Depends(_documents)]

_REFUSALS: dict[type[Exception], tuple[type[Refused], str]] = {
    FileTooLarge: (TooLarge, "file_too_large"),
    TooManyChunks: (TooLarge, "too_many_chunks"),
    TooManyPages: (TooLarge, "too_many_pages"),
    TextTooLong: (TooLarge, "file_text_too_long"),
    FileTooComplex: (TooLarge, "file_too_complex"),
    UnsupportedFile: (Unacceptable, "unsupported_file_type"),
    UnreadableFile: (Unacceptable, "unreadable_file"),
}
"""How an upload that cannot be stored is refused."""


@router.post("/files", responses=error_responses(400, 413, 429, 503))
async def upload_file(
    file: Annotated[UploadFile, File(description="text (.txt), Markdown (.md) or PDF")],
    purpose: Annotated[FilePurpose, Form(description="assistants or user_data")],
    owner: Owner, documents: DocumentsDep, deps: Deps,
) -> FileObject:  # fmt: skip
    """Store a document of the caller's, chunked and embedded, for turns to name in
    `file_ids`."""
    upload = Upload(org_id=owner.org_id, user_id=owner.user_id,
                    filename=_filename(file.filename), declared_type=file.content_type,
                    purpose=purpose, data=await file.read())  # fmt: skip
    model = embedding_model_name(deps.config.context.embedding_model)
    return file_object(await add_file(documents, deps.admission, owner, upload, model))


async def add_file(documents: Documents, admission: Admission, owner: ApiKey, upload: Upload,
                   model: str) -> StoredFile:  # fmt: skip
    """Check `upload`, admit it (1 request, 1 file, no tokens yet), read it, charge the
    tokens `model` is to embed (its chunks' characters / 4), then embed and keep it. A
    file refused once read stays charged its request and file: reading it was done."""
    with _refused():
        documents.check(upload)
    ask = await admission.admit(owner, 0, model, generations=0, files=1)
    with _refused():
        read = await documents.read(upload)
    await admission.settle(ask, ceil(read.chars / CHARS_PER_TOKEN))
    return await documents.keep(upload, read)


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    """An upload's refusal as the API says it (`_REFUSALS`, 503 `files_busy`)."""
    try:
        yield
    except ExtractionBusy as busy:
        raise Unavailable("files_busy", str(busy), retry_after_s=BUSY_RETRY_AFTER_S) from None
    except tuple(_REFUSALS) as error:
        kind, code = _REFUSALS[type(error)]
        raise kind(code, str(error), param="file") from None


@router.get("/files")
async def list_files(
    owner: Owner, store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    after: Annotated[str | None, Query(description="`last_id` of the previous page")] = None,
    order: Literal["asc", "desc"] = "desc",
    purpose: FilePurpose | None = None,
) -> FileList:  # fmt: skip
    """The caller's files, newest first (`order=asc`: oldest), a page at a time as
    OpenAI's list: `has_more`, then `after=<last_id>` for the next page."""
    files = await store.list_files(owner.user_id, org_id=owner.org_id)
    listed = [file_object(f) for f in (files if order == "desc" else files[::-1])
              if purpose is None or f.purpose == purpose]  # fmt: skip
    return page(listed, limit, after)


@router.get("/files/{file_id}", responses=error_responses(404))
async def get_file(file_id: str, owner: Owner, store: StoreDep) -> FileObject:
    return file_object(await owned_file(store, owner, file_id))


@router.delete("/files/{file_id}", responses=error_responses(404))
async def delete_file(file_id: str, owner: Owner, store: StoreDep) -> FileDeleted:
    """Delete the file and its chunks; answers already given keep their citations."""
    await owned_file(store, owner, file_id)
    if not await store.delete_file(file_id, owner.user_id, org_id=owner.org_id):
        raise NotFound("file_not_found", f"no file {file_id!r}")  # deleted meanwhile
    return FileDeleted(id=file_id)


def page(files: list[FileObject], limit: int, after: str | None) -> FileList:
    """The `limit` files after the one with id `after` (from the start without it; none
    after an id not listed)."""
    if after is not None:
        ids = [f.id for f in files]
        files = files[ids.index(after) + 1 :] if after in ids else []
    shown = files[:limit]
    return FileList(data=shown, has_more=len(files) > limit,
                    first_id=shown[0].id if shown else None,
                    last_id=shown[-1].id if shown else None)  # fmt: skip


def file_object(file: StoredFile) -> FileObject:
    return FileObject(id=file.file_id, bytes=file.size_bytes, created_at=int(file.created_at),
                      filename=file.filename, purpose=file.purpose,
                      content_type=file.content_type, chunks=file.chunk_count)  # fmt: skip


def _filename(sent: str | None) -> str:
    """The name without any directory a client put in it, bounded in length."""
    name = PurePath((sent or "").replace("\\", "/")).name.strip()
    return name[:MAX_FILENAME_CHARS] or "upload"
