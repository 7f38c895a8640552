"""Test documents: a PDF with a text layer made on the spot (`pdf_of`), and an
embedding model stand-in whose similarities follow shared words (`WordEmbedder`)."""

from __future__ import annotations

import hashlib
import io
import re

import numpy as np
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject


def pdf_of(*pages: str) -> bytes:
    """A PDF of one page per text (Helvetica, one line of the page per line of text)."""
    writer = PdfWriter()
    font = writer._add_object(DictionaryObject({
        NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
        NameObject("/BaseFont"): NameObject("/Helvetica")}))  # fmt: skip
    for text in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        lines = [_pdf_string(line) for line in text.split("\n")]
        body = b"BT /F1 11 Tf 14 TL 72 740 Td " + b" T* ".join(b"(%s) Tj" % s for s in lines)
        stream = DecodedStreamObject()
        stream.set_data(body + b" ET")
        page[NameObject("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


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
