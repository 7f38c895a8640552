"""`retrieval.documents.Documents` on a real SQLite store with a word-hash embedder:
uploads are checked, chunked, embedded off the event loop and stored; a search ranks
the chunks of the files named; a turn names only its caller's files
(`gateway.native.grounding`); the excerpts land in the prompt's right place."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from common.embeddings import Embedder
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey
from gateway.context.window import ContextPolicy, assemble
from gateway.native.grounding import Grounding, ground, named_files
from gateway.refusals import NotFound
from retrieval.documents import (
    Documents,
    FileLimits,
    FileTooLarge,
    TooManyChunks,
    Upload,
    embed,
)
from retrieval.extract import UnreadableFile, UnsupportedFile
from schemas.events import Role
from schemas.topics import Tier
from tests.support.context import counting
from tests.support.documents import ThreadReader, WordEmbedder, pdf_of

LIGHTHOUSE = """# The lighthouse

Anna keeps the lighthouse on the northern cape.

She lights the lamp at dusk every evening and trims the wick at midnight.

## The garden

Behind the tower grow potatoes, beans and a row of sunflowers."""


def documents_on(store: SQLiteStore, embedder: Embedder, **limits) -> Documents:
    async def loaded() -> Embedder:
        return embedder

    limits = FileLimits(**{"chunk_chars": 100, "overlap_chars": 0, "top_k": 2, **limits})
    reader = ThreadReader(limits.chunk_chars, limits.overlap_chars, limits.extraction.caps)
    return Documents(store, loaded, limits, reader)


def upload(data: bytes, filename: str = "lighthouse.md", user: str = "alice") -> Upload:
    return Upload("org-a", user, filename, None, "assistants", data)


async def test_an_upload_is_chunked_embedded_and_stored(store: SQLiteStore) -> None:
    documents = documents_on(store, WordEmbedder())
    stored = await documents.add(upload(LIGHTHOUSE.encode()))

    assert stored.file_id.startswith("file-")
    assert (stored.org_id, stored.user_id, stored.filename) == ("org-a", "alice", "lighthouse.md")
    assert (stored.content_type, stored.purpose) == ("text/markdown", "assistants")
    assert stored.size_bytes == len(LIGHTHOUSE.encode())
    assert stored.embedding_model == "word-hash"
    chunks = await store.file_chunks([stored.file_id])
    assert len(chunks) == stored.chunk_count > 1
    assert "\n\n".join(c.text for c in chunks) == LIGHTHOUSE
    assert await store.get_file(stored.file_id) == stored


async def test_a_search_finds_the_chunk_that_answers_best_first(store: SQLiteStore) -> None:
    documents = documents_on(store, WordEmbedder())
    lighthouse = await documents.add(upload(LIGHTHOUSE.encode()))
    other = await documents.add(upload(pdf_of("Bread needs flour, water, salt and yeast."),
                                       "bread.pdf"))  # fmt: skip

    hits = await documents.search([lighthouse, other], "when does she light the lamp at dusk")
    assert hits[0].chunk.text.startswith("She lights the lamp at dusk")
    assert hits[0].chunk.filename == "lighthouse.md"
    assert len(hits) <= 2 and hits == sorted(hits, key=lambda h: -h.score)

    bread = await documents.search([other], "how much flour and yeast for bread")
    assert [(h.chunk.file_id, h.chunk.chunk_index) for h in bread] == [(other.file_id, 0)]
    assert await documents.search([], "anything") == []


async def test_files_of_another_embedding_model_are_not_searched(store: SQLiteStore) -> None:
    stored = await documents_on(store, WordEmbedder()).add(upload(LIGHTHOUSE.encode()))

    class Other(WordEmbedder):
        name = "another-model"

    assert await documents_on(store, Other()).search([stored], "lamp at dusk") == []


@pytest.mark.parametrize(("data", "filename", "limits", "error"), [
    (b"x" * 2000, "big.txt", {"max_file_bytes": 1999}, FileTooLarge),
    ("\n\n".join(["para " * 10] * 20).encode(), "many.txt", {"max_chunks": 5}, TooManyChunks),
    (b"\x89PNG\r\n", "photo.png", {}, UnsupportedFile),
    (b"\xff\xfe bad", "notes.txt", {}, UnreadableFile),
    (b"%PDF-1.7 broken", "paper.pdf", {}, UnreadableFile),
])  # fmt: skip
async def test_a_refused_upload_stores_nothing(store, data, filename, limits, error) -> None:
    embedder = WordEmbedder()
    with pytest.raises(error):
        await documents_on(store, embedder, **limits).add(upload(data, filename))
    assert await store.list_files("alice", org_id="org-a") == []
    assert embedder.calls == []


class GatedEmbedder(WordEmbedder):
    """Embeds only once `release` is set: a long embedding, held in its thread."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.started.set()
        assert self.release.wait(timeout=30), "never released"
        return super().embed(texts)


