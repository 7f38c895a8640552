"""Connections dropped mid-answer, for the clients' reconnect tests: a TCP proxy in front
of a gateway that breaks the first answer stream off, and a stack that waits for the
client to come back."""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import replace
from types import TracebackType
from urllib.parse import urlsplit

import pytest

from chatpipe.settings import SETTINGS
from chatpipe.wiring import Stack

ANSWER_REQUEST = re.compile(rb"POST /v1/conversations/[^/ ]+/messages HTTP/1\.1\r\n")
DELTA = b"event: delta"


class CuttingProxy:
    """Forwards `http://127.0.0.1:<port>` (`url`) to `target_url`. The first response
    to `POST /v1/conversations/{id}/messages` is cut in the middle of its `deltas`-th
    delta event (after its `event:` line, before its data), and both sides of that
    connection are closed; every other byte passes through. `cut` is set then."""

    def __init__(self, target_url: str, deltas: int = 5) -> None:
        target = urlsplit(target_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 80)
        self._deltas = deltas
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self.cut = asyncio.Event()
        self.url = ""

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)
        await self._server.wait_closed()

    def _accept(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        link = asyncio.create_task(self._link(client_reader, client_writer))
        self._links.add(link)
        link.add_done_callback(self._links.discard)

    async def _link(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        writers = [client_writer]
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
            writers.append(server_writer)
            answering = asyncio.Event()  # this connection carries an answer stream now
            requests = asyncio.create_task(self._requests(client_reader, server_writer, answering))
            responses = asyncio.create_task(
                self._responses(server_reader, client_writer, answering)
            )
            await asyncio.wait([requests, responses], return_when=asyncio.FIRST_COMPLETED)
            for task in (requests, responses):
                task.cancel()
        except OSError:
            pass
        finally:
            for writer in writers:
                writer.close()

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answering: asyncio.Event
    ) -> None:
        while data := await reader.read(65536):
            if not self.cut.is_set() and ANSWER_REQUEST.search(data):
                answering.set()
            writer.write(data)
            await writer.drain()

    async def _responses(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answering: asyncio.Event
    ) -> None:
        seen = b""  # the answer stream so far, where the cut is looked for
        while data := await reader.read(65536):
            if answering.is_set() and not self.cut.is_set():
                seen += data
                end = _cut_point(seen, self._deltas)
                if end is not None:
                    writer.write(data[: len(data) - (len(seen) - end)])
                    with contextlib.suppress(ConnectionError):
                        await writer.drain()
                    self.cut.set()
                    return
            writer.write(data)
            await writer.drain()


def _cut_point(stream: bytes, deltas: int) -> int | None:
    """Where the `deltas`-th delta event's `event:` line ends, if it has come."""
    at = -1
    for _ in range(deltas):
        at = stream.find(DELTA, at + 1)
        if at < 0:
            return None
    return at + len(DELTA)


def hold_dropped_answers(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """For this test, the running `stack` holds a dropped answer for the default resume
    grace (15 s): the test stacks' is short, so that a dropped stream frees its slot soon."""
    default = SETTINGS["resume_grace_s"].default
    deps = stack.gateway.state.deps
    held = replace(deps, config=replace(deps.config, resume_grace_s=default))
    # Starlette's State keeps attributes in `_state`: setattr's undo would delete them.
    monkeypatch.setitem(stack.gateway.state._state, "deps", held)
