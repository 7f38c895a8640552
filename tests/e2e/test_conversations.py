"""Conversations over HTTP through the whole pipeline (sim engine): list, read as a
tree, rename, delete; regenerate, edit, select a branch; stop a running answer;
automatic titles; per-turn usage; and nobody else's key sees any of it."""

from __future__ import annotations

import asyncio

from bench.topic_log import find_events
from chatpipe.wiring import Stack
from gateway.context.summaries import TITLE_INSTRUCTIONS
from gateway.native.background import BACKGROUND_ACCOUNT
from schemas import topics
from schemas.events import GenerationRequest, Role
from schemas.sse import read_messages
from schemas.topics import Tier
from tests.support.conversations import (
    Client,
    by_id,
    error_code,
    new_conversation,
    new_user,
    queued_request,
    recorded,
    say,
    sse_post,
)

# --- list, read, rename, delete -----------------------------------------------------------


async def test_list_pages_newest_first_then_read_rename_and_delete(sim_stack: Stack) -> None:
    async with await new_user(sim_stack) as client:
        cids = [await new_conversation(client, f"chat {i}") for i in range(3)]
        first = (await client.get("/v1/conversations", params={"limit": 2})).json()
        assert [c["conversation_id"] for c in first["data"]] == cids[:0:-1]
        assert first["next_cursor"]
        second = (
            await client.get(
                "/v1/conversations", params={"limit": 2, "cursor": first["next_cursor"]}
            )
        ).json()
        assert [c["conversation_id"] for c in second["data"]] == [cids[0]]
        assert second["next_cursor"] is None
        bad = await client.get("/v1/conversations", params={"cursor": "not-a-cursor"})
        assert error_code(bad, 404) == "cursor_not_found"
        assert error_code(await client.get("/v1/conversations", params={"limit": 0}), 422)

        answered = await say(client, cids[1], "hello there")
        tree = (await client.get(f"/v1/conversations/{cids[1]}")).json()
        user_id, answer_id = answered.request["user_message_id"], answered.request["message_id"]
        assert tree["title"] == "chat 1"
        assert tree["thread"] == tree["roots"] + [answer_id] == [user_id, answer_id]
        assert by_id(tree)[user_id]["children"] == [answer_id]
        assert by_id(tree)[answer_id]["content"] == answered.text
        assert by_id(tree)[answer_id]["model"] == sim_stack.settings.inference.model_name

        renamed = await client.patch(f"/v1/conversations/{cids[1]}", json={"title": "Renamed"})
        assert renamed.status_code == 200 and renamed.json()["title"] == "Renamed"
        listed = (await client.get("/v1/conversations")).json()["data"]
        assert [c["title"] for c in listed] == ["chat 2", "Renamed", "chat 0"]

        assert (await client.delete(f"/v1/conversations/{cids[1]}")).status_code == 204
        gone = await client.get(f"/v1/conversations/{cids[1]}")
        assert error_code(gone, 404) == "conversation_not_found"
        assert error_code(await client.delete(f"/v1/conversations/{cids[1]}"), 404)
        listed = (await client.get("/v1/conversations")).json()["data"]
        assert [c["conversation_id"] for c in listed] == [cids[2], cids[0]]
        assert await sim_stack.store.list_messages(cids[1]) == []


# --- branches: regenerate, select, edit ---------------------------------------------------


