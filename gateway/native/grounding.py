"""A turn grounded on the user's files: the files it names, checked to be the caller's
before anything is charged, stored or queued, and the excerpts of them that go into
its prompt, with the citations its answer carries (`retrieval`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conversations.files import FileStore, StoredFile
from conversations.store import ApiKey, owns
from gateway.refusals import NotFound
from retrieval.documents import Documents
from retrieval.ranking import citations, context_block
from schemas.files import Citation


@dataclass(frozen=True, slots=True)
class Grounding:
    """What retrieval adds to a turn: the excerpts' system message (None: nothing
    found) and what the answer cites, and the files the turn named (searched, whatever
    was found: the request carries them, and the response cache refuses it)."""

    documents: str | None = None
    citations: tuple[Citation, ...] = ()
    file_ids: tuple[str, ...] = ()


NO_GROUNDING = Grounding()


async def owned_file(store: FileStore, owner: ApiKey, file_id: str) -> StoredFile:
    """The file, if the caller (org and user) owns it; else `file_not_found`, as for an
    unknown id."""
    found = await store.get_file(file_id)
    if found is None or not owns(found.org_id, found.user_id, owner):
        raise NotFound("file_not_found", f"no file {file_id!r}", param="file_ids")
    return found


async def named_files(store: FileStore, owner: ApiKey,
                      file_ids: Sequence[str]) -> list[StoredFile]:  # fmt: skip
    """The files a turn names, each the caller's (`file_not_found` for any other)."""
    return [await owned_file(store, owner, file_id) for file_id in dict.fromkeys(file_ids)]


async def ground(documents: Documents | None, files: Sequence[StoredFile],
                 question: str) -> Grounding:  # fmt: skip
    """The excerpts of `files` most similar to `question`, and their citations."""
    named = tuple(f.file_id for f in files)
    if documents is None or not files:
        return Grounding(file_ids=named)
    hits = await documents.search(files, question)
    return Grounding(context_block(hits), tuple(citations(hits)), named)
