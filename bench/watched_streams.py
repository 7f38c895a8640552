"""A chat client for fault tests: it reads a native answer stream as a user's browser
would, resumes it with `Last-Event-ID` (on the same or another gateway) when the
connection breaks, and measures what the user saw against what should have come.

Each answer is judged against the sim engine's plan for its request (a pure function
of the request: what an uninterrupted run streams): tokens missing, tokens repeated,
whether it ended, and the longest pause between two pieces of it.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from schemas.sse import aiter_messages


class Interrupted(Exception):
    """The gateway closed the stream before the answer's end (it is stopping)."""


BROKEN = (httpx.TransportError, httpx.RemoteProtocolError, Interrupted)
_TOKEN = re.compile(r" ?\S+")


@dataclass
class Watched:
    """One answer as the client saw it, across every connection it took."""

    conversation_id: str = ""
    ids: dict[str, str] = field(default_factory=dict)
    deltas: list[tuple[int, str, float]] = field(default_factory=list)
    """(id, text, arrival time) of each delta."""
    end: dict[str, Any] | None = None
    end_event: str | None = None
    connections: int = 0
    started_at: float = 0.0
    ended_at: float | None = None
    last_id: int | None = None

    @property
    def request_id(self) -> str:
        return self.ids["request_id"]

    @property
    def text(self) -> str:
        return "".join(text for _, text, _ in self.deltas)

    @property
    def finished(self) -> bool:
        """It ended with `done` and the answer's own end (not cut short)."""
        return (
            self.end_event == "done"
            and self.end is not None
            and self.end["status"] in ("finished_stopped", "finished_length")
        )

    def max_stall_s(self) -> float:
        """The longest wait for the next piece: from the request to the first delta,
        between deltas, and from the last delta to the end."""
        times = [self.started_at, *(at for _, _, at in self.deltas)]
        if self.ended_at is not None:
            times.append(self.ended_at)
        return max((b - a for a, b in pairwise(times)), default=0.0)


def token_diff(expected: str, got: str) -> tuple[int, int]:
    """(tokens missing, tokens repeated or wrong) in `got` compared with `expected`."""
    a, b = _TOKEN.findall(expected), _TOKEN.findall(got)
    missing = extra = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            missing += i2 - i1
        if tag in ("insert", "replace"):
            extra += j2 - j1
    return missing, extra


async def watch(
    clients: Sequence[httpx.AsyncClient],
    conversation_id: str,
    body: dict[str, Any],
    *,
    seen: Watched | None = None,
    first_delta: asyncio.Event | None = None,
    give_up_s: float = 60.0,
) -> Watched:
    """POST a message on `clients[0]` and read the answer to its end (into `seen`, which
    the caller may look at meanwhile). When the connection breaks, resume on the next
    client in turn (`Last-Event-ID`), retrying until `give_up_s`."""
    seen = seen or Watched()
    seen.conversation_id = conversation_id
    seen.started_at = seen.started_at or time.monotonic()
    path = f"/v1/conversations/{conversation_id}/messages"
    deadline = time.monotonic() + give_up_s
    turn = 0
    while seen.end_event is None and time.monotonic() < deadline:
        client = clients[turn % len(clients)]
        turn += 1
        try:
            if not seen.ids:
                request = client.build_request("POST", path, json=body)
            else:
                headers = {} if seen.last_id is None else {"Last-Event-ID": str(seen.last_id)}
                request = client.build_request(
                    "GET", f"/v1/requests/{seen.request_id}/events", headers=headers
                )
            await _read(client, request, seen, first_delta)
        except BROKEN:
            if not seen.ids:
                raise  # never got the request id: nothing to resume
            await asyncio.sleep(0.2)
    return seen


async def _read(
    client: httpx.AsyncClient,
    request: httpx.Request,
    seen: Watched,
    first_delta: asyncio.Event | None,
) -> None:
    response = await client.send(request, stream=True)
    try:
        if response.status_code != 200:
            raise AssertionError(f"{response.status_code}: {(await response.aread())!r}")
        seen.connections += 1
        async for message in aiter_messages(response.aiter_lines()):
            if message.is_done:
                return
            if message.event == "request":
                seen.ids = message.json()
                continue
            if message.id is not None:
                seen.last_id = int(message.id)
            if message.event == "delta":
                seen.deltas.append((int(message.id or -1), message.json()["delta"], message.at))
                if first_delta is not None:
                    first_delta.set()
            elif message.event in ("done", "error"):
                end = message.json()
                if end.get("code") == "stream_interrupted":
                    raise Interrupted("the gateway's stream ended early")  # resumable
                seen.end_event, seen.end = message.event, end
                seen.ended_at = message.at
    finally:
        await response.aclose()


@dataclass
class Reading:
    """One answer read in the background; `seen` fills as it arrives."""

    seen: Watched
    task: asyncio.Task[Watched]

    async def result(self, timeout_s: float = 60.0) -> Watched:
        return await asyncio.wait_for(self.task, timeout_s)

    async def drop(self) -> Watched:
        """The client goes away (its connection closes), as a phone losing its network."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        return self.seen


async def reading(
    clients: Sequence[httpx.AsyncClient],
    conversation_id: str,
    body: dict[str, Any],
    seen: Watched | None = None,
) -> Reading:
    """Start reading an answer in the background (resuming `seen`, if given); returns
    once a piece is in."""
    seen, first = seen or Watched(), asyncio.Event()
    task = asyncio.create_task(watch(clients, conversation_id, body, seen=seen, first_delta=first))
    waiter = asyncio.create_task(first.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()  # it failed (or ended) before its first piece: say so
    return Reading(seen, task)
