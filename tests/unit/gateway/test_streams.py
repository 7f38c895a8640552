"""Resuming a stored answer's stream (Last-Event-ID), stalls, and the gateway's stream
core, in process: real SQLite store, scripted pipeline (see test_gateway_app)."""

from __future__ import annotations

import asyncio
import json

from conversations.answers import answer_started
from gateway.streaming.stream_relay import StreamRelay
from schemas import sse
from schemas.events import (
    ChatMessage,
    DeliveryError,
    Delta,
    GenerationRequest,
    Queued,
    Retract,
    Role,
)
from schemas.lifecycle import RequestStatus
from tests.support.gateway import (
    ALICE,
    BOB,
    REPLY_TO,
    app_client,
    assert_error,
    delta,
    done,
    new_conversation,
)


async def answered(client, pipeline, cid: str, *events) -> dict:
    pipeline.script(*events)
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    return json.loads(sse.parse_messages(response.text)[0].data)


async def test_a_finished_answer_is_replayed_after_the_last_event_id(client, pipeline, store):
    cid = await new_conversation(client)
    ids = await answered(client, pipeline, cid, delta("Hel", 0), delta("lo", 1), done(2))
    path = f"/v1/requests/{ids['request_id']}/events"
    response = await client.get(path, headers={**ALICE, "Last-Event-ID": "0"})
    assert response.status_code == 200
    messages = sse.parse_messages(response.text)
    assert [(m.event, m.id) for m in messages] == [
        ("request", None),
        ("delta", "1"),
        ("done", "2"),
        (None, None),
    ]
    assert json.loads(messages[0].data) == ids
    assert json.loads(messages[1].data) == {"delta": "lo"} and messages[-1].is_done
    everything = sse.parse_messages((await client.get(path, headers=ALICE)).text)
    assert "".join(json.loads(m.data)["delta"] for m in everything if m.event == "delta") == "Hello"
    by_query = sse.parse_messages((await client.get(f"{path}?last_event_id=1", headers=ALICE)).text)
    assert [m.event for m in by_query] == ["request", "done", None]
    assert pipeline.resumed[-1] == (ids["request_id"], REPLY_TO)
    assert pipeline.cancelled == []
    _, answer = await store.list_messages(cid)
    assert (answer.content, answer.status) == ("Hello", RequestStatus.FINISHED_STOPPED)


async def test_resume_is_the_owners_only_and_ids_are_checked(client, pipeline):
    cid = await new_conversation(client)
    ids = await answered(client, pipeline, cid, done(0))
    path = f"/v1/requests/{ids['request_id']}/events"
    assert_error(await client.get(path, headers=BOB), 404, "request_not_found")
    assert_error(
        await client.get("/v1/requests/nope/events", headers=ALICE), 404, "request_not_found"
    )
    assert_error(
        await client.get(path, headers={**ALICE, "Last-Event-ID": "x"}),
        400,
        "invalid_last_event_id",
    )


async def test_a_stream_with_no_event_for_the_stall_time_ends_and_is_cancelled(
    store, pipeline, settings
):
    quick = settings.replace(**{"stream_stall_s": 0.2})
    async with app_client(quick, store, pipeline) as (client, _):
        cid = await new_conversation(client)
        pipeline.script(delta("a", 0), hold=True)
        response = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
        )
    messages = sse.parse_messages(response.text)
    assert [(m.event, m.id) for m in messages] == [
        ("request", None),
        ("delta", "0"),
        ("error", "1"),
        (None, None),
    ]
    assert json.loads(messages[2].data)["code"] == "stalled"
    [request] = pipeline.submitted
    assert pipeline.cancelled == [(request.request_id, "stalled")]
    _, answer = await store.list_messages(cid)
    assert (answer.content, answer.status) == ("a", RequestStatus.FINISHED_ERROR)


# --- the pure core ---------------------------------------------------------------------


def request() -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        conversation_id="c",
        message_id="m",
        parent_id="u",
        user_id="alice",
        org_id="o",
        tier="pro",
        model="tiny-random",
        messages=(),
        reply_to=REPLY_TO,
    )


def test_events_the_client_has_build_the_answer_but_are_not_shown_again():
    relay = StreamRelay(after_id=1)
    events = [
        answer_started(request()),
        Queued(request_id="r", position=1),
        delta("a", 0),
        delta("b", 1),
        delta("b", 1),
        delta("c", 3),
        done(4),
    ]
    shown = [relay.add(e) for e in events]
    assert [type(e).__name__ for e in shown if e is not None] == ["Queued", "Delta", "DeliveryDone"]
    assert relay.ended and relay.answer().content == "abc"
    assert relay.answer().role == Role.ASSISTANT and relay.answer().parent_id == "u"


def test_queue_updates_after_the_first_output_are_not_shown():
    relay = StreamRelay(answer_started(request()))
    assert relay.add(delta("a", 0)) is not None
    assert relay.add(Queued(request_id="r", position=1)) is None


def test_a_retraction_is_what_gets_stored():
    relay = StreamRelay(answer_started(request()))
    for event in (
        delta("bob@", 0),
        Retract(request_id="r", seq=1, message_id="m", reason="pii", replacement="[removed]"),
        done(2, RequestStatus.FINISHED_FILTERED),
    ):
        relay.add(event)
    stored = relay.answer()
    assert (stored.content, stored.status) == ("[removed]", RequestStatus.FINISHED_FILTERED)


def test_a_stall_ends_the_stream_at_the_next_id():
    relay = StreamRelay(answer_started(request()))
    relay.add(delta("a", 0))
    end = relay.stall("r")
    assert isinstance(end, DeliveryError) and end.seq == 1 and relay.ended
    assert relay.add(delta("late", 1)) is None


def test_a_stall_after_a_continuation_is_the_newest_attempt_s_end():
    """A stream continued by attempt 1 (its worker was lost) still ends on a stall: an end
    of attempt 0 would be dropped as stale, and the stream would stall again forever."""
    relay = StreamRelay(answer_started(request()))
    relay.add(delta("a", 0))
    relay.add(Delta(request_id="r", attempt=1, seq=1, text="b"))
    end = relay.stall("r")
    assert (end.attempt, end.seq) == (1, 2)
    assert relay.ended


async def test_a_native_cancel_of_the_closing_task_does_not_drop_the_generation_s_cancel(
    pipeline,
):
    """The SSE response cancels its task when the client leaves (`task.cancel()`, which an
    anyio shield does not keep out); landing while the stream closes, it must not stop
    the cancel from reaching the pipeline, or the engine writes the answer for nobody."""
    from gateway.streaming.generation import start_generation

    asked = request().model_copy(update={"messages": (ChatMessage(role=Role.USER, content="hi"),)})
    generation = await start_generation(pipeline, asked)
    closing = asyncio.create_task(generation.close())
    await asyncio.sleep(0.002)  # inside the cancel's produce
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await asyncio.sleep(0.05)
    assert pipeline.cancelled == [("r", "client_disconnected")]
