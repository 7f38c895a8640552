"""A pipeline of processes for the fault tests and `python -m bench faults`: every stage is
its own process (`python -m chatpipe.cli
<stage>`) on one embedded broker, so a test can SIGKILL, signal and restart any of
them by name, as a crash or a deployment would.

    async with running_pipeline(tmp_path, worker_lost_after_s=2) as pipe:
        await pipe.start("scheduler")
        await pipe.start("w1", "worker")
        await pipe.start("gateway")
        await pipe.wait_for_workers("w1")
        await pipe.wait_for_gateway()
        pipe.kill("scheduler")
        await pipe.restart("scheduler")

Any stage of `chatpipe.cli` runs this way, the tools stage (`chat.tools`) included:
`await pipe.start("tools")`; a pipeline starts only the stages its test asks for.

Settings given to `running_pipeline` apply to every stage, those given to `start` to
that stage (as `CHATPIPE_<NAME>` variables). Each stage writes its log to
`<tmp_path>/<name>.log`; when the block fails, the tail of every log is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.broker_link import BrokerLink
from bench.topic_log import find_events
from bus.broker import EmbeddedBroker, free_port
from bus.clients import KafkaConfig, Publisher
from bus.topics import TopicLayout, ensure_topics
from chatpipe.tiny_model import TINY_MODEL_DIR
from schemas import topics
from schemas.events import Event, WorkerHeartbeat

API_KEY = "faults-dev-key"
KEY_SECRET = "faults-key-secret"
"""CHATPIPE_KEY_SECRET of every stage: a gateway run alone refuses to start without one."""
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    name: str
    stage: str
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = field(default=0.0)
    """Wall-clock time of the last (re)start."""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Pipeline:
    """Stage processes by name on one broker; see the module docstring."""

    def __init__(self, tmp_path: Path, broker: EmbeddedBroker, settings: dict[str, object],
                 link: BrokerLink | None = None):  # fmt: skip
        self.tmp_path = tmp_path
        self.broker = broker
        self.link = link
        """The proxy every stage reaches the broker through, if any."""
        self.kafka = KafkaConfig(broker.bootstrap_servers)
        self.settings = settings
        self.stages: dict[str, Stage] = {}
        self._publisher: Publisher | None = None

    def env(self, **settings: object) -> dict[str, str]:
        values: dict[str, object] = {
            "engine": "sim",
            "model": TINY_MODEL_DIR,
            "dev_api_key": API_KEY,
            "key_secret": KEY_SECRET,
            "database_path": self.tmp_path / "chatpipe.db",
            "auto_titles": False,
            "heartbeat_interval_s": 0.5,
            "worker_lost_after_s": 3.0,
            # Tests and scenarios load the pipeline from one key; the limit has its own tests.
            "max_concurrent_requests": {},
            **self.settings,
            **settings,
        }
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap_servers}
        env.update(
            {f"CHATPIPE_{name.upper()}": _env_value(value) for name, value in values.items()}
        )
        return env

    async def start(self, name: str, stage: str | None = None, **settings: object) -> Stage:
        """Start stage `stage` (default: `name`) as process `name`. A worker takes `name`
        as its worker id, a gateway as its gateway id (on a free port)."""
        stage = stage or name
        if stage == "worker":
            settings.setdefault("worker_id", name)
        if stage == "gateway":
            settings.setdefault("gateway_id", name)
            settings.setdefault("port", free_port())
        entry = Stage(name, stage, self.env(**settings), self.tmp_path / f"{name}.log")
        self.stages[name] = entry
        self._spawn(entry)
        return entry

    def _spawn(self, entry: Stage) -> None:
        with entry.log.open("ab") as log:
            log.write(f"--- start {entry.stage} at {time.time():.3f}\n".encode())
            log.flush()
            entry.started_at = time.time()
            entry.process = subprocess.Popen(
                [sys.executable, "-m", "chatpipe.cli", entry.stage],
                env=entry.env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, name: str) -> None:
        """SIGKILL the stage's whole process group, as a crash would."""
        self.signal(name, signal.SIGKILL)
        process = self.stages[name].process
        assert process is not None
        process.wait()

    def signal(self, name: str, signum: int = signal.SIGTERM) -> None:
        process = self.stages[name].process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)

    async def exited(self, name: str, timeout_s: float = 30.0) -> int:
        """Wait for the stage's process to end; its exit code."""
        process = self.stages[name].process
        assert process is not None
        deadline = time.monotonic() + timeout_s
        while process.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still runs after {timeout_s}s")
            await asyncio.sleep(0.1)
        return process.returncode

    async def restart(self, name: str) -> Stage:
        """SIGKILL the stage if it runs, then start it again with the same settings."""
        entry = self.stages[name]
        if entry.running:
            self.kill(name)
        self._spawn(entry)
        return entry

    # --- readiness --------------------------------------------------------------------

    async def wait_for_gateway(self, name: str = "gateway", timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.base_url(name), timeout=2) as client:
            while True:
                self._check_running(name)
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/healthz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not healthy after {timeout_s}s")
                await asyncio.sleep(0.2)

    async def wait_for_workers(self, *names: str, timeout_s: float = 60.0) -> None:
        """Until each worker has announced chat.work partitions since its last start."""
        pending = set(names)

        def ready(heartbeat: WorkerHeartbeat) -> bool:
            entry = self.stages[heartbeat.worker_id] if heartbeat.worker_id in pending else None
            if entry is None or not heartbeat.partitions or heartbeat.sent_at < entry.started_at:
                return False
            pending.discard(heartbeat.worker_id)
            return True

        await self.find(
            topics.WORKERS, WorkerHeartbeat, ready, count=len(names), timeout_s=timeout_s
        )
        if pending:
            raise TimeoutError(f"workers not ready after {timeout_s}s: {sorted(pending)}")

    def _check_running(self, name: str) -> None:
        entry = self.stages[name]
        if not entry.running:
            raise RuntimeError(f"{name} exited:\n{self.log_tail(name)}")

    # --- talking to the pipeline ------------------------------------------------------

    def base_url(self, name: str = "gateway") -> str:
        return f"http://127.0.0.1:{self.stages[name].env['CHATPIPE_PORT']}"

    def http(self, name: str = "gateway", api_key: str = API_KEY) -> httpx.AsyncClient:
        """A client of the gateway `name` (close it, or use it in `async with`)."""
        return httpx.AsyncClient(
            base_url=self.base_url(name), timeout=60, headers={"Authorization": f"Bearer {api_key}"}
        )

    async def send(self, topic: str, event: Event, key: str | None = None) -> None:
        """Put `event` on the bus as a stage would (acknowledged when this returns)."""
        if self._publisher is None:
            producer = self.kafka.producer()
            await producer.start()
            self._publisher = Publisher(producer)
        await self._publisher.send_and_wait(topic, event, key=key)

    async def find(
        self,
        topic: str,
        kind: Any,
        match: Callable[[Any], bool],
        count: int = 1,
        timeout_s: float = 30.0,
    ) -> list[Any]:
        """Events of `topic` (from its start) that `match`, up to `count` (`find_events`)."""
        return await find_events(self.kafka, topic, kind, match, count, timeout_s)

    def log_tail(self, name: str, lines: int = 40) -> str:
        log = self.stages[name].log
        text = log.read_text(errors="replace") if log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def print_logs(self) -> None:
        for name in self.stages:
            print(
                f"===== {name} (last lines of {self.stages[name].log}) =====\n"
                f"{self.log_tail(name)}",
                flush=True,
            )

    async def close(self) -> None:
        for name, entry in self.stages.items():
            if entry.running:
                self.kill(name)
        if self._publisher is not None:
            await self._publisher.producer.stop()


