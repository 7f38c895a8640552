"""The Responses API in process through the official SDK: real SQLite store, scripted
pipeline (see test_gateway_app). What a response stores, what it continues, who sees
it, background responses and their resumed streams, and refused fields."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from schemas.events import Role
from schemas.lifecycle import RequestStatus
from tests.support.gateway import ALICE, assert_error, delta, done

HELLO = (delta("Hel", 0), delta("lo", 1), done(2))


def sdk_for(app, key: str) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app))
    return openai.AsyncOpenAI(
        base_url="http://test/v1", api_key=key, http_client=http, max_retries=0
    )


@pytest.fixture
async def alice(app) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_for(app, "key-alice") as client:
        yield client


@pytest.fixture
async def bob(app) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_for(app, "key-bob") as client:
        yield client


async def test_a_response_is_a_stored_turn_the_native_api_shows(alice, client, pipeline):
    pipeline.script(*HELLO)
    response = await alice.responses.create(
        model="tiny-random", input="Hi there", instructions="Be brief.", max_output_tokens=8
    )
    assert (response.status, response.output_text) == ("completed", "Hello")
    assert response.usage.output_tokens == 2 and response.max_output_tokens == 8
    [request] = pipeline.submitted
    assert request.messages[0].role == Role.SYSTEM
    assert request.messages[0].content.endswith("Be brief.")
    assert request.messages[-1].content == "Hi there"
    assert request.sampling.max_tokens == 8
    conversation = (
        await client.get(f"/v1/conversations/{response.conversation.id}", headers=ALICE)
    ).json()
    user, answer = conversation["messages"]
    assert (user["role"], user["content"]) == ("user", "Hi there")
    assert (answer["role"], answer["content"]) == ("assistant", "Hello")
    assert response.id == "resp_" + answer["message_id"]
    assert response.output[0].id == "msg_" + answer["message_id"]


async def test_previous_response_id_continues_its_conversation(alice, client, pipeline):
    pipeline.script(*HELLO)
    first = await alice.responses.create(model="tiny-random", input="Hi there")
    pipeline.script(delta("Again", 0), done(1))
    second = await alice.responses.create(
        model="tiny-random", input="More please", previous_response_id=first.id
    )
    asked = [(m.role, m.content) for m in pipeline.submitted[1].messages if m.role != "system"]
    assert asked == [(Role.USER, "Hi there"), (Role.ASSISTANT, "Hello"), (Role.USER, "More please")]
    assert second.conversation.id == first.conversation.id
    assert (await alice.responses.retrieve(second.id)).previous_response_id == first.id
    thread = (await client.get(f"/v1/conversations/{first.conversation.id}", headers=ALICE)).json()[
        "thread"
    ]
    assert len(thread) == 4 and thread[1] == first.id.removeprefix("resp_")


async def test_input_messages_before_the_last_are_stored_in_order(alice, client, pipeline):
    pipeline.script(*HELLO)
    response = await alice.responses.create(
        model="tiny-random",
        input=[
            {"role": "system", "content": "Talk like a pirate."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Ahoy"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Where?"}]},
        ],
    )
    [request] = pipeline.submitted
    assert request.messages[0].content.endswith("Talk like a pirate.")
    assert [m.content for m in request.messages[1:]] == ["Hi", "Ahoy", "Where?"]
    messages = (
        await client.get(f"/v1/conversations/{response.conversation.id}", headers=ALICE)
    ).json()["messages"]
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "Hi"),
        ("assistant", "Ahoy"),
        ("user", "Where?"),
        ("assistant", "Hello"),
    ]


async def test_a_streamed_response_sends_the_typed_events(alice, pipeline):
    pipeline.script(*HELLO)
    stream = await alice.responses.create(model="tiny-random", input="Hi", stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events][:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert [e.sequence_number for e in events] == sorted({e.sequence_number for e in events})
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Hello"
    retrieved = await alice.responses.retrieve(events[-1].response.id)
    assert (retrieved.status, retrieved.output_text) == ("completed", "Hello")


async def test_a_response_is_only_its_owners(alice, bob, pipeline):
    pipeline.script(*HELLO)
    response = await alice.responses.create(model="tiny-random", input="Hi")
    for call in (
        bob.responses.retrieve(response.id),
        bob.responses.cancel(response.id),
        bob.responses.create(model="tiny-random", input="x", previous_response_id=response.id),
    ):
        with pytest.raises(openai.NotFoundError) as refused:
            await call
        assert refused.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        await alice.responses.retrieve("resp_nothing")


async def test_an_unstored_response_is_not_retrievable_nor_stored(alice, client, pipeline):
    pipeline.script(*HELLO)
    first = await alice.responses.create(model="tiny-random", input="Hi")
    pipeline.script(delta("Bye", 0), done(1))
    unstored = await alice.responses.create(
        model="tiny-random", input="Then?", store=False, previous_response_id=first.id
    )
    assert (unstored.output_text, unstored.store, unstored.conversation) == ("Bye", False, None)
    asked = [m.content for m in pipeline.submitted[1].messages]
    assert asked == ["Hi", "Hello", "Then?"]
    with pytest.raises(openai.NotFoundError):
        await alice.responses.retrieve(unstored.id)
    messages = (
        await client.get(f"/v1/conversations/{first.conversation.id}", headers=ALICE)
    ).json()["messages"]
    assert len(messages) == 2


async def test_a_background_response_runs_on_and_its_stream_resumes(alice, deps, pipeline):
    pipeline.script(*HELLO)
    queued = await alice.responses.create(model="tiny-random", input="Hi", background=True)
    assert (queued.status, queued.background) == ("queued", True)
    for _ in range(100):
        retrieved = await alice.responses.retrieve(queued.id)
        if retrieved.status != "in_progress":
            break
        await asyncio.sleep(0.01)
    assert (retrieved.status, retrieved.output_text) == ("completed", "Hello")
    whole = [e async for e in await alice.responses.retrieve(queued.id, stream=True)]
    assert whole[-1].type == "response.completed"
    assert whole[-1].response.output_text == "Hello"
    after = whole[4].sequence_number  # the first delta
    resumed = [
        e
        async for e in await alice.responses.retrieve(queued.id, stream=True, starting_after=after)
    ]
    assert resumed == [e for e in whole if e.sequence_number > after]
    assert [e.delta for e in resumed if e.type == "response.output_text.delta"] == ["lo"]
    assert not pipeline.cancelled


async def test_a_background_response_can_be_cancelled(alice, store, pipeline):
    pipeline.script(delta("Hel", 0), hold=True)
    queued = await alice.responses.create(model="tiny-random", input="Hi", background=True)
    assert (await alice.responses.retrieve(queued.id)).status == "in_progress"
    cancelled = await alice.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    [request] = pipeline.submitted
    assert pipeline.cancelled == [(request.request_id, "cancelled_by_user")]
    message = await store.get_message(queued.id.removeprefix("resp_"))
    assert message.status == RequestStatus.IN_PROGRESS  # until the pipeline says it ended


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"frobnicate": True}, "frobnicate", "unknown_parameter"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}, "tools.1.type",
     "unsupported_tool"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice", "unsupported_tool_choice"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]},
     "tools.0.parameters", "invalid_tools"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
     "text.format.schema", "invalid_response_format"),
    ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported_parameter"),
    ({"background": True, "store": False}, "background", "invalid_request"),
    ({"background": True, "text": {"format": {"type": "json_object"}}}, "background",
     "invalid_request"),
    ({"input": [{"role": "assistant", "content": "Hi"}]}, "input", "invalid_input"),
])  # fmt: skip
async def test_fields_not_honoured_are_400_naming_them(client, pipeline, body, param, code):
    response = await client.post(
        "/v1/responses", json={"model": "tiny-random", "input": "Hi", **body}, headers=ALICE
    )
    assert assert_error(response, 400, code)["param"] == param
    assert not pipeline.submitted
    conversations = (await client.get("/v1/conversations", headers=ALICE)).json()["data"]
    assert conversations == []


async def test_a_refused_reply_stores_nothing(client, pipeline):
    """Past the field checks: an earlier message over the message limit (50 characters
    here) is refused before the conversation or any message is stored."""
    response = await client.post(
        "/v1/responses",
        headers=ALICE,
        json={
            "model": "tiny-random",
            "input": [{"role": "user", "content": "x" * 51}, {"role": "user", "content": "Hi"}],
        },
    )
    assert_error(response, 413, "message_too_long")
    assert not pipeline.submitted
    assert (await client.get("/v1/conversations", headers=ALICE)).json()["data"] == []
