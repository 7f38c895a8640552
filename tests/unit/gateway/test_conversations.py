"""Conversation routes, branches, stop, titles and summaries in process: real SQLite
store, scripted pipeline (see test_gateway_app), words counted as tokens."""

from __future__ import annotations

import asyncio
import contextlib

import orjson

from chatpipe.settings import Settings
from conversations.store import NewMessage
from gateway.context.summaries import SUMMARY_HEADING, TITLE_INSTRUCTIONS, is_summary_request
from gateway.deps import GatewayDeps
from gateway.native.background import BACKGROUND_ACCOUNT
from schemas.events import DeliveryError, Role
from schemas.topics import Tier
from tests.support.chat import until as until_holds
from tests.support.gateway import (
    ALICE,
    BOB,
    app_client,
    assert_error,
    delta,
    done,
    new_conversation,
)


async def turn(client, cid: str, content: str = "hi", headers=ALICE, **body) -> dict:
    """POST a turn; the ids of its `request` event."""
    response = await client.post(
        f"/v1/conversations/{cid}/messages", headers=headers, json={"content": content, **body}
    )
    assert response.status_code == 200, response.text
    return orjson.loads(response.text.split("data: ", 1)[1].split("\n", 1)[0])


async def until(predicate, timeout_s: float = 2.0) -> None:
    await until_holds(predicate, timeout_s, interval_s=0.01)


# --- list, rename, delete -----------------------------------------------------------------


async def test_list_is_the_callers_only_and_pages(client):
    mine = [await new_conversation(client) for _ in range(3)]
    await new_conversation(client, BOB)
    page = (await client.get("/v1/conversations?limit=2", headers=ALICE)).json()
    assert [c["conversation_id"] for c in page["data"]] == mine[:0:-1]
    rest = (
        await client.get(f"/v1/conversations?cursor={page['next_cursor']}", headers=ALICE)
    ).json()
    assert [c["conversation_id"] for c in rest["data"]] == mine[:1]
    assert rest["next_cursor"] is None
    assert_error(
        await client.get("/v1/conversations?cursor=%%%", headers=ALICE), 404, "cursor_not_found"
    )
    assert_error(
        await client.get("/v1/conversations?limit=101", headers=ALICE), 422, "invalid_request"
    )


async def test_rename_and_delete_are_the_owners_only(client, store):
    cid = await new_conversation(client)
    await store.add_message(NewMessage("m1", cid, Role.USER, "hello"))
    for response in [
        await client.patch(f"/v1/conversations/{cid}", json={"title": "x"}, headers=BOB),
        await client.delete(f"/v1/conversations/{cid}", headers=BOB),
    ]:
        assert_error(response, 404, "conversation_not_found")
    renamed = await client.patch(f"/v1/conversations/{cid}", json={"title": "New"}, headers=ALICE)
    assert renamed.json()["title"] == "New"
    assert_error(
        await client.patch(f"/v1/conversations/{cid}", json={"title": "x" * 201}, headers=ALICE),
        422,
        "invalid_request",
    )
    assert (await client.delete(f"/v1/conversations/{cid}", headers=ALICE)).status_code == 204
    assert await store.get_conversation(cid) is None and await store.list_messages(cid) == []


async def test_deleting_cancels_the_conversations_running_answers(client, pipeline):
    cid = await new_conversation(client)
    stream = asyncio.create_task(_held_turn(client, cid))
    await until(lambda: _true(pipeline.streams and pipeline.streams[-1].held.is_set()))
    assert (await client.delete(f"/v1/conversations/{cid}", headers=ALICE)).status_code == 204
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "conversation_deleted")]
    stream.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stream


async def _true(value: object) -> bool:
    return bool(value)


async def _held_turn(client, cid: str) -> None:
    """A turn whose answer never ends (until cancelled)."""
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)


# --- stop ---------------------------------------------------------------------------------


