"""The first-request commands of the README and the getting-started page, run as a
reader runs them: copied from the Markdown into a shell (or Python) against a real
`chatpipe up` started as its own process, with the key it prints.

Each block is taken from the page as written; only the address (`localhost:8000`) and
the key placeholder are filled in, and `<request_id>` with the id the first stream
named. A page whose commands stop working fails here.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.support.chatpipe_up import BIN, Up, chatpipe_up, reader_env

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def up(tmp_path_factory, tiny_model_dir) -> AsyncIterator[Up]:
    """`chatpipe up` in a fresh directory (its own database and broker), as `make run`
    starts it but with the deterministic engine: these pages are about the API."""
    cwd = tmp_path_factory.mktemp("first-request")
    async with chatpipe_up(cwd, "--model", str(tiny_model_dir)) as started:
        yield started


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