async def test_regenerate_adds_a_sibling_answer_and_selecting_switches_the_thread(
    sim_stack: Stack,
) -> None:
    async with await new_user(sim_stack) as client:
        cid = await new_conversation(client)
        first = await say(client, cid, "tell me something [[sim:length=8]]")
        user_id, old_id = first.request["user_message_id"], first.request["message_id"]

        again = await sse_post(
            client, f"/v1/conversations/{cid}/messages/{old_id}/regenerate", {"max_tokens": 16}
        )
        assert again.ended_with_done and again.request["user_message_id"] == user_id
        new_id = again.request["message_id"]
        tree = await recorded(client, cid, new_id)
        messages = by_id(tree)
        assert messages[user_id]["children"] == [old_id, new_id]
        assert messages[user_id]["selected_child"] == new_id
        assert tree["thread"] == [user_id, new_id]
        assert messages[old_id]["content"] == first.text
        assert messages[new_id]["content"] == again.text != first.text
        first_request = await queued_request(sim_stack, first.request["request_id"])
        regenerated = await queued_request(sim_stack, again.request["request_id"])
        assert regenerated.messages == first_request.messages
        assert regenerated.parent_id == user_id

        selected = await client.post(f"/v1/conversations/{cid}/messages/{old_id}/select")
        assert selected.status_code == 200 and selected.json()["thread"] == [user_id, old_id]
        missing = await client.post(f"/v1/conversations/{cid}/messages/nope/select")
        assert error_code(missing, 404) == "message_not_found"

        follow_up = await say(client, cid, "and then?")
        request = await queued_request(sim_stack, follow_up.request["request_id"])
        assert [m.content for m in request.messages[1:]] == [
            "tell me something [[sim:length=8]]",
            first.text,
            "and then?",
        ]
        tree = (await client.get(f"/v1/conversations/{cid}")).json()
        assert tree["thread"] == [
            user_id,
            old_id,
            follow_up.request["user_message_id"],
            follow_up.request["message_id"],
        ]


async def test_editing_a_user_message_forks_the_conversation(sim_stack: Stack) -> None:
    async with await new_user(sim_stack) as client:
        cid = await new_conversation(client)
        one = await say(client, cid, "first question")
        two = await say(client, cid, "second question")
        u1, a1 = one.request["user_message_id"], one.request["message_id"]
        u2 = two.request["user_message_id"]

        edited = await sse_post(
            client,
            f"/v1/conversations/{cid}/messages/{u2}/edit",
            {"content": "second question, better put", "max_tokens": 16},
        )
        assert edited.ended_with_done
        u2_new, a2_new = edited.request["user_message_id"], edited.request["message_id"]
        tree = await recorded(client, cid, a2_new)
        messages = by_id(tree)
        assert messages[a1]["children"] == [u2, u2_new]
        assert messages[u2_new]["parent_id"] == a1
        assert tree["thread"] == [u1, a1, u2_new, a2_new]
        request = await queued_request(sim_stack, edited.request["request_id"])
        assert [(m.role, m.content) for m in request.messages[1:]] == [
            (Role.USER, "first question"),
            (Role.ASSISTANT, one.text),
            (Role.USER, "second question, better put"),
        ]

        root_edit = await sse_post(
            client,
            f"/v1/conversations/{cid}/messages/{u1}/edit",
            {"content": "start over", "max_tokens": 8},
        )
        tree = await recorded(client, cid, root_edit.request["message_id"])
        assert tree["roots"] == [u1, root_edit.request["user_message_id"]]
        assert tree["thread"] == [
            root_edit.request["user_message_id"],
            root_edit.request["message_id"],
        ]
        request = await queued_request(sim_stack, root_edit.request["request_id"])
        assert [m.content for m in request.messages[1:]] == ["start over"]

        not_user = await client.post(
            f"/v1/conversations/{cid}/messages/{a1}/edit", json={"content": "x"}
        )
        assert error_code(not_user, 400) == "not_a_user_message"


# --- stop, ownership ------------------------------------------------------------------------


async def test_stop_ends_a_running_answer_and_only_its_owner_may(sim_stack: Stack) -> None:
    max_tokens = 2000
    async with await new_user(sim_stack) as alice, await new_user(sim_stack) as bob:
        cid = await new_conversation(alice)
        body = {"content": "talk for a long time", "max_tokens": max_tokens, "ignore_eos": True}
        async with alice.stream("POST", f"/v1/conversations/{cid}/messages", json=body) as stream:
            lines = stream.aiter_lines()
            started = await read_messages(lines, stop=lambda e: e.event == "delta")
            ids = started[0].json()
            request_id, message_id = ids["request_id"], ids["message_id"]

            foreign = await bob.post(f"/v1/requests/{request_id}/cancel")
            assert error_code(foreign, 404) == "request_not_found"
            stopped = await alice.post(f"/v1/requests/{request_id}/cancel")
            assert stopped.status_code == 202, stopped.text
            assert stopped.json() == {"request_id": request_id, "status": "cancelling"}
            rest = await read_messages(lines)

        [done] = [e.json() for e in rest if e.event == "done"]
        assert done["status"] == "finished_aborted"
        assert done["usage"]["completion_tokens"] < max_tokens / 4
        assert rest[-1].data == "[DONE]"
        tree = await recorded(alice, cid, message_id)
        assert by_id(tree)[message_id]["status"] == "finished_aborted"
        usage = (await alice.get(f"/v1/conversations/{cid}/usage")).json()
        [turn] = usage["turns"]
        assert turn["message_id"] == message_id
        assert 0 < turn["completion_tokens"] < max_tokens / 4
        assert turn["prompt_tokens"] > 0 and usage["prompt_tokens"] == turn["prompt_tokens"]
        again = await alice.post(f"/v1/requests/{request_id}/cancel")
        assert error_code(again, 404) == "request_not_found"  # no longer running
        await _nobody_else_may_touch(bob, cid, ids)
        after = (await alice.get(f"/v1/conversations/{cid}")).json()
        assert after["title"] == tree["title"] and after["messages"] == tree["messages"]


