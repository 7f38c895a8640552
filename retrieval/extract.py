"""The text of an uploaded file: plain text, Markdown or PDF (pure: bytes in, text out).

The type comes from the file's name (`.txt`, `.md`, `.pdf`, …), else its declared
content type; a PDF is also known by its `%PDF-` signature, whatever it is called.
Text and Markdown must be UTF-8 (a byte-order mark is dropped); Markdown is kept as
written — its headings and lists read well to a model. A PDF's text is taken page by
page with `pypdf`, pages apart by a blank line; a PDF with no text layer (a scan)
has none, and is refused as empty.
"""

from __future__ import annotations

import io
from pathlib import PurePath

TEXT, MARKDOWN, PDF = "text/plain", "text/markdown", "application/pdf"
SUPPORTED = (TEXT, MARKDOWN, PDF)

_BY_SUFFIX = {".txt": TEXT, ".text": TEXT, ".md": MARKDOWN, ".markdown": MARKDOWN,
              ".pdf": PDF}  # fmt: skip
_BY_DECLARED = {"text/plain": TEXT, "text/markdown": MARKDOWN, "text/x-markdown": MARKDOWN,
                "application/pdf": PDF}  # fmt: skip


class UnsupportedFile(ValueError):
    """Not text, Markdown or PDF."""


class UnreadableFile(ValueError):
    """Of a supported type, but its text cannot be read (bad UTF-8, a broken PDF, no text)."""


def file_type(filename: str, declared: str | None, data: bytes) -> str:
    """One of `SUPPORTED`, or `UnsupportedFile`."""
    if data.startswith(b"%PDF-"):
        return PDF
    by_name = _BY_SUFFIX.get(PurePath(filename).suffix.lower())
    if by_name is not None:
        return by_name
    by_declared = _BY_DECLARED.get((declared or "").split(";")[0].strip().lower())
    if by_declared is not None:
        return by_declared
    raise UnsupportedFile(
        f"{filename!r} is not text, Markdown or PDF "
        f"(.txt, .md or .pdf; content type {declared or 'unset'})"
    )


def extract_text(kind: str, data: bytes) -> str:
    """The text of `data`, of type `kind` (`file_type`), with `\\n` line ends; never blank."""
    text = _pdf_text(data) if kind == PDF else _utf8(data)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    if not text.strip():
        raise UnreadableFile(
            "the file holds no text" + (" (a scanned PDF?)" if kind == PDF else "")
        )
    return text


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UnreadableFile(f"not UTF-8 text (byte {error.start})") from None


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as error:  # noqa: BLE001 - a hostile PDF breaks pypdf in many ways
        raise UnreadableFile(f"not a readable PDF ({type(error).__name__})") from None
    return "\n\n".join(page.strip() for page in pages if page.strip())
