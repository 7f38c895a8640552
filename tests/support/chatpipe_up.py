"""`chatpipe up` started as its own process, as a user starts it: in a fresh directory
(its own database and embedded broker), outside the test run's settings, with the URL
and key it prints."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

BIN = Path(sys.executable).parent
UP_LINE = re.compile(r"chatpipe is up: (?P<url>http://\S+?)/?\s+API key: (?P<key>\S+)")
LOG_NAME = "chatpipe-up.log"
ENV_BROKER = ("KAFKA_BOOTSTRAP_SERVERS", "CHATPIPE_KAFKA_BOOTSTRAP_SERVERS")


@dataclass(frozen=True)
class Up:
    url: str
    key: str
    cwd: Path
    pid: int
    """The `chatpipe up` process (its own process group)."""


def reader_env() -> dict[str, str]:
    """A user's environment: no chatpipe settings or broker of the test run's, and
    not the venv's commands on the PATH."""
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if Path(d) != BIN)
    env = {k: v for k, v in os.environ.items()
           if k not in ENV_BROKER and not k.startswith("CHATPIPE_")}  # fmt: skip
    return env | {"PATH": path}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_log(cwd: Path, lines: int = 150) -> None:
    """The end of a `chatpipe up`'s log, without the Kafka client's chatter."""
    log = (cwd / LOG_NAME).read_text(errors="replace").splitlines()
    kept = [line for line in log if "aiokafka" not in line and "httpx" not in line]
    print(f"--- the last {lines} lines of {cwd / LOG_NAME}:", *kept[-lines:], sep="\n")


def _log_file(cwd: Path) -> IO[bytes]:
    return (cwd / LOG_NAME).open("wb")


@contextlib.asynccontextmanager
async def chatpipe_up(cwd: Path, *args: str, env: dict[str, str] | None = None,
                      engine: str | None = "sim", start_timeout_s: float = 180,
                      ) -> AsyncIterator[Up]:  # fmt: skip
    """`chatpipe up --engine sim` (and `args`) in `cwd` until the block ends; its log
    in `cwd / LOG_NAME`. `engine=None`: the engine `make run` starts (vLLM), which
    takes minutes to compile on a slow machine's first start."""
    stderr = _log_file(cwd)
    engine_args = ["--engine", engine] if engine else []
    process = await asyncio.create_subprocess_exec(
        str(BIN / "chatpipe"), "up", *engine_args, "--port", str(free_port()), *args,
        cwd=cwd, env={**reader_env(), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=stderr, start_new_session=True,
    )  # fmt: skip
    draining: asyncio.Task[bytes] | None = None
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), start_timeout_s)
        started = UP_LINE.search(line.decode())
        assert started, f"chatpipe up printed {line!r}, not its URL and key"
        draining = asyncio.create_task(process.stdout.read())  # a full pipe would block it
        yield Up(started["url"], started["key"], cwd, process.pid)
    except BaseException:
        print_log(cwd)
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)
        if draining is not None:
            await draining
        stderr.close()
