"""The gateway's HTTP layer in process: real SQLite store, scripted pipeline.

`ScriptedPipeline` implements `gateway.pipeline.Pipeline`: each submit plays
the next script of delivery events, then ends or (hold=True) stays open the
way a generation still running does. Disconnects are driven through the raw
ASGI interface, since httpx's ASGITransport only reports a disconnect once the
response is complete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import openai
import orjson
import pytest

from conversations.store import NewMessage, RequestRecord
from schemas import sse
from schemas.events import (
    DeliveryError,
    Queued,
    Retract,
    Role,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.gateway import (
    ALICE,
    BOB,
    REPLY_TO,
    assert_error,
    delta,
    disconnect_after_hold,
    done,
    new_conversation,
)

# --- auth and errors ------------------------------------------------------------------


async def test_healthz_needs_no_key(client):
    response = await client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Basic a2V5"}, {"Authorization": "Bearer "}]
)
async def test_missing_key_is_401(client, headers):
    for method, path in [("get", "/v1/models"), ("post", "/v1/conversations")]:
        response = await client.request(method, path, headers=headers, json={})
        error = assert_error(response, 401, "missing_api_key")
        assert error["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"


async def test_unknown_key_is_401(client):
    response = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert_error(response, 401, "invalid_api_key")


async def test_malformed_json_is_400(client):
    cid = await new_conversation(client)
    response = await client.post(
        f"/v1/conversations/{cid}/messages",
        content=b'{"content": "hi"',
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert_error(response, 400, "invalid_json")
    response = await client.post(
        "/v1/chat/completions", content=b"[[", headers={**ALICE, "Content-Type": "application/json"}
    )
    assert_error(response, 400, "invalid_json")


async def test_invalid_fields_are_422_naming_the_field(client):
    cid = await new_conversation(client)
    response = await client.post(f"/v1/conversations/{cid}/messages", json={}, headers=ALICE)
    assert assert_error(response, 422, "invalid_request")["param"] == "content"
    response = await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": "hi", "temperature": 9},
        headers=ALICE,
    )
    assert assert_error(response, 422, "invalid_request")["param"] == "temperature"
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny-random", "messages": [{"role": "robot", "content": "x"}]},
        headers=ALICE,
    )
    assert assert_error(response, 422, "invalid_request")["param"] == "messages.0.role"


async def test_unknown_route_uses_the_error_shape_naming_the_route(client):
    error = assert_error(await client.get("/v1/nope", headers=ALICE), 404, "not_found")
    assert error["message"] == "no route GET /v1/nope"
    error = assert_error(await client.get("/" + "x" * 500), 404, "not_found")
    assert error["message"] == f"no route GET /{'x' * 199}…"
    error = assert_error(
        await client.delete("/v1/models", headers=ALICE), 405, "method_not_allowed"
    )
    assert error["message"] == "no route DELETE /v1/models; its path takes GET"


async def test_unknown_and_foreign_conversations_are_404(client, pipeline):
    bobs = await new_conversation(client, BOB)
    for cid in ["missing", bobs]:
        assert_error(
            await client.get(f"/v1/conversations/{cid}", headers=ALICE),
            404,
            "conversation_not_found",
        )
        response = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
        )
        assert_error(response, 404, "conversation_not_found")
    assert (await client.get(f"/v1/conversations/{bobs}", headers=BOB)).status_code == 200
    assert pipeline.submitted == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"content": "hi", "model": "gpt-9"}, 404, "model_not_found"),
        ({"content": ""}, 400, "empty_message"),
        ({"content": "  \n "}, 400, "empty_message"),
        ({"content": "x" * 51}, 413, "message_too_long"),
        ({"content": "hi", "max_tokens": 101}, 422, "max_tokens_too_large"),
        ({"content": "hi", "max_tokens": 0}, 422, "invalid_request"),
    ],
)
async def test_rejected_messages_are_not_stored_or_sent(
    client, store, pipeline, body, status, code
):
    cid = await new_conversation(client)
    response = await client.post(f"/v1/conversations/{cid}/messages", json=body, headers=ALICE)
    assert_error(response, status, code)
    assert await store.list_messages(cid) == []
    assert pipeline.submitted == []


async def test_shedding_tier_is_503_with_retry_after_before_anything_is_stored(
    client, store, pipeline
):
    cid = await new_conversation(client)
    pipeline.shedding[Tier.PRO] = 7.2
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    assert_error(response, 503, "overloaded")
    assert response.headers["retry-after"] == "8"
    assert await store.list_messages(cid) == []
    completion = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert_error(completion, 503, "overloaded")
    assert pipeline.submitted == []
    pipeline.shedding.clear()
    pipeline.script(done(0))
    assert (
        await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
        )
    ).status_code == 200


# --- native API -----------------------------------------------------------------------


async def test_conversation_round_trip(client, store):
    cid = await new_conversation(client)
    await store.add_message(NewMessage("m1", cid, Role.USER, "hello"))
    response = await client.get(f"/v1/conversations/{cid}", headers=ALICE)
    assert response.status_code == 200
    body = response.json()
    assert body["conversation_id"] == cid and body["title"] == "t"
    assert [(m["message_id"], m["role"], m["content"]) for m in body["messages"]] == [
        ("m1", "user", "hello")
    ]


async def test_native_stream_wire_format(client, store, pipeline):
    cid = await new_conversation(client)
    pipeline.script(
        Queued(request_id="-", position=2, eta_ms=300),
        delta("Hel", 0),
        delta("lo\n", 1),
        done(2),
    )
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi", "seed": 3}, headers=ALICE
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    [request] = pipeline.submitted
    user, answer = await store.list_messages(cid)
    assert (answer.content, answer.status) == ("Hello\n", RequestStatus.FINISHED_STOPPED), (
        "stored before the end was sent"
    )
    opened = json.dumps(
        {
            "request_id": request.request_id,
            "message_id": request.message_id,
            "user_message_id": user.message_id,
        },
        separators=(",", ":"),
    )
    usage = '{"prompt_tokens":7,"completion_tokens":2,"cached_tokens":3}'
    assert response.text == (
        f"event: request\ndata: {opened}\n\n"
        'event: queued\ndata: {"position":2,"eta_ms":300}\n\n'
        'id: 0\nevent: delta\ndata: {"delta":"Hel"}\n\n'
        'id: 1\nevent: delta\ndata: {"delta":"lo\\n"}\n\n'
        'id: 2\nevent: done\ndata: {"finish_reason":"stop","status":"finished_stopped",'
        f'"usage":{usage}}}\n\n'
        "data: [DONE]\n\n"
    )
    assert response.headers["x-request-id"] == request.request_id
    assert pipeline.cancelled == []


async def test_native_request_carries_owner_and_prompt(client, store, pipeline, settings):
    cid = await new_conversation(client)
    pipeline.script(done(0))
    await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": "hi", "temperature": 0, "max_tokens": 5},
        headers=ALICE,
    )
    [request] = pipeline.submitted
    user, answer = await store.list_messages(cid)
    assert (user.role, user.content, user.parent_id) == (Role.USER, "hi", None)
    assert (answer.message_id, answer.parent_id, answer.request_id) == (
        request.message_id,
        user.message_id,
        request.request_id,
    )
    record = await store.get_request(request.request_id)
    assert record is not None and (record.user_id, record.reply_to) == ("alice", REPLY_TO)
    assert pipeline.started == [request], "the marker on chat.answers comes first"
    assert request.conversation_id == cid and request.parent_id == user.message_id
    assert (request.user_id, request.org_id, request.tier) == ("alice", "org-a", Tier.PRO)
    assert request.cache_salt == "org-a" and request.reply_to == REPLY_TO and request.store
    assert request.model == "tiny-random"
    assert [(m.role, m.content) for m in request.messages] == [
        (Role.SYSTEM, settings.context.system_prompt),
        (Role.USER, "hi"),
    ]
    assert (request.sampling.max_tokens, request.sampling.temperature) == (5, 0.0)
    assert request.deadline == pytest.approx(
        request.created_at + settings.gateway.request_timeout_s, 1
    )
    assert request.message_id not in (user.message_id, request.request_id)


async def test_the_answer_is_stored_when_its_end_arrives_and_the_next_turn_sees_it(
    client, store, pipeline
):
    cid = await new_conversation(client)
    pipeline.script(delta("yo", 0), done(1))
    pipeline.script(done(0))
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    first = pipeline.submitted[0]
    shown = (await client.get(f"/v1/conversations/{cid}", headers=ALICE)).json()
    assert [(m["content"], m["status"]) for m in shown["messages"]] == [
        ("hi", "finished_stopped"),
        ("yo", "finished_stopped"),
    ]
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert response.status_code == 200
    second = pipeline.submitted[1]
    assert [(m.role, m.content) for m in second.messages] == [
        (Role.SYSTEM, "You are a helpful assistant."),
        (Role.USER, "hi"),
        (Role.ASSISTANT, "yo"),
        (Role.USER, "again"),
    ]
    messages = await store.list_messages(cid)
    assert messages[2].parent_id == first.message_id


async def test_a_turn_while_the_previous_answer_streams_waits_then_is_409(
    client, store, pipeline, deps
):
    cid = await new_conversation(client)
    pipeline.script(done(0))
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    first = pipeline.submitted[0]
    user, _answer = await store.list_messages(cid)
    # Another answer to the same message, still streaming (say, on another gateway).
    streaming = NewMessage(
        "m2",
        cid,
        Role.ASSISTANT,
        "",
        parent_id=user.message_id,
        status=RequestStatus.IN_PROGRESS,
        request_id="r2",
    )
    await store.start_answer(streaming, RequestRecord("r2", cid, "m2", "alice", 0, 9, REPLY_TO))
    started = asyncio.get_running_loop().time()
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert_error(response, 409, "reply_pending")
    assert asyncio.get_running_loop().time() - started >= deps.config.reply_wait_s
    assert len(pipeline.submitted) == 1 and len(await store.list_messages(cid)) == 3

    async def finish_soon() -> None:
        await asyncio.sleep(0.1)
        await store.finish_answer(
            dataclasses.replace(streaming, content="ok", status=RequestStatus.FINISHED_STOPPED)
        )

    pipeline.script(done(0))
    finishing = asyncio.create_task(finish_soon())
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    await finishing
    assert response.status_code == 200, "waits for the answer to end, then goes on"
    assert [m.content for m in pipeline.submitted[1].messages][-2:] == ["ok", "again"]
    assert first.message_id != "m2"


async def test_a_store_read_that_hangs_does_not_hold_a_turn_past_the_wait(
    client, store, pipeline, deps, monkeypatch
):
    cid = await new_conversation(client)
    pipeline.script(done(0))
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    user, _ = await store.list_messages(cid)
    streaming = NewMessage(
        "m2",
        cid,
        Role.ASSISTANT,
        "",
        parent_id=user.message_id,
        status=RequestStatus.IN_PROGRESS,
        request_id="r2",
    )
    await store.start_answer(streaming, RequestRecord("r2", cid, "m2", "alice", 0, 9, REPLY_TO))

    async def hangs(message_id: str):
        await asyncio.sleep(3600)

    monkeypatch.setattr(store, "get_message", hangs)
    started = asyncio.get_running_loop().time()
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert_error(response, 409, "reply_pending")
    assert asyncio.get_running_loop().time() - started < deps.config.reply_wait_s + 2


async def test_failed_submit_records_a_failed_answer(client, store, pipeline):
    cid = await new_conversation(client)
    pipeline.fail_submit = True
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    assert_error(response, 503, "pipeline_unavailable")
    user, answer = await store.list_messages(cid)
    assert answer.parent_id == user.message_id and answer.status == RequestStatus.FINISHED_ERROR
    pipeline.fail_submit = False
    pipeline.script(done(0))
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert response.status_code == 200


async def test_native_error_and_retract_events(client, pipeline):
    cid = await new_conversation(client)
    pipeline.script(
        delta("bad", 0),
        Retract(request_id="-", seq=1, message_id="m", reason="policy", replacement="[removed]"),
        DeliveryError(request_id="-", seq=2, code="overloaded", message="busy", retry_after=5),
    )
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    messages = sse.parse_messages(response.text)
    assert [(m.event, m.id) for m in messages] == [
        ("request", None),
        ("delta", "0"),
        ("retract", "1"),
        ("error", "2"),
        (None, None),
    ]
    assert json.loads(messages[2].data) == {
        "message_id": "m",
        "reason": "policy",
        "replacement": "[removed]",
    }
    assert json.loads(messages[3].data) == {
        "code": "overloaded",
        "message": "busy",
        "retry_after": 5,
    }
    assert messages[-1].is_done
    assert pipeline.cancelled == []


async def test_native_stream_cut_short_reports_and_is_held_for_a_resume(client, pipeline, settings):
    cid = await new_conversation(client)
    pipeline.script(delta("a", 0))  # ends without done: e.g. the gateway is stopping
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    messages = sse.parse_messages(response.text)
    assert [m.event for m in messages] == ["request", "delta", "error", None]
    assert json.loads(messages[2].data)["code"] == "stream_interrupted"
    assert pipeline.cancelled == []
    assert pipeline.held == [(pipeline.submitted[0].request_id, settings.gateway.resume_grace_s)]


# --- OpenAI-compatible API ------------------------------------------------------------


async def test_models_list(sdk):
    models = await sdk.models.list()
    assert [m.id for m in models.data] == ["tiny-random"]


async def test_openai_non_stream(sdk, pipeline, store):
    pipeline.script(delta("Hel", 0), delta("lo", 1), done(2, RequestStatus.FINISHED_LENGTH))
    completion = await sdk.chat.completions.create(
        model="tiny-random",
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        max_completion_tokens=9,
        stop="\n",
        temperature=0.5,
    )
    [request] = pipeline.submitted
    assert completion.id == f"chatcmpl-{request.request_id}"
    assert completion._request_id == request.request_id  # the x-request-id header
    assert completion.choices[0].message.content == "Hello"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.total_tokens == 9
    assert completion.usage.prompt_tokens_details.cached_tokens == 3
    assert not request.store and request.parent_id is None
    assert await store.get_conversation(request.conversation_id) is None
    assert [(m.role, m.content) for m in request.messages] == [
        (Role.SYSTEM, "be brief"),
        (Role.USER, "hi"),
    ]
    assert request.sampling.max_tokens == 9 and request.sampling.stop == ("\n",)
    assert pipeline.cancelled == []


async def test_openai_stream_with_usage(sdk, pipeline):
    pipeline.script(Queued(request_id="-", position=1), delta("Hel", 0), delta("lo", 1), done(2))
    stream = await sdk.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, None, "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


async def test_openai_stream_raw_ends_with_done(client, pipeline):
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny-random",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        headers=ALICE,
    )
    messages = sse.parse_messages(response.text)
    assert messages[-1].is_done and all(m.event is None for m in messages)
    chunks = [orjson.loads(m.data) for m in messages[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "a", None]
    assert all(c["usage"] is None for c in chunks)  # no usage chunk unless asked for


async def test_openai_errors(sdk, pipeline):
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.code == "model_not_found"
    pipeline.script(DeliveryError(request_id="-", code="overloaded", message="busy", retry_after=4))
    with pytest.raises(openai.InternalServerError) as shed:
        await sdk.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "x"}]
        )
    assert shed.value.status_code == 503 and shed.value.response.headers["retry-after"] == "4"
    pipeline.script(
        delta("a", 0), DeliveryError(request_id="-", seq=1, code="engine", message="boom")
    )
    stream = await sdk.chat.completions.create(
        model="tiny-random", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError, match="boom"):
        async for _ in stream:
            pass
    pipeline.fail_submit = True
    with pytest.raises(openai.InternalServerError) as down:
        await sdk.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "x"}]
        )
    assert down.value.status_code == 503 and down.value.code == "pipeline_unavailable"


# --- client disconnect cancels the generation -----------------------------------------


def body_text(sent: list[dict]) -> str:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


async def test_disconnect_holds_native_stream_for_a_resume(app, client, pipeline, settings):
    cid = await new_conversation(client)
    pipeline.script(delta("partial", 0), hold=True)
    sent = await disconnect_after_hold(
        app, pipeline, f"/v1/conversations/{cid}/messages", {"content": "hi"}
    )
    assert '"partial"' in body_text(sent) and "[DONE]" not in body_text(sent)
    [request] = pipeline.submitted
    assert pipeline.cancelled == [], "the generation goes on for the resume grace"
    assert pipeline.held == [(request.request_id, settings.gateway.resume_grace_s)]


async def test_disconnect_cancels_openai_stream(app, pipeline):
    pipeline.script(delta("partial", 0), hold=True)
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    sent = await disconnect_after_hold(app, pipeline, "/v1/chat/completions", body)
    assert '"partial"' in body_text(sent)
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "client_disconnected")]
    assert pipeline.streams[0].closed


async def test_disconnect_cancels_openai_non_stream(app, pipeline):
    pipeline.script(delta("partial", 0), hold=True)
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]}
    await disconnect_after_hold(app, pipeline, "/v1/chat/completions", body)
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "client_disconnected")]
    assert pipeline.streams[0].closed
