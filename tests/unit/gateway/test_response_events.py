"""The Responses API's stream core (pure): delivery events in, numbered response events
out, parsed by the official SDK's own event types; `starting_after` and the request's
refused fields."""

from __future__ import annotations

from dataclasses import replace

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conversations.store import StoredMessage
from gateway.openai.responses.events import HEAD, ResponseEvents, stored
from schemas.events import DeliveryDone, DeliveryError, Delta, Queued, Retract, Role, Usage
from schemas.lifecycle import RequestStatus
from schemas.responses import ResponseObject, ResponseRequest, refused_fields

USAGE = Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=3)
SDK_EVENT = TypeAdapter(ResponseStreamEvent)


def head() -> ResponseObject:
    return ResponseObject(id="resp_m1", created_at=1.0, status="in_progress", model="tiny-random")


def delta(text: str, seq: int) -> Delta:
    return Delta(request_id="r", seq=seq, text=text)


def done(seq: int, status: RequestStatus = RequestStatus.FINISHED_STOPPED) -> DeliveryDone:
    return DeliveryDone(request_id="r", seq=seq, status=status, usage=USAGE)


def played(events: ResponseEvents, *delivered) -> list:
    out = events.head()
    for event in delivered:
        out += events.add(event)
    return out


def sdk(events) -> list:
    """The events as the SDK parses them (strict validation, not its lenient construct)."""
    return [SDK_EVENT.validate_python(e.model_dump(mode="json")) for e in events]


def test_a_whole_answer_maps_to_the_typed_events_in_order():
    events = sdk(
        played(
            ResponseEvents(head()),
            Queued(request_id="r", position=2),
            delta("Hel", 0),
            delta("lo", 3),
            done(4),
        )
    )
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    numbers = [e.sequence_number for e in events]
    assert numbers == [0, 1, 2, 3, HEAD, HEAD + 3, HEAD + 4, HEAD + 5, HEAD + 6, HEAD + 7]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello"
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {"msg_m1"} and events[2].item.id == "msg_m1"
    final = events[-1].response
    assert (final.status, final.output_text, final.id) == ("completed", "Hello", "resp_m1")
    assert (
        final.usage.input_tokens,
        final.usage.output_tokens,
        final.usage.total_tokens,
        final.usage.input_tokens_details.cached_tokens,
    ) == (7, 2, 9, 3)
    assert events[0].response.status == "in_progress" and not events[0].response.output


def test_starting_after_shows_only_the_later_events_with_the_same_numbers():
    script = [delta("Hel", 0), delta("lo", 3), done(4)]
    whole = played(ResponseEvents(head()), *script)
    for after in (-1, 0, 3, HEAD, HEAD + 3, HEAD + 5, HEAD + 7):
        resumed = played(ResponseEvents(head(), after), *script)
        assert resumed == [e for e in whole if e.sequence_number > after]


def test_a_merged_delta_takes_the_number_of_its_last_part():
    [event] = ResponseEvents(head()).add(delta("Hello", 3))
    assert (event.sequence_number, event.delta) == (HEAD + 3, "Hello")


@pytest.mark.parametrize(("status", "state", "reason", "end"), [
    (RequestStatus.FINISHED_LENGTH, "incomplete", "max_output_tokens", "response.incomplete"),
    (RequestStatus.FINISHED_ABORTED, "cancelled", None, "response.incomplete"),
])  # fmt: skip
def test_an_answer_cut_short_is_incomplete_or_cancelled(status, state, reason, end):
    events = sdk(played(ResponseEvents(head()), delta("Hi", 0), done(1, status)))
    final = events[-1]
    assert (final.type, final.response.status) == (end, state)
    details = final.response.incomplete_details
    assert (details.reason if details else None) == reason
    assert final.response.output_text == "Hi"


def test_a_retraction_replaces_the_text_and_ends_incomplete_for_content_filter():
    events = sdk(
        played(
            ResponseEvents(head()),
            delta("bad", 0),
            Retract(request_id="r", seq=1, message_id="m1", reason="pii", replacement="[removed]"),
            delta("more", 2),
            done(3),
        )
    )
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["bad"]
    [text_done] = [e for e in events if e.type == "response.output_text.done"]
    assert text_done.text == "[removed]"
    final = events[-1].response
    assert (final.status, final.incomplete_details.reason) == ("incomplete", "content_filter")


def test_a_failure_is_one_failed_event_with_the_error():
    error = DeliveryError(request_id="r", seq=2, code="engine_error", message="boom")
    events = sdk(played(ResponseEvents(head()), delta("Hi", 0), error))
    assert [e.type for e in events[-2:]] == ["response.output_text.delta", "response.failed"]
    failed = events[-1]
    assert failed.sequence_number == HEAD + 2
    assert failed.response.status == "failed"
    assert (failed.response.error.code, failed.response.error.message) == (
        "server_error",
        "engine_error: boom",
    )


def test_events_after_the_end_or_repeated_make_nothing():
    events = ResponseEvents(head())
    events.add(delta("a", 0))
    assert events.add(delta("a", 0)) == []  # a redelivery
    events.add(done(1))
    assert events.add(delta("late", 2)) == []
    assert events.last == HEAD + 4


def test_a_stored_answer_is_the_response_it_ended_as():
    message = StoredMessage(
        message_id="m1",
        conversation_id="c",
        seq=2,
        role=Role.ASSISTANT,
        content="Hi there",
        parent_id="u",
        model="tiny-random",
        tokens=2,
        status=RequestStatus.FINISHED_STOPPED,
        request_id="r",
        created_at=1.0,
        prompt_tokens=5,
    )
    response = Response.model_validate(stored(head(), message).model_dump(mode="json"))
    assert (response.status, response.output_text, response.usage.total_tokens) == (
        "completed",
        "Hi there",
        7,
    )
    running = stored(head(), replace(message, status=RequestStatus.IN_PROGRESS, content=""))
    assert (running.status, running.output) == ("in_progress", [])


@pytest.mark.parametrize(("extra", "refused"), [
    ({}, []),
    ({"metadata": None, "tools": [], "text": {"format": {"type": "text"}},
      "truncation": "auto", "tool_choice": "none"}, []),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": "required",
      "parallel_tool_calls": False}, []),
    ({"reasoning": {"effort": "low"}}, [("reasoning", "unsupported_parameter")]),
    ({"text": {"format": {"type": "json_object"}}}, []),
    ({"text": {"verbosity": "low"}}, [("text.verbosity", "unsupported_parameter")]),
    ({"frobnicate": 1}, [("frobnicate", "unknown_parameter")]),
])  # fmt: skip
def test_fields_not_honoured_are_named(extra, refused):
    assert refused_fields(ResponseRequest(input="hi", **extra)) == refused


def test_input_messages_split_into_instructions_and_conversation():
    request = ResponseRequest(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_x",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Salut", "annotations": []}],
            },
            {"role": "user", "content": "Again"},
        ],
    )
    assert request.all_instructions == "Be brief.\n\nAnswer in French."
    assert [(i.role, i.text) for i in request.conversation_items] == [
        ("user", "Hi"),
        ("assistant", "Salut"),
        ("user", "Again"),
    ]