async def test_only_the_owner_stops_a_running_answer(app, client, pipeline, deps: GatewayDeps):
    cid = await new_conversation(client)
    pipeline.script(delta("partial", 0), hold=True)
    stream = asyncio.create_task(_held_turn(client, cid))
    await until(lambda: _true(pipeline.streams and pipeline.streams[-1].held.is_set()))
    [request] = pipeline.submitted
    path = f"/v1/requests/{request.request_id}/cancel"
    assert_error(await client.post(path, headers=BOB), 404, "request_not_found")
    assert_error(
        await client.post("/v1/requests/nope/cancel", headers=ALICE), 404, "request_not_found"
    )
    stopped = await client.post(path, headers=ALICE)
    assert stopped.status_code == 202
    assert stopped.json() == {"request_id": request.request_id, "status": "cancelling"}
    assert pipeline.cancelled == [(request.request_id, "cancelled_by_user")]
    stream.cancel()  # the client goes: the stream closes and this gateway forgets it
    with contextlib.suppress(asyncio.CancelledError):
        await stream
    await until(lambda: _true(len(deps.live) == 0))
    # The store knows the request, so any gateway takes the cancel (this one included).
    assert (await client.post(path, headers=ALICE)).status_code == 202
    assert_error(await client.post(path, headers=BOB), 404, "request_not_found")


# --- branches -----------------------------------------------------------------------------


async def test_regenerate_and_edit_build_from_the_right_thread(client, store, pipeline):
    cid = await new_conversation(client)
    pipeline.script(delta("answer one", 0), done(1))
    first = await turn(client, cid, "one")
    pipeline.script(delta("answer two", 0), done(1))
    second = await turn(client, cid, "two")

    pipeline.script(done(0))
    response = await client.post(
        f"/v1/conversations/{cid}/messages/{second['message_id']}/regenerate",
        json={"temperature": 1.5},
        headers=ALICE,
    )
    assert response.status_code == 200
    regenerated = pipeline.submitted[-1]
    assert regenerated.parent_id == second["user_message_id"]
    assert regenerated.sampling.temperature == 1.5
    assert [m.content for m in regenerated.messages[1:]] == ["one", "answer one", "two"]
    messages = await store.list_messages(cid)
    assert [m.role for m in messages].count(Role.USER) == 2  # no new user message
    assert messages[-1].parent_id == second["user_message_id"]  # the new answer, stored

    pipeline.script(done(0))
    response = await client.post(
        f"/v1/conversations/{cid}/messages/{second['user_message_id']}/edit",
        json={"content": "two, again"},
        headers=ALICE,
    )
    assert response.status_code == 200
    edit = pipeline.submitted[-1]
    assert [m.content for m in edit.messages[1:]] == ["one", "answer one", "two, again"]
    edited = await store.get_message(edit.parent_id)
    assert edited.parent_id == first["message_id"] and edited.content == "two, again"

    for path, code in [
        (f"{second['message_id']}/edit", "not_a_user_message"),
        ("nope/edit", "message_not_found"),
        ("nope/regenerate", "message_not_found"),
    ]:
        status = 404 if code == "message_not_found" else 400
        response = await client.post(
            f"/v1/conversations/{cid}/messages/{path}",
            json={"content": "x"} if "edit" in path else {},
            headers=ALICE,
        )
        assert_error(response, status, code)


async def test_a_prompt_over_the_window_is_413_before_anything_is_stored(
    store, pipeline, settings: Settings
):
    small = settings.replace(**{"max_model_len": 20})
    async with app_client(small, store, pipeline) as (client, _):
        cid = await new_conversation(client)
        response = await client.post(
            f"/v1/conversations/{cid}/messages",
            headers=ALICE,
            json={"content": "a b c d e f g h", "max_tokens": 10},
        )
        assert_error(response, 413, "context_too_long")
        assert await store.list_messages(cid) == [] and pipeline.submitted == []
        pipeline.script(done(0))
        await turn(client, cid, "a b", max_tokens=10)


# --- titles and summaries -----------------------------------------------------------------


