"""Server-side tools on real vLLM with the tiny model: a turn that
names a server tool holds the first round's output to the tool's arguments (vLLM
structured outputs), so even random weights call it; the tools stage runs the call, and
the next round (tools offered, `auto`) answers to the end."""

from __future__ import annotations

import json

import jsonschema
import pytest

from chatpipe.wiring import Stack
from servertools.catalog import SPECS
from tests.support.chat import post_message
from tests.support.conversations import by_id, new_conversation, recorded
from tests.support.stack import client_for

pytestmark = pytest.mark.vllm


async def test_a_forced_server_tool_runs_and_the_answer_ends(vllm_stack: Stack) -> None:
    async with client_for(vllm_stack) as client:
        cid = await new_conversation(client)
        result = await post_message(
            client,
            cid,
            {
                "content": "What time is it in Tokyo?",
                "tool_choice": "clock",
                "max_tokens": 160,
                "temperature": 0,
            },
        )
        assert result.status == 200 and result.ended_with_done, result
        kinds = [e.event for e in result.events]
        assert kinds.count("tool_call") == 1 and kinds.count("tool_result") == 1, result.events
        [call], [answer] = result.of("tool_call"), result.of("tool_result")
        call, answer = call.json(), answer.json()
        assert call["name"] == "clock" and answer["id"] == call["id"]
        jsonschema.validate(json.loads(call["arguments"]), SPECS["clock"].function.parameters)
        value = json.loads(answer["content"])  # the time, or an error for a made-up zone
        assert "utc" in value if not answer["error"] else "error" in value
        assert result.of("done")[-1].json()["status"] in ("finished_stopped", "finished_length")
        message = by_id(await recorded(client, cid, result.request["message_id"]))[
            result.request["message_id"]
        ]
        assert [s["type"] for s in message["tool_steps"]][:2] == ["tool_call", "tool_result"]
