"""The network between the stages and their broker, to cut: a TCP proxy every client
reaches the broker through (the broker advertises the proxy's port). `cut()` closes
every connection and refuses new ones until `restore()`: to the clients, as a broker
restart or a leader moving away looks, while the broker keeps every record."""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from bus.broker import free_port

CHUNK = 65536


class BrokerLink:
    """Forwards 127.0.0.1:`port` to the broker at 127.0.0.1:`broker_port` (a free port
    unless told: start the broker there, advertising `port`)."""

    def __init__(self, broker_port: int | None = None) -> None:
        self.port = free_port()
        self.broker_port = broker_port or free_port()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.up = True
        self.cuts = 0

    async def __aenter__(self) -> BrokerLink:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        self._drop_all()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    def cut(self) -> None:
        """Close every connection, and every new one at once, until `restore`."""
        self.up = False
        self.cuts += 1
        self._drop_all()

    def restore(self) -> None:
        self.up = True

    def _drop_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.transport.abort()
            return
        link = asyncio.create_task(self._link(reader, writer))
        self._links.add(link)
        link.add_done_callback(self._links.discard)

    async def _link(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
                    ) -> None:  # fmt: skip
        try:
            broker_in, broker_out = await asyncio.open_connection("127.0.0.1", self.broker_port)
        except OSError:
            client_out.transport.abort()
            return
        self._writers |= {client_out, broker_out}
        try:
            await asyncio.gather(_pump(client_in, broker_out), _pump(broker_in, client_out))
        finally:
            for writer in (client_out, broker_out):
                self._writers.discard(writer)
                writer.transport.abort()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await source.read(CHUNK):
            sink.write(chunk)
            await sink.drain()
    sink.transport.abort()
