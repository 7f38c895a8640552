"""The gateway's per-event path: inboxes that hand over all waiting events at once,
deltas merged for a relay that fell behind, one decode per fetched batch, the stall
timer, and the SSE response's ping, send timeout and disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiokafka.structs import ConsumerRecord
from starlette.background import BackgroundTask

from bus.request_reply import Inbox, decoded_batch
from gateway.pipeline import StreamLosses
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.generation import (
    Generation,
    StreamLost,
    StreamTimers,
    _StallTimer,
    merged_deltas,
)
from schemas import sse
from schemas.events import DeliverEvent, DeliveryDone, DeliveryError, Delta, Queued, Reroute, Usage
from schemas.lifecycle import RequestStatus


def delta(text: str, seq: int) -> Delta:
    return Delta(request_id="r", seq=seq, text=text)


async def test_an_inbox_hands_over_everything_that_arrived_at_once():
    inbox: Inbox[Delta] = Inbox()
    waiting = asyncio.create_task(inbox.take())
    await asyncio.sleep(0)
    inbox.put(delta("a", 0))
    inbox.put(delta("b", 1))
    assert [e.text for e in await waiting] == ["a", "b"]
    inbox.put(delta("c", 2))
    assert [e.text for e in await inbox.take()] == ["c"]


def test_consecutive_deltas_merge_under_the_id_of_the_last():
    queued = Queued(request_id="r", position=3)
    end = DeliveryDone(request_id="r", seq=5, status=RequestStatus.FINISHED_STOPPED, usage=Usage())
    merged = merged_deltas(
        [delta("a", 0), delta("b", 1), queued, delta("c", 3), delta("d", 4), end]
    )
    assert merged == [delta("ab", 1), queued, delta("cd", 4), end]
    assert merged_deltas([delta("a", 0)]) == [delta("a", 0)]
    assert sse.native_event(merged[0]) == b'id: 1\nevent: delta\ndata: {"delta":"ab"}\n\n'


def record(value: bytes | None, offset: int = 0) -> ConsumerRecord:
    return ConsumerRecord(
        "chat.deliver.gw", 0, offset, 0, 0, b"k", value, None, 1, len(value or b""), ()
    )


def test_a_fetched_batch_is_decoded_in_one_step_unless_a_record_is_bad():
    good = [
        record(orjson.dumps(delta("a", 0).model_dump())),
        record(Reroute(request_id="r", reply_to="chat.deliver.b").model_dump_json().encode()),
    ]
    assert [type(e) for e in decoded_batch(good) or []] == [Delta, Reroute]
    assert decoded_batch([*good, record(b"not json")]) is None
    assert decoded_batch([*good, record(None)]) is None
    two_in_one = b",".join(r.value for r in good)  # valid as two array items, not as one
    assert decoded_batch([record(two_in_one)]) is None


class NeverEnds:
    """A stream whose events never come."""

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._never()

    async def _never(self) -> AsyncIterator[Delta]:
        await asyncio.Event().wait()
        yield delta("", 0)

    async def take(self) -> list[Delta]:
        await asyncio.Event().wait()
        return []

    async def aclose(self) -> None:
        pass


class CancelRecorder:
    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []
        self.losses = StreamLosses()

    async def cancel(self, request_id: str, reason: str = "") -> None:
        self.cancelled.append((request_id, reason))


async def test_a_stream_with_no_event_for_the_stall_time_ends_stalled_and_is_cancelled():
    pipeline = CancelRecorder()
    generation = Generation(pipeline, "r", NeverEnds(), timers=StreamTimers(stall_s=0.05))  # type: ignore[arg-type]
    batches = [batch async for batch in generation.batches()]
    assert len(batches) == 1 and isinstance(batches[0][0], DeliveryError)
    assert batches[0][0].code == "stalled"
    assert pipeline.cancelled == [("r", "stalled")]


async def collect(batches: AsyncIterator[list[DeliverEvent]]) -> list[list[DeliverEvent]]:
    return [batch async for batch in batches]


async def test_a_stream_whose_answer_the_bus_lost_ends_at_once_without_a_cancel():
    pipeline = CancelRecorder()
    generation = Generation(pipeline, "r", NeverEnds(), timers=StreamTimers(stall_s=30))  # type: ignore[arg-type]
    reading = asyncio.create_task(collect(generation.batches()))
    await asyncio.sleep(0.01)
    assert pipeline.losses.lose_all() == 1
    [[end]] = await asyncio.wait_for(reading, 1)
    assert isinstance(end, DeliveryError)
    assert (end.code, end.retry_after) == ("answer_lost", 5.0)
    assert generation.finished and pipeline.cancelled == []
    assert pipeline.losses.lose_all() == 0  # it left the registry when it ended


async def test_a_loss_while_the_relay_is_busy_ends_the_next_wait():
    timer = _StallTimer(30)
    timer.lose()
    with pytest.raises(StreamLost):
        await timer.wait(asyncio.sleep(1))
    timer.cancel()


async def test_the_stall_timer_does_not_fire_while_events_keep_coming():
    timer = _StallTimer(0.05)
    for _ in range(6):  # 0.12 s in all, each wait shorter than the stall time
        assert await timer.wait(asyncio.sleep(0.02, result="ok")) == "ok"
    with pytest.raises(TimeoutError):
        await timer.wait(asyncio.sleep(1))
    timer.cancel()


class Client:
    """The ASGI side of one SSE response: what was sent, and a disconnect to trigger."""

    def __init__(self, blocked: bool = False) -> None:
        self.sent: list[bytes] = []
        self.gone = asyncio.Event()
        self.blocked = blocked

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body":
            if self.blocked and self.sent:
                await asyncio.Event().wait()  # a client that stopped reading
            self.sent.append(message["body"])


async def frames_then_wait(*frames: bytes) -> AsyncIterator[bytes]:
    for frame in frames:
        yield frame
    await asyncio.Event().wait()


async def test_a_quiet_stream_is_pinged_and_a_disconnect_ends_it_and_runs_the_background():
    closed = asyncio.Event()
    client = Client()
    response = EventStreamResponse(
        frames_then_wait(b"data: 1\n\n"), ping_s=0.02, background=BackgroundTask(closed.set)
    )
    serving = asyncio.create_task(response({}, client.receive, client.send))
    await asyncio.sleep(0.1)
    assert client.sent[0] == b"data: 1\n\n" and sse.PING in client.sent[1:]
    client.gone.set()
    await asyncio.wait_for(serving, 1)
    assert closed.is_set()


async def test_a_client_that_stops_reading_is_treated_as_gone():
    closed = asyncio.Event()
    response = EventStreamResponse(
        frames_then_wait(b"data: 1\n\n", b"data: 2\n\n"),
        ping_s=0.02,
        send_timeout_s=0.05,
        background=BackgroundTask(closed.set),
    )
    client = Client(blocked=True)
    await asyncio.wait_for(response({}, client.receive, client.send), 1)
    assert client.sent == [b"data: 1\n\n"] and closed.is_set()


async def frames(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@pytest.mark.parametrize("stream", [frames_then_wait, frames], ids=["goes quiet", "ends"])
async def test_a_client_that_stops_reading_after_the_last_frame_is_gone_too(stream):
    """The ping of a quiet stream and the final send wait for the same full buffer as a
    frame: neither may keep the response (and the generation behind it) forever."""
    closed = asyncio.Event()
    response = EventStreamResponse(
        stream(b"data: 1\n\n"),
        ping_s=0.02,
        send_timeout_s=0.05,
        background=BackgroundTask(closed.set),
    )
    client = Client(blocked=True)
    await asyncio.wait_for(response({}, client.receive, client.send), 1)
    assert client.sent == [b"data: 1\n\n"] and closed.is_set()
