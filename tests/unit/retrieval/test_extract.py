"""The caps on one file's text (`retrieval.extract.TextCaps`), checked as the text is
read: pages before any is read, each page's content before it is read, the text after
each page, so a file over a cap stops being read at the cap."""

from __future__ import annotations

import time

import pytest

from retrieval.extract import (
    MARKDOWN,
    PDF,
    TEXT,
    FileTooComplex,
    TextCaps,
    TextTooLong,
    TooManyPages,
    extract_text,
)
from tests.support.documents import hostile_pdf, pdf_of, pdf_with


def test_text_up_to_the_cap_is_read_and_one_character_more_is_refused() -> None:
    caps = TextCaps(max_chars=1000)
    assert extract_text(TEXT, b"x" * 1000, caps) == "x" * 1000
    with pytest.raises(TextTooLong, match="1000 characters"):
        extract_text(MARKDOWN, b"x" * 1001, caps)


def test_a_pdf_over_the_page_cap_is_refused_before_a_page_is_read() -> None:
    # Its pages are the hostile one's: reading any of them would take seconds.
    started = time.monotonic()
    with pytest.raises(TooManyPages, match="4 pages; at most 3"):
        extract_text(
            PDF, hostile_pdf(pages=4), TextCaps(max_pages=3, max_page_content_bytes=1 << 30)
        )
    assert time.monotonic() - started < 1.0
    assert extract_text(PDF, pdf_of("one", "two", "three"), TextCaps(max_pages=3)) == (
        "one\n\ntwo\n\nthree"
    )


def test_a_page_whose_content_passes_the_cap_is_refused_before_it_is_read() -> None:
    started = time.monotonic()
    with pytest.raises(FileTooComplex, match="page 1's content is 5000"):
        extract_text(PDF, hostile_pdf(), TextCaps())
    assert time.monotonic() - started < 2.0  # reading it would take tens of seconds


def test_reading_stops_at_the_page_that_passes_the_text_cap() -> None:
    """The pages after it would be refused for their content: they are never reached."""
    long_page = "word " * 200  # 999 characters once stripped
    pdf = pdf_with([long_page, long_page], then_hostile=2)
    with pytest.raises(TextTooLong):
        extract_text(PDF, pdf, TextCaps(max_chars=1500))
    with pytest.raises(FileTooComplex, match="page 3's content"):
        extract_text(PDF, pdf, TextCaps(max_chars=5000))


def test_an_ordinary_pdf_is_within_every_cap() -> None:
    caps = TextCaps(max_chars=30, max_pages=2, max_page_content_bytes=1024)
    assert extract_text(PDF, pdf_of("The lamp is lit", "at dusk"), caps) == (
        "The lamp is lit\n\nat dusk"
    )
