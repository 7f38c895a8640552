"""What the extraction process's end means (`retrieval.extraction.outcome`): each way a
child can end, read as chunks, as the refusal naming its limit, or as a failure of
chatpipe's own (a 500, never blamed on the file)."""

from __future__ import annotations

import json
import signal

import pytest

from retrieval.chunking import Chunk
from retrieval.extract import FileTooComplex, TextTooLong, TooManyPages, UnreadableFile
from retrieval.extraction import OUT_OF_MEMORY_EXIT, ExtractionLimits, outcome

LIMITS = ExtractionLimits(cpu_s=20.0, memory_bytes=512 << 20)


def test_an_answer_of_chunks_is_the_chunks_in_order() -> None:
    out = json.dumps({"chunks": ["first", "second"]}).encode()
    assert outcome(0, out, b"", LIMITS) == [Chunk(0, "first"), Chunk(1, "second")]


@pytest.mark.parametrize(("code", "error"), [
    ("unreadable", UnreadableFile),
    ("too_many_pages", TooManyPages),
    ("text_too_long", TextTooLong),
    ("too_complex", FileTooComplex),
])  # fmt: skip
def test_a_refusal_the_child_answered_is_raised_with_its_message(code, error) -> None:
    out = json.dumps({"refused": code, "message": "why"}).encode()
    with pytest.raises(error, match=r"^why$"):
        outcome(0, out, b"", LIMITS)


@pytest.mark.parametrize(("status", "says"), [
    (-signal.SIGXCPU, "more than 20 s of CPU"),
    (OUT_OF_MEMORY_EXIT, "more than 512 MiB of memory"),
    (-signal.SIGKILL, r"was killed \(Killed\)"),
    (-signal.SIGSEGV, r"was killed \(Segmentation fault\)"),
])  # fmt: skip
def test_a_child_stopped_by_a_limit_or_a_signal_is_a_file_too_complex(status, says) -> None:
    with pytest.raises(FileTooComplex, match=says):
        outcome(status, b"", b"", LIMITS)


def test_a_child_that_fails_on_its_own_is_not_blamed_on_the_file() -> None:
    with pytest.raises(RuntimeError, match="exit 1"):
        outcome(1, b"", b"Traceback ... ImportError", LIMITS)
