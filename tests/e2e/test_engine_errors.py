"""An engine failure over HTTP, on both APIs: the client gets the
stable code `engine_error` and a fixed message, never the exception's text (the sim
engine's `[[sim:fail]]` raises "scripted failure of <request id>")."""

from __future__ import annotations

from tests.support.chat import post_message
from tests.support.stack import client_for
from workers.failures import ENGINE_ERROR, ENGINE_ERROR_MESSAGE

LEAKS = ("scripted", "SimEngineFailure", "Traceback", ".py", "req-")


def assert_generic(error: dict) -> None:
    assert (error["code"], error["message"]) == (ENGINE_ERROR, ENGINE_ERROR_MESSAGE), error
    assert not [leak for leak in LEAKS if leak in str(error)], error


async def test_native_stream_ends_with_the_code_only(sim_stack):
    async with client_for(sim_stack) as client:
        created = await client.post("/v1/conversations", json={"title": "engine error"})
        conversation_id = created.json()["conversation_id"]
        result = await post_message(client, conversation_id, {"content": "[[sim:fail]]"})
    assert result.status == 200
    [error] = result.of("error")
    assert_generic(error.json())


async def test_openai_api_answers_the_code_only(sim_stack):
    body = {
        "model": sim_stack.settings.inference.model_name,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "[[sim:fail]]"}],
    }
    async with client_for(sim_stack) as client:
        plain = await client.post("/v1/chat/completions", json=body)
        async with client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}
        ) as response:
            streamed = (await response.aread()).decode()
    assert plain.status_code == 500, plain.text
    assert_generic(plain.json()["error"])
    assert ENGINE_ERROR_MESSAGE in streamed and ENGINE_ERROR in streamed, streamed
    assert not [leak for leak in LEAKS if leak in streamed], streamed