async def test_embedding_runs_off_the_event_loop(store: SQLiteStore) -> None:
    embedder = GatedEmbedder()
    adding = asyncio.create_task(documents_on(store, embedder).add(upload(LIGHTHOUSE.encode())))
    await asyncio.to_thread(embedder.started.wait, 30)

    ticks = 0
    for _ in range(20):  # the loop goes on while the embedding is held
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 20 and not adding.done()
    embedder.release.set()
    assert (await adding).chunk_count > 1


class SlowEmbedder(WordEmbedder):
    """Takes 100 ms a call, in its worker thread, and notes the first text of each."""

    def __init__(self) -> None:
        super().__init__()
        self.firsts: list[str] = []
        self.started = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.firsts.append(texts[0])
        self.started.set()
        time.sleep(0.1)
        return super().embed(texts)


async def test_a_small_upload_waits_for_one_batch_of_a_large_one_not_all(
    store: SQLiteStore,
) -> None:
    embedder = SlowEmbedder()
    documents = documents_on(store, embedder)
    large = "\n\n".join(f"Paragraph {i} of the large file, about lamps." for i in range(200))
    adding = asyncio.create_task(documents.add(upload(large.encode(), "large.md")))
    assert await asyncio.to_thread(embedder.started.wait, 30)
    small = await documents.add(upload(b"A small note about bread.", "small.md"))

    assert not adding.done()  # the small file was stored while the large one embedded
    large_file = await adding
    assert large_file.chunk_count > 2 * 32 and small.chunk_count == 1
    assert embedder.firsts.index("A small note about bread.") == 1  # after one batch
    assert len(embedder.firsts) == 2 + (large_file.chunk_count - 1) // 32


async def test_embedding_goes_in_batches() -> None:
    embedder = WordEmbedder()
    vectors = await embed(embedder, [f"text {i}" for i in range(70)], batch=32)
    assert embedder.calls == [32, 32, 6]
    assert vectors.shape == (70, embedder.dims)


def test_excerpts_go_after_the_history_and_before_the_new_message() -> None:
    built = assemble(
        [],
        "when is the lamp lit",
        "be brief",
        ContextPolicy(max_prompt_tokens=200),
        counting(),
        documents="[1] lighthouse.md (chunk 1)\nShe lights the lamp at dusk.",
    )
    assert [m.role for m in built.messages] == [Role.SYSTEM, Role.SYSTEM, Role.USER]
    assert built.messages[0].content == "be brief"
    assert "lamp at dusk" in built.messages[1].content
    assert built.fits


def test_excerpts_are_never_dropped_a_turn_that_cannot_hold_them_does_not_fit() -> None:
    built = assemble(
        [],
        "question",
        "be brief",
        ContextPolicy(max_prompt_tokens=20),
        counting(),
        documents="excerpt " * 40,
    )
    assert not built.fits


async def test_a_turn_names_only_its_callers_files(store: SQLiteStore) -> None:
    documents = documents_on(store, WordEmbedder())
    mine = await documents.add(upload(LIGHTHOUSE.encode()))
    alice, same_id_other_org = ApiKey("alice", "org-a", Tier.PRO), ApiKey("alice", "org-b",
                                                                          Tier.PRO)  # fmt: skip

    assert await named_files(store, alice, [mine.file_id, mine.file_id]) == [mine]
    for owner, ids in [(same_id_other_org, [mine.file_id]), (alice, [mine.file_id, "file-x"])]:
        with pytest.raises(NotFound) as refused:
            await named_files(store, owner, ids)
        assert refused.value.code == "file_not_found"


async def test_grounding_gives_the_excerpts_and_their_citations(store: SQLiteStore) -> None:
    documents = documents_on(store, WordEmbedder())
    mine = await documents.add(upload(LIGHTHOUSE.encode()))

    grounded = await ground(documents, [mine], "when does she light the lamp at dusk")
    assert grounded.documents is not None and "[1] lighthouse.md (chunk 1)" in grounded.documents
    assert next((c.file_id, c.chunk_index) for c in grounded.citations) == (mine.file_id, 1)
    assert grounded.file_ids == (mine.file_id,)
    assert await ground(documents, [], "anything") == Grounding()
    # No search without documents, but the turn still names its file (the cache refuses it).
    assert await ground(None, [mine], "x") == Grounding(file_ids=(mine.file_id,))