async def _nobody_else_may_touch(bob: Client, cid: str, ids: dict[str, str]) -> None:
    """Bob gets 404 on everything of Alice's, as for ids that do not exist."""
    base = f"/v1/conversations/{cid}"
    user_message, answer = ids["user_message_id"], ids["message_id"]
    attempts = [
        bob.get(base),
        bob.patch(base, json={"title": "mine now"}),
        bob.delete(base),
        bob.get(f"{base}/usage"),
        bob.post(f"{base}/messages", json={"content": "hi"}),
        bob.post(f"{base}/messages/{user_message}/edit", json={"content": "hi"}),
        bob.post(f"{base}/messages/{answer}/regenerate", json={}),
        bob.post(f"{base}/messages/{user_message}/select"),
    ]
    for response in [await attempt for attempt in attempts]:
        assert error_code(response, 404) == "conversation_not_found", response.request.url
    assert cid not in [
        c["conversation_id"] for c in (await bob.get("/v1/conversations")).json()["data"]
    ]


# --- automatic titles --------------------------------------------------------------------


async def test_a_title_is_generated_after_the_first_exchange(sim_stack: Stack) -> None:
    async with await new_user(sim_stack) as client:
        cid = await new_conversation(client)
        question = "plan my trip [[sim:reply=Planning a trip to Rome]]"
        await say(client, cid, question)
        title = await _title_once_generated(client, cid, "Planning a trip to Rome")
        assert title == "Planning a trip to Rome"
        [asked] = await find_events(
            sim_stack.kafka,
            topics.requests_topic(Tier.FREE),
            GenerationRequest,
            lambda r: r.conversation_id == cid and r.messages[0].content == TITLE_INSTRUCTIONS,
        )
        assert (asked.tier, asked.store, asked.model) == (
            Tier.FREE,
            False,
            sim_stack.settings.inference.model_name,
        )
        assert asked.messages[-1].content == f"Title for: {question}"
        assert asked.user_id == BACKGROUND_ACCOUNT  # not billed to the user

        await say(client, cid, "a second question")
        await asyncio.sleep(0.5)
        titles = await find_events(
            sim_stack.kafka,
            topics.requests_topic(Tier.FREE),
            GenerationRequest,
            lambda r: r.conversation_id == cid and r.messages[0].content == TITLE_INSTRUCTIONS,
            count=2,
            timeout_s=2,
        )
        assert len(titles) == 1  # only the first exchange is titled

        await client.patch(f"/v1/conversations/{cid}", json={"title": "My trip"})
        assert (await client.get(f"/v1/conversations/{cid}")).json()["title"] == "My trip"
        await client.patch(f"/v1/conversations/{cid}", json={"title": ""})
        assert (await client.get(f"/v1/conversations/{cid}")).json()["title"] == title


async def _title_once_generated(client: Client, cid: str, expected: str) -> str:
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        title = (await client.get(f"/v1/conversations/{cid}")).json()["title"]
        if title == expected or asyncio.get_running_loop().time() > deadline:
            return title
        await asyncio.sleep(0.1)


async def test_a_message_over_the_window_is_413_and_not_stored(sim_stack: Stack) -> None:
    async with await new_user(sim_stack) as client:
        cid = await new_conversation(client)
        window = sim_stack.settings.inference.context_length()  # the answer alone takes all of it
        response = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hello", "max_tokens": window}
        )
        assert error_code(response, 413) == "context_too_long"
        assert (await client.get(f"/v1/conversations/{cid}")).json()["messages"] == []
