"""A user's documents: uploaded files made into embedded chunks, and the search a turn
runs over the files it names.

The CPU work runs off the event loop, so a gateway keeps streaming other answers
while a file is read and embedded: a PDF is parsed and the text chunked in a worker
thread, and chunks are embedded `EMBED_BATCH` at a time, each batch in a worker
thread (the model and its tokenizer release the GIL while they compute). Uploads
embed one at a time (`_ingesting`): two large files do not take every core, and a
turn's one-line query, which takes no lock, slips in between their batches.

The embedding model is the context builder's (loaded once, on first use).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from common.embeddings import Embedder, to_bytes
from conversations.files import FileChunk, FileStore, StoredFile
from retrieval.chunking import Chunk, chunk_text
from retrieval.extract import extract_text, file_type
from retrieval.ranking import Candidate, Hit, rank

EMBED_BATCH = 32
"""Chunks embedded per worker-thread call."""


@dataclass(frozen=True, slots=True)
class FileLimits:
    """What an upload may be, how it is cut, and what a turn retrieves."""

    max_file_bytes: int = 4 << 20
    max_chunks: int = 1000
    chunk_chars: int = 800
    overlap_chars: int = 100
    top_k: int = 4
    min_score: float = 0.0
    max_files_per_turn: int = 10


class FileTooLarge(ValueError):
    pass


class TooManyChunks(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Upload:
    """A file as it came: who sends it and what it is."""

    org_id: str
    user_id: str
    filename: str
    declared_type: str | None
    purpose: str
    data: bytes


class Documents:
    """Adds files (`add`) and finds the chunks a message needs (`search`)."""

    def __init__(self, store: FileStore, embedder: Callable[[], Awaitable[Embedder]],
                 limits: FileLimits) -> None:  # fmt: skip
        """`embedder()` gives the loaded embedding model (loading it the first time)."""
        self.store = store
        self.limits = limits
        self._embedder = embedder
        self._ingesting = asyncio.Lock()

    async def warm_up(self) -> None:
        """Load the embedding model now, so that the first search does not wait for it."""
        await self._embedder()

    async def add(self, upload: Upload) -> StoredFile:
        """Read, chunk, embed and store `upload`. Raises `FileTooLarge`, `TooManyChunks`,
        `retrieval.extract.UnsupportedFile` or `UnreadableFile`, storing nothing."""
        limits = self.limits
        if len(upload.data) > limits.max_file_bytes:
            raise FileTooLarge(f"a file holds at most {limits.max_file_bytes} bytes")
        kind = file_type(upload.filename, upload.declared_type, upload.data)
        chunks = await asyncio.to_thread(self._chunks, kind, upload.data)
        if len(chunks) > limits.max_chunks:
            raise TooManyChunks(
                f"the file makes {len(chunks)} chunks of"
                f" {limits.chunk_chars} characters; at most {limits.max_chunks}"
            )
        embedder = await self._embedder()
        async with self._ingesting:
            vectors = await embed(embedder, [c.text for c in chunks])
        file_id = f"file-{uuid.uuid4().hex}"
        stored = StoredFile(file_id=file_id, org_id=upload.org_id, user_id=upload.user_id,
                            filename=upload.filename, content_type=kind,
                            purpose=upload.purpose, size_bytes=len(upload.data),
                            chunk_count=len(chunks), embedding_model=embedder.name)  # fmt: skip
        return await self.store.add_file(stored, [
            FileChunk(file_id, c.index, c.text, to_bytes(v))
            for c, v in zip(chunks, vectors, strict=True)
        ])  # fmt: skip

    async def search(self, files: Sequence[StoredFile], query: str) -> list[Hit]:
        """The chunks of `files` most similar to `query`, best first (at most `top_k`,
        none under `min_score`). Files embedded by another model are skipped."""
        if not files:
            return []
        embedder = await self._embedder()
        names = {f.file_id: f.filename for f in files if f.embedding_model == embedder.name}
        chunks, vectors = await asyncio.gather(self.store.file_chunks(list(names)),
                                               embed(embedder, [query]))  # fmt: skip
        candidates = [Candidate(c.file_id, names[c.file_id], c.chunk_index, c.text, c.vector)
                      for c in chunks]  # fmt: skip
        return rank(vectors[0], candidates, self.limits.top_k, self.limits.min_score)

    def _chunks(self, kind: str, data: bytes) -> list[Chunk]:
        text = extract_text(kind, data)
        return chunk_text(text, self.limits.chunk_chars, self.limits.overlap_chars)


async def embed(embedder: Embedder, texts: list[str], batch: int = EMBED_BATCH) -> np.ndarray:
    """`embedder.embed(texts)`, `batch` texts per worker-thread call."""
    parts = [await asyncio.to_thread(embedder.embed, texts[i:i + batch])
             for i in range(0, len(texts), batch)]  # fmt: skip
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)
