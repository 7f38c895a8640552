"""A generation's place among its API key's concurrent requests: its `Lease`, from its
admission to its end, released exactly once.

Admission takes an ask's leases (`Leases`, one per generation it runs: a completion's
`n` choices take `n`) and each generation claims one as it starts
(`gateway.streaming.generation.Generation`). A lease is released:

* when its generation's stream ends (done or error, a cancel's end included), before
  the end is shown, so a client that reads the end can start the next request;
* when its stream is closed: the client went away, the stream stalled, the gateway
  stops; a native stream held for a resume is closed when the hold ends
  (`Pipeline.hold`), its lease with it;
* when the request that took it ends without having started it (refused after
  admission, the pipeline down): `ReleasesLeases`, the ASGI middleware, releases
  every lease the request took and no generation claimed.

Each lease is also renewed while its stream shows signs of life (`LeasedStream`: every
read of it), and expires in storage otherwise (`gateway.admission.concurrency`), so
a gateway that dies or a stream that is never closed leaks nothing for long.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.pipeline import RequestStream
from schemas.events import Event

_RELEASING: set[asyncio.Task[None]] = set()
"""Releases under way apart from the task that asked (a task needs a strong reference)."""


class Lease:
    """One generation's place: `lease_id` among the leases of `key`. `free` drops it
    from storage; `release` calls it once, whatever happens to the caller meanwhile."""

    __slots__ = ("_free", "active", "claimed", "key", "lease_id", "released")

    def __init__(
        self, key: str, lease_id: str, free: Callable[[Lease], Coroutine[Any, Any, None]]
    ) -> None:
        self.key = key
        self.lease_id = lease_id
        self._free = free
        self.active = True
        """Its stream was read since the lease was last renewed."""
        self.claimed = False
        """A generation holds it (before that, its request does)."""
        self.released = False

    def touch(self) -> None:
        self.active = True

    async def release(self) -> None:
        """Give the place back, once. The storage's answer is awaited in a task of its
        own: a cancel of the caller (a client gone) must not leave it half done."""
        if self.released:
            return
        self.released = True
        freeing = asyncio.create_task(self._free(self), name=f"release:{self.lease_id}")
        _RELEASING.add(freeing)
        freeing.add_done_callback(_RELEASING.discard)
        await asyncio.shield(freeing)


class Leases:
    """The leases one admitted request holds, until each is claimed or released."""

    __slots__ = ("_leases",)

    def __init__(self, leases: Sequence[Lease] = ()) -> None:
        self._leases = list(leases)

    def add(self, leases: Sequence[Lease]) -> None:
        self._leases.extend(leases)

    def claim(self) -> Lease | None:
        """A lease for one generation of the request; None when it holds none left (no
        limit, or the storage was unreachable)."""
        for lease in self._leases:
            if not lease.claimed and not lease.released:
                lease.claimed = True
                return lease
        return None

    async def release_unclaimed(self) -> None:
        for lease in list(self._leases):
            if not lease.claimed:
                await lease.release()

    async def release(self) -> None:
        for lease in list(self._leases):
            await lease.release()

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases))

    def __len__(self) -> int:
        return len(self._leases)


class LeasedStream:
    """A generation's `RequestStream` that holds its lease: each read renews it, and
    closing the stream releases it."""

    def __init__(self, stream: RequestStream, lease: Lease) -> None:
        self._stream = stream
        self.lease = lease

    async def __aiter__(self) -> AsyncIterator[Event]:
        self.lease.touch()
        async for event in self._stream:
            self.lease.touch()
            yield event

    async def take(self) -> Sequence[Event]:
        self.lease.touch()
        try:
            return await self._stream.take()
        finally:
            self.lease.touch()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            await self.lease.release()


_request_leases: ContextVar[Leases | None] = ContextVar("request_leases", default=None)


def hold_until_request_ends(leases: Leases) -> None:
    """`leases` were taken for the current request: those no generation claims are
    released when it ends (needs `ReleasesLeases`)."""
    held = _request_leases.get()
    if held is not None:
        held.add(list(leases))


class ReleasesLeases:
    """ASGI middleware: once a request has been answered (its stream included), release
    the leases it took that no generation claimed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held = Leases()
        token = _request_leases.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            _request_leases.reset(token)
            await held.release_unclaimed()
