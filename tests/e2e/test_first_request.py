"""The first-request commands of the README and the getting-started page, run as a
reader runs them: copied from the Markdown into a shell (or Python) against a real
`chatpipe up` started as its own process, with the key it prints.

Each block is taken from the page as written; only the address (`localhost:8000`) and
the key placeholder are filled in, and `<request_id>` with the id the first stream
named. A page whose commands stop working fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]
BIN = Path(sys.executable).parent
UP_LINE = re.compile(r"chatpipe is up: (?P<url>http://\S+?)/?\s+API key: (?P<key>\S+)")
ENV_BROKER = ("KAFKA_BOOTSTRAP_SERVERS", "CHATPIPE_KAFKA_BOOTSTRAP_SERVERS")


@dataclass(frozen=True)
class Up:
    url: str
    key: str
    cwd: Path


def reader_env() -> dict[str, str]:
    """A reader's environment: no chatpipe settings or broker of the test run's, and
    not the venv's commands on the PATH (the pages say how to get them)."""
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if Path(d) != BIN)
    env = {k: v for k, v in os.environ.items()
           if k not in ENV_BROKER and not k.startswith("CHATPIPE_")}  # fmt: skip
    return env | {"PATH": path}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory, tiny_model_dir) -> AsyncIterator[Up]:
    """`chatpipe up` in a fresh directory (its own database and broker), as `make run`
    starts it but with the deterministic engine: these pages are about the API."""
    cwd = tmp_path_factory.mktemp("first-request")
    process = await asyncio.create_subprocess_exec(
        str(BIN / "chatpipe"), "up", "--engine", "sim", "--port", str(free_port()),
        "--model", str(tiny_model_dir), cwd=cwd,
        env=reader_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 180)
        started = UP_LINE.search(line.decode())
        assert started, f"chatpipe up printed {line!r}, not its URL and key"
        yield Up(started["url"], started["key"], cwd)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)


def blocks(page: Path, language: str) -> list[str]:
    """The fenced blocks of `language` on `page`, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.M | re.S)


def filled(block: str, up: Up, request_id: str | None = None) -> str:
    """`block` pointed at `up`: its address, its key, the request named."""
    address = up.url.removeprefix("http://")
    text = block.replace("http://localhost:8000", up.url).replace("localhost:8000", address)
    text = re.sub(r"^(export )?KEY=\S+.*$", "", text, flags=re.M)  # the key: from the env
    text = text.replace("source .venv/bin/activate", f"source {BIN}/activate")
    return text.replace("<request_id>", request_id) if request_id else text


async def run(*command: str, up: Up, timeout_s: float = 60) -> str:
    process = await asyncio.create_subprocess_exec(
        *command, cwd=up.cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**reader_env(), "KEY": up.key},
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode == 0, f"{command[-1][:300]}\nfailed: {err.decode()[-2000:]}"
    return out.decode()


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event, data) of each SSE message with a named event."""
    events = []
    for message in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in message.splitlines() if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
async def test_the_curl_commands_stream_an_answer_and_replay_names_it(page, up):
    [curl] = [b for b in blocks(page, "sh") if "curl" in b]
    events = sse_events(await run("bash", "-euo", "pipefail", "-c", filled(curl, up), up=up))
    names = [name for name, _ in events]
    assert names[0] == "request" and "delta" in names and names[-1] == "done", names
    request_id = events[0][1]["request_id"]
    assert events[-1][1]["usage"]["completion_tokens"] > 0

    [replay] = [b for b in blocks(page, "sh") if "chatpipe replay" in b]
    commands = [line for line in filled(replay, up, request_id).splitlines() if line.strip()]
    assert len(commands) == 3
    # In the terminal of the curl commands: the venv is active there.
    activated = [f"source {BIN}/activate && {command}" for command in commands]
    tokens, life, as_client = [await run("bash", "-c", c, up=up) for c in activated]
    assert {json.loads(line)["topic"] for line in tokens.splitlines()} == {"chat.tokens"}
    topics = [json.loads(line)["topic"] for line in life.splitlines()]
    assert {"chat.tokens", "chat.work", "chat.answers"} <= set(topics)
    assert any(t.startswith("chat.requests.") for t in topics)
    assert sse_events(as_client)[0][0] == "request"
    text = "".join(d["delta"] for n, d in events if n == "delta")
    replayed = "".join(d["delta"] for n, d in sse_events(as_client) if n == "delta")
    assert replayed == text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
async def test_the_openai_sdk_snippet_prints_an_answer(page, up):
    [snippet] = blocks(page, "python")
    out = await run(sys.executable, "-c", filled(snippet, up), up=up)
    assert out.strip(), "the snippet printed no answer"
    assert "Error" not in out
