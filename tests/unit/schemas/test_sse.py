"""The one client-side SSE reader (`schemas.sse.SSEReader`): the spec's rules, whether
it is fed lines or raw reads cut anywhere."""

from __future__ import annotations

import pytest

from schemas import sse
from schemas.sse import SSEMessage, SSEReader

STREAM = (
    b'event: request\ndata: {"request_id": "r1"}\n\n'
    b": ping\n\n"
    b'id: 1\nevent: delta\ndata: {"delta": "h\xc3\xa9"}\n\n'
    b"data: first\ndata:second\n\n"
    b"event: orphan\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEMessage("request", '{"request_id": "r1"}'),
    SSEMessage("delta", '{"delta": "hé"}', "1"),
    SSEMessage(None, "first\nsecond"),
    SSEMessage(None, "[DONE]"),
]


def test_lines_make_messages_comments_and_dataless_blocks_dropped():
    assert sse.parse_messages(STREAM.decode()) == EXPECTED
    assert EXPECTED[1].json() == {"delta": "hé"} and EXPECTED[-1].is_done


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
def test_raw_reads_cut_anywhere_give_the_same_messages(size: int):
    reader = SSEReader()
    read = [
        m for at in range(0, len(STREAM), size) for m in reader.feed_bytes(STREAM[at : at + size])
    ]
    assert read == EXPECTED


def test_crlf_line_endings_split_across_reads():
    reader = SSEReader()
    assert reader.feed_bytes(b"event: delta\r\ndata: x\r") == []
    assert reader.feed_bytes(b"\n\r\n") == [SSEMessage("delta", "x")]


def test_a_clock_stamps_each_message_when_it_completes():
    ticks = iter([1.5, 2.5])
    reader = SSEReader(lambda: next(ticks))
    assert [reader.feed(line) for line in ["data: a", ""]] == [None, SSEMessage(None, "a", at=1.5)]
    assert reader.feed_bytes(b"data: b\n\n") == [SSEMessage(None, "b", at=2.5)]


async def test_read_messages_stops_and_the_lines_read_on():
    async def lines():
        for line in STREAM.decode().split("\n"):
            yield line

    source = lines()
    first = await sse.read_messages(source, stop=lambda m: m.event == "request")
    rest = await sse.read_messages(source)
    assert [m.data for m in first + rest] == [m.data for m in EXPECTED]
    assert all(m.at > 0 for m in first + rest)
