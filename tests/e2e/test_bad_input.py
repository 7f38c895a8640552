"""Bad input gets a clear 4xx JSON error; malformed events go to chat.dlq and
every stage keeps running. Runs on the sim engine through the real broker."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from bench.topic_log import find_events
from chatpipe.dev_stack import API_KEY
from schemas import topics
from schemas.events import DeadLetter
from tests.support.chat import post_message
from tests.support.stack import client_for


def _assert_error(response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code


async def test_auth_errors(sim_stack):
    async with client_for(sim_stack, api_key=None) as client:
        _assert_error(await client.post("/v1/conversations", json={}), 401)
    async with client_for(sim_stack, api_key="not-a-key") as client:
        _assert_error(await client.post("/v1/conversations", json={}), 401)
        _assert_error(await client.post("/v1/chat/completions", json={}), 401)


async def test_request_errors(sim_stack):
    async with client_for(sim_stack) as client:
        conversation_id = (await client.post("/v1/conversations", json={})).json()[
            "conversation_id"
        ]
        url = f"/v1/conversations/{conversation_id}/messages"

        _assert_error(
            await client.post(
                url, content=b"{not json", headers={"content-type": "application/json"}
            ),
            400,
        )
        _assert_error(
            await client.post(f"/v1/conversations/{uuid.uuid4()}/messages", json={"content": "hi"}),
            404,
        )
        _assert_error(
            await client.post(url, json={"content": "hi", "model": "no-such"}),
            404,
            "model_not_found",
        )
        empty = await client.post(url, json={"content": ""})
        assert 400 <= empty.status_code < 500 and "error" in empty.json()
        big = "x" * (sim_stack.settings.gateway.max_message_chars + 1)
        _assert_error(await client.post(url, json={"content": big}), 413)
        _assert_error(
            await client.post(
                "/v1/chat/completions",
                json={"model": "no-such", "messages": [{"role": "user", "content": "hi"}]},
            ),
            404,
        )
        bad_completion = await client.post("/v1/chat/completions", json={"messages": "nope"})
        assert 400 <= bad_completion.status_code < 500 and "error" in bad_completion.json()


@pytest.mark.parametrize(
    "topic",
    [
        topics.requests_topic("free"),
        topics.WORK,
        topics.TOKENS,
        topics.CONTROL,
        topics.WORKERS,
        topics.TOOLS,
    ],
)
async def test_malformed_event_is_dead_lettered_and_stage_keeps_going(sim_stack, topic):
    marker = f"garbage-{uuid.uuid4()}"
    producer = AIOKafkaProducer(bootstrap_servers=sim_stack.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"{" + marker.encode(), key=b"bad", partition=0)
    finally:
        await producer.stop()

    letters = await find_events(
        sim_stack.kafka, topics.DLQ, DeadLetter, lambda d: marker in d.value, count=1, timeout_s=20
    )
    assert letters, f"nothing on chat.dlq for {topic}"
    assert letters[0].topic == topic and letters[0].error

    async with client_for(sim_stack) as client:
        conversation_id = (await client.post("/v1/conversations", json={})).json()[
            "conversation_id"
        ]
        result = await post_message(
            client, conversation_id, {"content": "still there?", "max_tokens": 5}
        )
    assert result.ended_with_done and result.text


async def _no_messages(client, conversation_id: str) -> None:
    detail = (await client.get(f"/v1/conversations/{conversation_id}")).json()
    assert detail["messages"] == [], detail


@pytest.mark.parametrize(
    "body",
    [
        b'{"content": "hi", "seed": 18446744073709551616}',
        b'{"content": "hi", "seed": -1}',
        b'{"content": "a lone \\ud800 surrogate"}',
    ],
)
async def test_values_the_bus_cannot_carry_are_422_before_anything_is_stored(sim_stack, body):
    """The fuzzer's one server error: a seed over 2^64 or a lone surrogate was a 503
    after the user message was stored and the rate limit charged."""
    async with client_for(sim_stack) as client:
        conversation_id = (await client.post("/v1/conversations", json={})).json()[
            "conversation_id"
        ]
        before = await client.post(
            "/v1/chat/completions",
            json={
                "model": sim_stack.settings.inference.model_name,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "count me"}],
            },
        )
        remaining = int(before.headers["x-ratelimit-remaining-requests"])
        response = await client.post(
            f"/v1/conversations/{conversation_id}/messages",
            content=body,
            headers={"content-type": "application/json"},
        )
        _assert_error(response, 422, "invalid_request")
        completion = body.replace(
            b'{"content": "hi",', b'{"messages": [{"role": "user", "content": "hi"}], "model": "m",'
        )
        if b"seed" in body:
            _assert_error(
                await client.post(
                    "/v1/chat/completions",
                    content=completion,
                    headers={"content-type": "application/json"},
                ),
                422,
                "invalid_request",
            )
        await _no_messages(client, conversation_id)
        after = await client.post(
            "/v1/chat/completions",
            json={
                "model": sim_stack.settings.inference.model_name,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "count me"}],
            },
        )
        # Only the two counted completions were charged (the window may have slid).
        assert int(after.headers["x-ratelimit-remaining-requests"]) >= remaining - 1


def _nested_schema(levels: int) -> dict:
    schema: dict = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _mistakes(model: str, conversation_id: str) -> list[tuple[str, str, str, int, str]]:
    """(route, body as JSON text, the field at fault, status, code): each a client's
    mistake that once was a 500 (or, for 1e400, a 200), with the connection dropped."""
    chat_url, text_url = "/v1/chat/completions", "/v1/completions"
    turn_url = f"/v1/conversations/{conversation_id}/messages"
    bases = {
        chat_url: {
            "model": model,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        },
        text_url: {"model": model, "max_tokens": 2, "prompt": "hi"},
        "/v1/embeddings": {"model": model, "input": "hi"},
        "/v1/responses": {"model": model, "input": "hi"},
        turn_url: {"content": "hi"},
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": _nested_schema(120)}}
    schema = {"name": "x", "schema": _nested_schema(120)}
    fields: list[tuple[str, dict, str, int, str]] = [
        (chat_url, {"top_k": 10**30}, "top_k", 422, "invalid_request"),
        (chat_url, {"logit_bias": {str(10**30): 1}}, "logit_bias", 422, "invalid_request"),
        (text_url, {"logit_bias": {str(10**30): 1}}, "logit_bias", 422, "invalid_request"),
        (text_url, {"top_k": 10**30}, "top_k", 422, "invalid_request"),
        (chat_url, {"seed": 2**64}, "seed", 422, "invalid_request"),
        (chat_url, {"tools": [tool]}, "tools.0.function.parameters", 400, "invalid_tools"),
        (chat_url, {"response_format": {"type": "json_schema", "json_schema": schema}},
         "response_format.json_schema.schema", 400, "invalid_response_format"),
        ("/v1/embeddings", {"dimensions": 10**30}, "dimensions", 422, "invalid_request"),
        ("/v1/responses", {"max_output_tokens": 10**30}, "max_output_tokens", 422,
         "max_tokens_too_large"),
        (turn_url, {"seed": 10**30}, "seed", 422, "invalid_request"),
    ]  # fmt: skip
    numbers = [
        (chat_url, "repetition_penalty", "1e400"),
        (chat_url, "temperature", "NaN"),
        (text_url, "presence_penalty", "-Infinity"),
    ]
    nested = "[" * 10_000 + "]" * 10_000
    deep = json.dumps(bases[chat_url]).replace('"hi"', nested)
    return [
        *((url, json.dumps({**bases[url], **more}), field, status, code)
          for url, more, field, status, code in fields),
        *((url, json.dumps(bases[url])[:-1] + f', "{name}": {number}}}', name, 422,
           "invalid_request") for url, name, number in numbers),
        (chat_url, deep, "", 400, "invalid_json"),
    ]  # fmt: skip


async def test_a_clients_mistake_is_a_4xx_naming_the_field_and_the_connection_stays_open(
    sim_stack,
):
    """Every mistake over one keep-alive connection: each answered with its 4xx naming the
    field, and the connection answers the next request (a 500 would have closed it)."""
    model = sim_stack.settings.inference.model_name
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with client_for(sim_stack) as setup:
        cid = (await setup.post("/v1/conversations", json={})).json()["conversation_id"]
    async with httpx.AsyncClient(
        base_url=sim_stack.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=120, limits=one,
    ) as client:  # fmt: skip
        connections = set()
        for url, body, field, status, code in _mistakes(model, cid):
            response = await client.post(
                url, content=body.encode(), headers={"content-type": "application/json"}
            )
            assert response.status_code == status, (url, field, response.text[:500])
            error = response.json()["error"]
            assert error["code"] == code and error["message"], (url, field, error)
            if field:
                assert (error["param"] or "").startswith(field), (url, field, error)
            assert response.headers.get("connection") != "close", (url, field)
            connections.add(_local_address(response))
            after = await client.get("/v1/models")
            assert after.status_code == 200, (url, field, after.text)
            connections.add(_local_address(after))
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": model, "max_tokens": 3,
                  "messages": [{"role": "user", "content": "still there?"}]},
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        connections.add(_local_address(answer))
    assert len(connections) == 1, f"the gateway dropped the connection: {connections}"
    async with client_for(sim_stack) as client:
        await _no_messages(client, cid)


def _local_address(response: httpx.Response) -> tuple[str, int]:
    """The client's end of the connection the response came on."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


