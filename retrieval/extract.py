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
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

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


class TooManyPages(ValueError):
    """A PDF of more pages than `TextCaps.max_pages`."""


class TextTooLong(ValueError):
    """More text than `TextCaps.max_chars`."""


class FileTooComplex(ValueError):
    """Reading the file's text would take more than it may: a page's content over
    `TextCaps.max_page_content_bytes`, or (`retrieval.extraction`) more CPU time, memory
    or time than the extraction process has."""


@dataclass(frozen=True, slots=True)
class TextCaps:
    """The most one file's text may be, and the most a PDF may hold to get it."""

    max_chars: int = 1_000_000
    max_pages: int = 1000
    max_page_content_bytes: int = 1 << 20


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


def extract_text(kind: str, data: bytes, caps: TextCaps = TextCaps()) -> str:
    """The text of `data`, of type `kind` (`file_type`), with `\\n` line ends; never blank.
    Raises `UnreadableFile`, or the cap's error (`TooManyPages`, `FileTooComplex`,
    `TextTooLong`) as soon as the file passes one."""
    text = _pdf_text(data, caps) if kind == PDF else _utf8(data)
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    _check_length(len(text), caps)
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


def _check_length(chars: int, caps: TextCaps) -> None:
    if chars > caps.max_chars:
        raise TextTooLong(f"the file holds more than {caps.max_chars} characters of text")


def _pdf_text(data: bytes, caps: TextCaps) -> str:
    from pypdf import PdfReader

    pages: list[str] = []
    taken = 0
    try:
        reader = PdfReader(io.BytesIO(data))
        count = len(reader.pages)
        if count > caps.max_pages:
            raise TooManyPages(f"the PDF has {count} pages; at most {caps.max_pages}")
        for number, page in enumerate(reader.pages, start=1):
            content = _content_bytes(page)
            if content > caps.max_page_content_bytes:
                raise FileTooComplex(
                    f"page {number}'s content is {content} bytes decoded;"
                    f" at most {caps.max_page_content_bytes}"
                )
            text = (page.extract_text() or "").strip()
            if text:
                pages.append(text)
                taken += len(text) + 2
                _check_length(taken - 2, caps)
    except (TooManyPages, FileTooComplex, TextTooLong, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - a hostile PDF breaks pypdf in many ways
        raise UnreadableFile(f"not a readable PDF ({type(error).__name__})") from None
    return "\n\n".join(pages)


def _content_bytes(page: Any) -> int:
    """The size of a page's content streams, decoded (pypdf caps each at 75 MB)."""
    contents = page.get("/Contents")
    if contents is None:
        return 0
    contents = contents.get_object()
    streams = contents if isinstance(contents, list) else [contents]
    return sum(len(stream.get_object().get_data()) for stream in streams)
