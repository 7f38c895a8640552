"""Test documents: a PDF with a text layer made on the spot (`pdf_of`), a hostile one
whose one content stream inflates a thousandfold (`hostile_pdf`), an embedding model
stand-in whose similarities follow shared words (`WordEmbedder`), and a file reader
that reads in a worker thread of this process (`ThreadReader`), for the unit tests of
what is done with the chunks."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import re
import zlib

import numpy as np
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject, StreamObject

from retrieval.chunking import Chunk, chunk_text
from retrieval.extract import TextCaps, extract_text

HOSTILE_CONTENT_BYTES = 5_000_000


def pdf_of(*pages: str) -> bytes:
    """A PDF of one page per text (Helvetica, one line of the page per line of text)."""
    return pdf_with(list(pages))


def hostile_pdf(content_bytes: int = HOSTILE_CONTENT_BYTES, pages: int = 4) -> bytes:
    """A small PDF (about 40 KB for the default 5 MB) whose `pages` pages all show one
    FlateDecode content stream of `content_bytes` of text operators (`(word) Tj`):
    pypdf's extraction of it grows faster than its size (tens of seconds for 5 MB)."""
    return pdf_with([], then_hostile=pages, content_bytes=content_bytes)


def pdf_with(texts: list[str], then_hostile: int = 0,
             content_bytes: int = HOSTILE_CONTENT_BYTES) -> bytes:  # fmt: skip
    """A PDF of a page per text (`pdf_of`), then `then_hostile` pages that all show one
    compressed content stream of `content_bytes` (`hostile_pdf`)."""
    writer = PdfWriter()
    font = _helvetica(writer)
    for text in texts:
        lines = [_pdf_string(line) for line in text.split("\n")]
        body = b"BT /F1 11 Tf 14 TL 72 740 Td " + b" T* ".join(b"(%s) Tj" % s for s in lines)
        stream = DecodedStreamObject()
        stream.set_data(body + b" ET")
        _page(writer, font)[NameObject("/Contents")] = writer._add_object(stream)
    if then_hostile:
        stream = StreamObject()
        stream.set_data(zlib.compress(_text_operators(content_bytes), 9))
        stream[NameObject("/Filter")] = NameObject("/FlateDecode")
        contents = writer._add_object(stream)
        for _ in range(then_hostile):
            _page(writer, font)[NameObject("/Contents")] = contents
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _text_operators(size: int) -> bytes:
    """About `size` bytes of one text object showing words picked at random, as one
    1500-word block over and over: it compresses a hundredfold."""
    words = [b"lorem", b"ipsum", b"dolor", b"sit", b"amet", b"consectetur", b"adipiscing"]
    rng = random.Random(7)
    block = b"".join(b"(%s) Tj " % rng.choice(words) for _ in range(1500))
    body = (block * (size // len(block) + 1))[:size]
    return b"BT /F1 11 Tf 72 740 Td " + body[: body.rfind(b" Tj ") + 4] + b"ET"


def _helvetica(writer: PdfWriter) -> object:
    return writer._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica")}))  # fmt: skip


def _page(writer: PdfWriter, font: object) -> DictionaryObject:
    page = writer.add_blank_page(612, 792)
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
    )
    return page


def _pdf_string(text: str) -> bytes:
    return (
        text.encode("latin-1").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
    )


class WordEmbedder:
    """`common.embeddings.Embedder` by hashed bag of words: texts that share words are
    similar, unrelated ones near 0. `calls` counts the texts of each call."""

    name = "word-hash"

    def __init__(self, dims: int = 256) -> None:
        self.dims = dims
        self.calls: list[int] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(len(texts))
        rows = np.zeros((len(texts), self.dims), dtype=np.float32)
        for row, text in zip(rows, texts, strict=True):
            for word in re.findall(r"\w+", text.lower()):
                row[int(hashlib.blake2b(word.encode(), digest_size=4).hexdigest(), 16)
                    % self.dims] += 1.0  # fmt: skip
            row /= max(float(np.linalg.norm(row)), 1e-9)
        return rows


class ThreadReader:
    """`retrieval.documents.ReadsFiles` in a worker thread of this process, with the
    caps but none of the process's limits: for the unit tests of what follows a read."""

    def __init__(self, chunk_chars: int, overlap_chars: int, caps: TextCaps) -> None:
        self.chunk_chars, self.overlap_chars, self.caps = chunk_chars, overlap_chars, caps

    async def chunks(self, kind: str, data: bytes) -> list[Chunk]:
        def read() -> list[Chunk]:
            text = extract_text(kind, data, self.caps)
            return chunk_text(text, self.chunk_chars, self.overlap_chars)

        return await asyncio.to_thread(read)
