"""Server-side tools on the native API through the whole pipeline:
the sim engine calls a tool (`[[sim:call=...]]`), the worker frees its slot, the
`chat.tools` stage runs the call and queues the next round, and the stream shows
`tool_call`, `tool_result`, then the answer; resuming the stream replays them, and the
stored answer keeps them. A failing or unknown tool gives the model an error result,
and the answer still ends."""

from __future__ import annotations

import asyncio
import json

from aiokafka import AIOKafkaProducer

from bench.topic_log import find_events
from chatpipe.wiring import Stack
from schemas import topics
from schemas.codec import encode
from schemas.events import GenerationRequest, ToolRound
from schemas.tools import round_request_id
from tests.support.chat import SseResult, read_sse
from tests.support.conversations import by_id, error_code, new_conversation, recorded
from tests.support.files import LIGHTHOUSE, owners, upload
from tests.support.server_tools import ANSWER, ask, calling, step
from tests.support.stack import client_for


async def test_the_calculator_runs_and_the_answer_goes_on_after_its_result(
    sim_stack: Stack,
) -> None:
    async with client_for(sim_stack) as client:
        cid = await new_conversation(client)
        result = await ask(client, cid, calling("calculator", {"expression": "(6 + 1) * 6"}))
        call, answer = step(result)
        assert (call["name"], json.loads(call["arguments"])) == (
            "calculator",
            {"expression": "(6 + 1) * 6"},
        )
        assert json.loads(answer["content"]) == {"expression": "(6 + 1) * 6", "result": 42}
        assert not answer["error"] and result.text == ANSWER
        done = result.of("done")[-1].json()
        assert done["status"] == "finished_stopped"

        request_id = result.request["request_id"]
        async with client.stream(
            "GET", f"/v1/requests/{request_id}/events", headers={"Last-Event-ID": "0"}
        ) as resumed:
            replayed = SseResult(resumed.status_code, await read_sse(resumed))
        assert [e.json() for e in replayed.of("tool_result")] == [answer]
        assert replayed.text == result.text

        stored = by_id(await recorded(client, cid, result.request["message_id"]))
        message = stored[result.request["message_id"]]
        assert message["content"] == result.text
        assert [s["type"] for s in message["tool_steps"]] == ["tool_call", "tool_result"]
        assert message["tool_steps"][1]["content"] == answer["content"]


async def test_the_clock_answers_in_a_time_zone(sim_stack: Stack) -> None:
    async with client_for(sim_stack) as client:
        cid = await new_conversation(client)
        _, answer = step(await ask(client, cid, calling("clock", {"timezone": "Asia/Tokyo"})))
        value = json.loads(answer["content"])
        assert value["timezone"] == "Asia/Tokyo" and value["local"].endswith("+09:00")
        assert value["utc"].endswith("+00:00")


async def test_search_documents_finds_the_callers_files_only(sim_stack: Stack) -> None:
    owner, stranger = await owners(sim_stack)
    async with owner, stranger:
        assert (await upload(owner, "lighthouse.md", LIGHTHOUSE.encode())).status_code == 200
        question = calling("search_documents", {"query": "who lights the lamp at dusk"})
        _, found = step(await ask(owner, await new_conversation(owner), question))
        results = json.loads(found["content"])["results"]
        assert results and results[0]["filename"] == "lighthouse.md"
        assert "lamp" in " ".join(r["text"] for r in results)

        _, nothing = step(await ask(stranger, await new_conversation(stranger), question))
        assert json.loads(nothing["content"]) == {"results": [], "files_searched": 0}


async def test_a_failing_or_unknown_tool_gives_the_model_an_error_and_the_answer_ends(
    sim_stack: Stack,
) -> None:
    async with client_for(sim_stack) as client:
        cid = await new_conversation(client)
        for content, error in [
            (calling("calculator", {"expression": "1 / 0"}), "division by zero"),
            (calling("calculator", {"expression": "__import__('os')"}), "not allowed"),
            (calling("weather", {"city": "Oslo"}), "unknown tool 'weather'"),
        ]:
            result = await ask(client, cid, content)
            _, answer = step(result)
            assert answer["error"] and error in json.loads(answer["content"])["error"]
            assert result.of("done")[-1].json()["status"] == "finished_stopped"
            await recorded(client, cid, result.request["message_id"])


async def test_a_result_beyond_64_bits_ends_its_turn_within_seconds(sim_stack: Stack) -> None:
    """`2 ** 64` is inside the calculator's bounds, but beyond the bus encoder's 64-bit
    integers: the turn still ends, at once, with the exact value for the model."""
    async with client_for(sim_stack) as client:
        cid = await new_conversation(client)
        asked = ask(client, cid, calling("calculator", {"expression": "2 ** 64"}))
        result = await asyncio.wait_for(asked, 10)
        _, answer = step(result)
        assert not answer["error"]
        assert json.loads(answer["content"]) == {
            "expression": "2 ** 64",
            "result": "18446744073709551616",
        }
        assert result.text == ANSWER
        assert result.of("done")[-1].json()["status"] == "finished_stopped"


async def test_a_tool_that_is_not_on_is_refused_before_anything_runs(sim_stack: Stack) -> None:
    async with client_for(sim_stack) as client:
        cid = await new_conversation(client)
        refused = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi", "tool_choice": "weather"}
        )
        assert error_code(refused, 404) == "tool_not_found"
        assert (
            error_code(
                await client.post(
                    f"/v1/conversations/{cid}/messages",
                    json={"content": "hi", "tool_choice": "bad name!"},
                ),
                422,
            )
            == "invalid_request"
        )


async def test_a_tool_round_read_twice_shows_and_runs_its_steps_once(sim_stack: Stack) -> None:
    """At least once: a `chat.tools` record read again (a tools stage killed before its
    commit) runs its calls again and queues the same next round (same id) again; the
    client and the store see each step once."""
    async with client_for(sim_stack) as client:
        cid = await new_conversation(client)
        first = await ask(client, cid, calling("calculator", {"expression": "2 ** 10"}))
        request_id = first.request["request_id"]
        [tool_round] = await find_events(
            sim_stack.kafka, topics.TOOLS, ToolRound, lambda r: r.request.request_id == request_id
        )
        producer = AIOKafkaProducer(bootstrap_servers=sim_stack.kafka.bootstrap_servers)
        await producer.start()
        try:
            await producer.send_and_wait(topics.TOOLS, encode(tool_round), key=cid.encode())
        finally:
            await producer.stop()
        following = round_request_id(request_id, 1)
        again = await find_events(
            sim_stack.kafka,
            topics.requests_topic(tool_round.request.tier),
            GenerationRequest,
            lambda r: r.request_id == following,
            count=2,
        )
        assert len(again) == 2 and again[0].messages == again[1].messages  # ran again

        async with client.stream("GET", f"/v1/requests/{request_id}/events") as resumed:
            replayed = SseResult(resumed.status_code, await read_sse(resumed))
        assert [e.event for e in replayed.events].count("tool_result") == 1
        assert replayed.text == first.text == ANSWER
        message = by_id(await recorded(client, cid, first.request["message_id"]))[
            first.request["message_id"]
        ]
        assert len(message["tool_steps"]) == 2 and message["content"] == ANSWER
