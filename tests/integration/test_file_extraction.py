"""A file read in its limited child process (`retrieval.extraction.Extractor`), for real:
the hostile PDF (a 40 KB file whose one content stream inflates to 5 MB, shown by 4
pages) is refused within each limit, one limit at a time with the others lifted; an
ordinary PDF and a text file still read; a gateway runs at most `concurrency` such
processes, queues a few and refuses the rest at once, and leaves no process behind."""

from __future__ import annotations

import asyncio
import contextlib
import time

import psutil
import pytest

from retrieval.extract import PDF, TEXT, FileTooComplex, TextCaps, TextTooLong, TooManyPages
from retrieval.extraction import QUEUED_PER_PROCESS, ExtractionBusy, ExtractionLimits, Extractor
from tests.support.documents import hostile_pdf, pdf_of

LIFTED = TextCaps(max_chars=10**9, max_pages=10**6, max_page_content_bytes=1 << 30)
"""Caps no file here reaches: only the process's own limits are left."""
SLACK_S = 3.0
"""Beyond a limit: starting the child (an interpreter and pypdf) on a busy machine."""


def extractor(**limits: object) -> Extractor:
    return Extractor(ExtractionLimits(**limits), chunk_chars=800, overlap_chars=100)


_BEFORE: set[int] = set()


@pytest.fixture(autouse=True)
def _children_before() -> None:
    """The children this process has already (the session's brokers and engines)."""
    _BEFORE.clear()
    _BEFORE.update(child.pid for child in psutil.Process().children(recursive=True))


def children() -> list[psutil.Process]:
    """The children started since the test began: its extraction processes."""
    return [c for c in psutil.Process().children(recursive=True) if c.pid not in _BEFORE]


async def refused(reader: Extractor, data: bytes) -> tuple[Exception, float]:
    started = time.monotonic()
    with pytest.raises((FileTooComplex, TextTooLong, TooManyPages)) as caught:
        await reader.chunks(PDF, data)
    return caught.value, time.monotonic() - started


async def test_an_ordinary_pdf_and_a_text_file_are_read_in_the_child() -> None:
    reader = extractor()
    chunks = await reader.chunks(PDF, pdf_of("The lamp is lit at dusk.", "The wick at midnight."))
    assert [c.text for c in chunks] == ["The lamp is lit at dusk.\n\nThe wick at midnight."]
    text = "\n\n".join(f"Paragraph {i} of the notes." for i in range(100)).encode()
    chunks = await reader.chunks(TEXT, text)
    assert len(chunks) > 1 and chunks[0].text.startswith("Paragraph 0 of the notes.")
    assert all(len(c.text) <= 800 for c in chunks) and reader.running == 0


async def test_the_hostile_pdf_is_refused_at_once_by_the_default_caps() -> None:
    error, took = await refused(extractor(), hostile_pdf())
    assert isinstance(error, FileTooComplex)
    assert "page 1's content is 5000" in str(error) and "at most 1048576" in str(error)
    assert took < SLACK_S


async def test_the_hostile_pdf_is_refused_at_its_cpu_limit() -> None:
    error, took = await refused(extractor(caps=LIFTED, cpu_s=2.0, timeout_s=60.0), hostile_pdf())
    assert isinstance(error, FileTooComplex) and "more than 2 s of CPU" in str(error)
    assert 2.0 <= took < 2.0 + SLACK_S * 2  # CPU time only runs while it is on a core


async def test_the_hostile_pdf_is_refused_at_its_memory_limit() -> None:
    limits = {"caps": LIFTED, "memory_bytes": 100 << 20, "cpu_s": 60.0, "timeout_s": 60.0}
    error, took = await refused(extractor(**limits), hostile_pdf())
    assert isinstance(error, FileTooComplex) and "more than 100 MiB of memory" in str(error)
    assert took < 20.0  # well before the 23 s and more than 300 MB it would take


async def test_the_hostile_pdf_is_killed_at_its_wall_clock_limit() -> None:
    error, took = await refused(extractor(caps=LIFTED, cpu_s=60.0, timeout_s=1.5), hostile_pdf())
    assert isinstance(error, FileTooComplex) and "longer than 1.5 s" in str(error)
    assert 1.5 <= took < 1.5 + SLACK_S
    assert children() == []  # killed and reaped


async def test_the_text_cap_stops_the_hostile_pdf_after_the_page_that_passes_it() -> None:
    # 250 KB of content a page, about 123,000 characters and a second of reading each.
    caps = TextCaps(max_chars=200_000)
    error, took = await refused(extractor(caps=caps), hostile_pdf(250_000, pages=50))
    assert isinstance(error, TextTooLong) and "200000 characters" in str(error)
    assert took < 15.0  # two pages read, not fifty


async def test_the_page_cap_is_checked_before_a_page_is_read() -> None:
    caps = TextCaps(max_pages=3, max_page_content_bytes=1 << 30)
    error, took = await refused(extractor(caps=caps), hostile_pdf())
    assert isinstance(error, TooManyPages) and took < SLACK_S


async def test_a_gateway_runs_its_extractions_a_few_at_a_time_and_refuses_past_its_queue() -> None:
    reader = extractor(caps=LIFTED, cpu_s=60.0, timeout_s=60.0, concurrency=1)
    data = hostile_pdf()
    queued = 1 + QUEUED_PER_PROCESS
    tasks = [asyncio.create_task(reader.chunks(PDF, data)) for _ in range(queued)]
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if children():
                break
        assert reader.running == 1 and len(children()) == 1
        started = time.monotonic()
        with pytest.raises(ExtractionBusy):
            await reader.chunks(PDF, data)
        assert time.monotonic() - started < 0.1
        await asyncio.sleep(1.0)
        assert reader.running == 1 and len(children()) == 1 and not any(t.done() for t in tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert reader.running == 0 and children() == []  # a cancelled upload's child is killed
    chunks = await reader.chunks(PDF, pdf_of("free again"))  # the slot and queue are free
    assert [c.text for c in chunks] == ["free again"]
