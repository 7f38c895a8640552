"""Clients that try to hold or fill the gateway: slow headers, idle connections,
endless headers, half a body, bodies far over the limit. Raw sockets against a live
stack (sim engine, real broker, real HTTP) with short limits; each is cut off in
time with its status, and the gateway keeps answering everyone else."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from chatpipe.dev_stack import API_KEY, running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from tests.support.stack import client_for

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
MAX_BODY = 64 << 10
SLACK_S = 2.0
"""A cut-off may come this late on a busy two-core machine."""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def guarded_stack(tiny_model_dir, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp_path_factory.mktemp("guarded-stack"),
        engine="sim",
        model=tiny_model_dir,
        sim_tokens_per_s=50.0,
        max_slots=4,
        auto_titles=False,
        header_read_timeout_s=HEADER_TIMEOUT_S,
        body_read_timeout_s=BODY_TIMEOUT_S,
        max_body_bytes=MAX_BODY,
    )
    async with running_sim_stack(settings) as stack:
        yield stack


async def _connect(stack: Stack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(stack.settings.gateway.host, stack.settings.gateway.port)


async def _response(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int | None, bytes]:
    """Everything until the server closes: (status or None if it sent none, body)."""
    raw = await asyncio.wait_for(reader.read(-1), timeout_s)
    if not raw:
        return None, b""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _still_serves(stack: Stack) -> None:
    async with client_for(stack) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": stack.settings.inference.model_name,
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "still there?"}],
            },
        )
    assert response.status_code == 200, response.text


async def _trickle(writer: asyncio.StreamWriter, pieces: AsyncIterator[bytes]) -> None:
    """Write until the server closes the connection."""
    try:
        async for piece in pieces:
            writer.write(piece)
            await writer.drain()
    except (ConnectionError, OSError):
        pass


async def test_a_slowloris_client_is_cut_after_the_header_timeout(guarded_stack):
    reader, writer = await _connect(guarded_stack)
    started = time.monotonic()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n")

    async def header_bytes() -> AsyncIterator[bytes]:
        for i in range(200):  # one header line every 0.1 s, never the blank line
            await asyncio.sleep(0.1)
            yield f"X-Slow-{i}: a\r\n".encode()

    trickling = asyncio.create_task(_trickle(writer, header_bytes()))
    try:
        status, _ = await _response(reader, HEADER_TIMEOUT_S + SLACK_S)
    finally:
        trickling.cancel()
        writer.close()
    assert status == 408
    assert time.monotonic() - started < HEADER_TIMEOUT_S + SLACK_S
    await _still_serves(guarded_stack)


async def test_a_connection_that_sends_nothing_is_closed(guarded_stack):
    reader, writer = await _connect(guarded_stack)
    try:
        status, _ = await _response(reader, HEADER_TIMEOUT_S + SLACK_S)
    finally:
        writer.close()
    assert status == 408


async def test_headers_that_never_end_are_431(guarded_stack):
    reader, writer = await _connect(guarded_stack)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")

    async def flood() -> AsyncIterator[bytes]:
        for i in range(100):  # 100 KiB of headers, fast
            yield f"X-Flood-{i}: {'a' * 1000}\r\n".encode()

    await _trickle(writer, flood())
    try:
        status, _ = await _response(reader, SLACK_S)
    finally:
        writer.close()
    assert status == 431


async def test_a_body_that_stops_halfway_is_408(guarded_stack):
    reader, writer = await _connect(guarded_stack)
    started = time.monotonic()
    writer.write(
        _head(
            "POST /v1/chat/completions HTTP/1.1",
            "Host: gateway",
            f"Authorization: Bearer {API_KEY}",
            "Content-Type: application/json",
            "Content-Length: 1000",
        )
    )
    writer.write(b'{"model": "tiny-random", "messages": [')  # and nothing more
    try:
        status, body = await _response(reader, BODY_TIMEOUT_S + SLACK_S)
    finally:
        writer.close()
    assert status == 408
    assert json.loads(body)["error"]["code"] == "body_timeout"
    assert time.monotonic() - started < BODY_TIMEOUT_S + SLACK_S
    await _still_serves(guarded_stack)


@pytest.mark.parametrize("authorization", [None, f"Bearer {API_KEY}", "Bearer wrong"])
async def test_a_10mb_body_is_413_before_its_key_is_checked_and_unread(
    guarded_stack, authorization
):
    reader, writer = await _connect(guarded_stack)
    lines = [
        "POST /v1/conversations HTTP/1.1",
        "Host: gateway",
        "Content-Type: application/json",
        f"Content-Length: {10 << 20}",
    ]
    if authorization:
        lines.append(f"Authorization: {authorization}")
    writer.write(_head(*lines))
    writer.write(b'{"title": "' + b"x" * 4096)
    await writer.drain()
    try:
        status, body = await _response(reader, SLACK_S)
    finally:
        writer.close()
    assert status == 413
    assert json.loads(body)["error"]["code"] == "body_too_large"


async def test_a_chunked_body_is_413_once_it_passes_the_limit(guarded_stack):
    reader, writer = await _connect(guarded_stack)
    writer.write(
        _head(
            "POST /v1/chat/completions HTTP/1.1",
            "Host: gateway",
            "Content-Type: application/json",
            "Transfer-Encoding: chunked",
        )
    )

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10 << 20 >> 14):  # 16 KiB chunks, 10 MiB if nobody stops it
            yield b"4000\r\n" + b"x" * (16 << 10) + b"\r\n"
            await asyncio.sleep(0.005)

    sending = asyncio.create_task(_trickle(writer, chunks()))
    try:
        status, body = await _response(reader, SLACK_S + 1)
    finally:
        sending.cancel()
        writer.close()
    assert status == 413
    assert json.loads(body)["error"]["code"] == "body_too_large"
    await _still_serves(guarded_stack)


async def test_keep_alive_requests_are_not_cut_by_the_header_timer(guarded_stack):
    """The timer bounds headers only: a long answer and a second request on the same
    connection after the timeout has passed both go through."""
    async with client_for(guarded_stack) as client:
        for _ in range(2):
            response = await client.get("/healthz")
            assert response.status_code == 200
            await asyncio.sleep(HEADER_TIMEOUT_S * 1.5)
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": guarded_stack.settings.inference.model_name,
                "stream": True,
                "messages": [{"role": "user", "content": "[[sim:length=80]]"}],
                "max_tokens": 80,
            },
        ) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