def prints_logs_on_failure(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """For a test taking a `pipeline` fixture: when it fails, print each stage's log tail."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        try:
            await test(*args, **kwargs)
        except BaseException:
            kwargs["pipeline"].print_logs()
            raise

    return run


@contextlib.asynccontextmanager
async def running_pipeline(tmp_path: Path, **settings: object) -> AsyncIterator[Pipeline]:
    """A fresh broker with every topic created; stages are started by the test."""
    async with _pipeline(tmp_path, None, settings) as pipe:
        yield pipe


@contextlib.asynccontextmanager
async def linked_pipeline(
    tmp_path: Path, link: BrokerLink, **settings: object
) -> AsyncIterator[Pipeline]:
    """`running_pipeline` whose stages reach the broker through `link` (to cut)."""
    async with _pipeline(tmp_path, link, settings) as pipe:
        yield pipe


@contextlib.asynccontextmanager
async def _pipeline(
    tmp_path: Path, link: BrokerLink | None, settings: dict[str, object]
) -> AsyncIterator[Pipeline]:
    broker = EmbeddedBroker(port=link.broker_port, advertised_port=link.port) if link \
        else EmbeddedBroker()  # fmt: skip
    async with broker:
        shards = settings.get("scheduler_shards") or {}  # each its own chat.work.<shard>
        assert isinstance(shards, dict)
        sizes: dict[str, Any] = {
            k: v for k, v in settings.items() if k in ("topic_partitions", "work_partitions")
        }
        layout = TopicLayout(**sizes, shards=tuple(shards))
        await ensure_topics(broker.bootstrap_servers, layout)
        pipeline = Pipeline(tmp_path, broker, settings, link)
        try:
            yield pipeline
        except BaseException:
            pipeline.print_logs()
            raise
        finally:
            await pipeline.close()


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list | tuple):
        return orjson.dumps(value).decode()
    return str(value)
