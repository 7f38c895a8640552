"""A user's documents: uploaded files made into embedded chunks, and the search a turn
runs over the files it names.

The CPU work runs off the event loop, so a gateway keeps streaming other answers
while a file is read and embedded: a file is read and its text chunked in a limited
process of its own (`retrieval.extraction`: out of the gateway's GIL, with caps on
its pages, text, CPU time, memory and time, a few at a time), and chunks are
embedded `EMBED_BATCH` at a time, each batch in a worker thread (the model and its
tokenizer release the GIL while they compute). Uploads embed one batch at a time
(`_ingesting`, taken per batch and in turn): two large files do not take every core,
a small file waits for one batch of a large one, not for all of it, and a turn's
one-line query, which takes no lock, slips in between their batches. What is
embedded is bounded by the caps: at most `max_chunks` chunks of a text of at most
`TextCaps.max_chars` characters.

The embedding model is the context builder's (loaded once, on first use).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from common.embeddings import Embedder, to_bytes
from conversations.files import FileChunk, FileStore, StoredFile
from retrieval.chunking import Chunk
from retrieval.extract import file_type
from retrieval.extraction import ExtractionLimits, Extractor
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
    extraction: ExtractionLimits = field(default_factory=ExtractionLimits)


class FileTooLarge(ValueError):
    pass


class TooManyChunks(ValueError):
    pass


class ReadsFiles(Protocol):
    """What turns a file into chunks (`retrieval.extraction.Extractor`)."""

    async def chunks(self, kind: str, data: bytes) -> list[Chunk]: ...


@dataclass(frozen=True, slots=True)
class Read:
    """An upload's text, read and chunked, not yet embedded."""

    kind: str
    chunks: list[Chunk]

    @property
    def chars(self) -> int:
        """Characters the embedding model reads (the overlaps counted again)."""
        return sum(len(chunk.text) for chunk in self.chunks)


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
                 limits: FileLimits, reader: ReadsFiles | None = None) -> None:  # fmt: skip
        """`embedder()` gives the loaded embedding model (loading it the first time);
        `reader` reads files (default: limited processes, `limits.extraction`)."""
        self.store = store
        self.limits = limits
        self._embedder = embedder
        self._ingesting = asyncio.Lock()
        self.reader = reader or Extractor(limits.extraction, limits.chunk_chars,
                                          limits.overlap_chars)  # fmt: skip

    async def warm_up(self) -> None:
        """Load the embedding model now, so that the first search does not wait for it."""
        await self._embedder()

    async def add(self, upload: Upload) -> StoredFile:
        """Read, chunk, embed and store `upload` (`read`, then `keep`), storing nothing
        if it is refused."""
        return await self.keep(upload, await self.read(upload))

    def check(self, upload: Upload) -> str:
        """`upload`'s type, from what costs nothing to check: `FileTooLarge`, or
        `retrieval.extract.UnsupportedFile`."""
        if len(upload.data) > self.limits.max_file_bytes:
            raise FileTooLarge(f"a file holds at most {self.limits.max_file_bytes} bytes")
        return file_type(upload.filename, upload.declared_type, upload.data)

    async def read(self, upload: Upload) -> Read:
        """`upload`'s chunks. Raises what `check` raises, `TooManyChunks`, what
        `retrieval.extract.extract_text` raises (`UnreadableFile`, `TooManyPages`,
        `TextTooLong`, `FileTooComplex`) and `retrieval.extraction.ExtractionBusy`."""
        limits = self.limits
        kind = self.check(upload)
        chunks = await self.reader.chunks(kind, upload.data)
        if len(chunks) > limits.max_chunks:
            raise TooManyChunks(
                f"the file makes {len(chunks)} chunks of"
                f" {limits.chunk_chars} characters; at most {limits.max_chunks}"
            )
        return Read(kind, chunks)

    async def keep(self, upload: Upload, read: Read) -> StoredFile:
        """Embed `read`'s chunks and store them as `upload`'s file."""
        embedder = await self._embedder()
        chunks = read.chunks
        vectors = await embed(embedder, [c.text for c in chunks], lock=self._ingesting)
        file_id = f"file-{uuid.uuid4().hex}"
        stored = StoredFile(file_id=file_id, org_id=upload.org_id, user_id=upload.user_id,
                            filename=upload.filename, content_type=read.kind,
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


async def embed(embedder: Embedder, texts: list[str], batch: int = EMBED_BATCH,
                lock: asyncio.Lock | None = None) -> np.ndarray:  # fmt: skip
    """`embedder.embed(texts)`, `batch` texts per worker-thread call, each call holding
    `lock` if one is given (taken in turn, so uploads sharing it interleave)."""
    parts = []
    for start in range(0, len(texts), batch):
        async with lock or contextlib.nullcontext():
            parts.append(await asyncio.to_thread(embedder.embed, texts[start : start + batch]))
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)