async def test_first_exchange_gets_a_fallback_then_a_generated_title(client, store, pipeline):
    cid = await new_conversation(client, ALICE)
    await client.patch(f"/v1/conversations/{cid}", json={"title": ""}, headers=ALICE)
    pipeline.background_scripts.append(([delta('"Trip to Rome."\n', 0), done(1)], False))
    pipeline.script(delta("Sure", 0), done(1))
    await turn(client, cid, "plan  my\ntrip")
    await until(lambda: _true(pipeline.background))
    [asked] = pipeline.background
    assert (asked.tier, asked.store, asked.user_id) == (Tier.FREE, False, BACKGROUND_ACCOUNT)
    assert asked.cache_salt == "org-a" and asked.model == "tiny-random"
    assert asked.messages[0].content == TITLE_INSTRUCTIONS
    assert asked.messages[-1].content == "Title for: plan  my\ntrip"

    async def titled() -> bool:
        return (await client.get(f"/v1/conversations/{cid}", headers=ALICE)).json()[
            "title"
        ] == "Trip to Rome"

    await until(titled)


async def test_title_stays_the_fallback_when_the_answer_fails(client, store, pipeline, deps):
    cid = await new_conversation(client, ALICE)
    await client.patch(f"/v1/conversations/{cid}", json={"title": ""}, headers=ALICE)
    pipeline.script(DeliveryError(request_id="-", code="engine", message="boom"))
    await turn(client, cid, "plan my trip")
    assert (await client.get(f"/v1/conversations/{cid}", headers=ALICE)).json()[
        "title"
    ] == "plan my trip"
    assert pipeline.background == [] and len(deps.background) == 0


async def test_no_generated_title_when_titles_are_off(store, pipeline, settings: Settings):
    untitled = settings.replace(**{"auto_titles": False})
    async with app_client(untitled, store, pipeline) as (client, deps):
        cid = await new_conversation(client)
        await client.patch(f"/v1/conversations/{cid}", json={"title": ""}, headers=ALICE)
        pipeline.script(delta("Sure", 0), done(1))
        await turn(client, cid, "plan my trip")
        assert pipeline.background == [] and len(deps.background) == 0
        assert (await store.get_conversation(cid)).display_title == "plan my trip"


async def test_closing_cancels_background_generations(client, pipeline, deps: GatewayDeps):
    cid = await new_conversation(client, ALICE)
    pipeline.script(done(0))
    await turn(client, cid)
    await until(lambda: _true(pipeline.background))
    assert len(deps.background) == 1
    await deps.background.close()
    assert len(deps.background) == 0
    assert pipeline.cancelled == [(pipeline.background[0].request_id, "client_disconnected")]


async def test_a_summary_is_generated_once_the_history_fills_the_window(
    store, pipeline, settings: Settings
):
    small = settings.replace(
        **{
            "context_window_tokens": {"tiny-random": 60},
            "context_strategy": {"tiny-random": "summary"},
            "system_prompt": "sys",
        }
    )
    pipeline.background_scripts += [
        ([delta("Questions", 0), done(1)], False),  # the title
        ([delta("Alice asked questions.", 0), done(1)], False),
    ]
    async with app_client(small, store, pipeline) as (client, _):
        cid = await new_conversation(client)
        for n in range(4):
            pipeline.script(delta(f"answer {n} word word word", 0), done(1))
            await turn(client, cid, f"question {n} word word word", max_tokens=10)
        await until(lambda: _stored_summary(store, cid))
        pipeline.script(done(0))
        await turn(client, cid, "and now?", max_tokens=10)

    asked = pipeline.background[1]
    assert is_summary_request(asked.messages) and not asked.store
    assert (asked.tier, asked.user_id) == (Tier.FREE, BACKGROUND_ACCOUNT)
    assert asked.sampling.max_tokens == small.context.summary_max_tokens
    [_summary] = await store.list_summaries(cid)
    system = pipeline.submitted[-1].messages[0]
    assert system.content == f"sys\n\n{SUMMARY_HEADING}\nAlice asked questions."
    assert "question 0 word word word" not in [m.content for m in pipeline.submitted[-1].messages]


async def _stored_summary(store, cid: str) -> bool:
    return bool(await store.list_summaries(cid))