async def test_a_10mb_body_without_a_key_is_413(sim_stack):
    async with client_for(sim_stack, api_key=None) as client:
        try:
            response = await client.post(
                "/v1/chat/completions",
                content=b"x" * (10 << 20),
                headers={"content-type": "application/json"},
            )
        except httpx.TransportError:
            pytest.fail("the gateway closed the connection without its 413")
    _assert_error(response, 413, "body_too_large")


@pytest.mark.vllm
async def test_a_prompt_over_the_window_is_413_on_both_apis_with_the_real_engine(vllm_stack):
    """Not the engine's error as a 500: the gateway counts the prompt with the model's
    tokenizer and refuses it first."""
    window = vllm_stack.settings.inference.context_length()
    long = "lorem ipsum " * (window // 2)  # two or more tokens a repetition
    async with client_for(vllm_stack) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": vllm_stack.settings.inference.model_name,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": long}],
            },
        )
        _assert_error(response, 413, "context_too_long")
        conversation_id = (await client.post("/v1/conversations", json={})).json()[
            "conversation_id"
        ]
        response = await client.post(
            f"/v1/conversations/{conversation_id}/messages",
            json={"content": long[:30_000], "max_tokens": 4},
        )
        _assert_error(response, 413, "context_too_long")
        await _no_messages(client, conversation_id)
