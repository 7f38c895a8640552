"""Server-side tool rounds driven over HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.support.chat import SseResult, post_message


def calling(name: str, arguments: dict[str, Any], question: str = "Please help.") -> str:
    """A question the sim answers with a call of `name`, then (after the result) with
    `ANSWER`."""
    return f"{question} [[sim:call={name} {json.dumps(arguments)}]] [[sim:reply={ANSWER}]]"


ANSWER = "Here is what the tool said."


async def ask(client: httpx.AsyncClient, cid: str, content: str, **options: Any) -> SseResult:
    result = await post_message(
        client, cid, {"content": content, "max_tokens": 64, "tool_choice": "auto", **options}
    )
    assert result.status == 200 and result.ended_with_done, result
    return result


def step(result: SseResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one call and its result, checked to come before any text, in id order."""
    [call], [answer] = result.of("tool_call"), result.of("tool_result")
    kinds = [
        e.event for e in result.events if e.event in ("tool_call", "tool_result", "delta", "done")
    ]
    assert kinds[:2] == ["tool_call", "tool_result"] and kinds[-1] == "done", kinds
    ids = [int(e.id) for e in result.events if e.id is not None]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    assert answer.json()["id"] == call.json()["id"]
    return call.json(), answer.json()
