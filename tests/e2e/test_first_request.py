"""The first requests a new user sends, on the default model (SmolLM2-135M-Instruct) as
`make run` serves it: a real `chatpipe up` started as its own process, with the key it
prints, reached by the README's and the getting-started page's commands, the openai
SDK, the web page and the terminal client. One `chatpipe up` serves the module.

Each command block is taken from its page as written; only the address
(`localhost:8000`) and the key placeholder are filled in, and `<request_id>` with the
id the first stream named. A page whose commands stop working fails here.

An answer counts as the model's own when it ends by itself (the random-weight tiny
model runs to its length limit) and, where the API returns them, its tokens are likely:
their mean log probability is above `LIKELY`, where the tiny model's is about −7.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from tests.support.browser import answered, needs_chromium, send, signed_in_page
from tests.support.chatpipe_up import BIN, Up, chatpipe_up, reader_env
from tests.support.terminal import Terminal

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]
MODEL = "smollm2-135m-instruct"
PROMPT = "Say hello in one short sentence."
LIKELY = -2.5
"""The least mean log probability of an answer's tokens taken as the model's own."""
FIRST_START_S = 900
"""A cold first start compiles the model: minutes on a slow machine."""


@dataclass
class Streamed:
    """One streamed chat completion as its client saw it."""

    ttft_s: float = 0.0
    chunks: int = 0
    finish_reason: str | None = None
    text: str = ""
    logprobs: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Served:
    up: Up
    first: Streamed
    """The first request, sent once `chatpipe up` said it is up."""
    second: Streamed


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(tmp_path_factory, default_model_dir) -> AsyncIterator[Served]:
    """`chatpipe up` in a fresh directory (its own database and broker), on the default
    model as `make run` starts it, and its first two answers."""
    cwd = tmp_path_factory.mktemp("first-request")
    async with chatpipe_up(
        cwd, "--model", str(default_model_dir), engine=None, start_timeout_s=FIRST_START_S
    ) as up:
        first = await streamed(up, PROMPT)
        second = await streamed(up, PROMPT)
        yield Served(up, first, second)


async def streamed(up: Up, prompt: str) -> Streamed:
    """`prompt` through the openai SDK, streamed, with each token's log probability."""
    seen = Streamed()
    async with AsyncOpenAI(base_url=f"{up.url}/v1", api_key=up.key) as client:
        started = time.perf_counter()
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], stream=True,
            logprobs=True,
        )  # fmt: skip
        async for chunk in stream:
            choice = chunk.choices[0] if chunk.choices else None
            if choice is None:
                continue
            if choice.delta.content:
                if not seen.chunks:
                    seen.ttft_s = time.perf_counter() - started
                seen.chunks += 1
                seen.text += choice.delta.content
            if choice.logprobs and choice.logprobs.content:
                seen.logprobs += [token.logprob for token in choice.logprobs.content]
            seen.finish_reason = choice.finish_reason or seen.finish_reason
    return seen


def english(text: str) -> bool:
    """Words, not noise: mostly letters, and a word every English sentence has."""
    words = re.findall(r"[A-Za-z']+", text)
    common = {"i", "you", "a", "the", "is", "to", "of", "and", "in", "it", "hello", "are"}
    letters = sum(map(len, words))
    return (
        len(words) >= 3
        and letters >= 0.7 * len(re.sub(r"\s", "", text))
        and bool(common & {w.lower() for w in words})
    )


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


# --- the first answer --------------------------------------------------------------------


async def test_the_first_answer_comes_as_quick_as_the_next_and_streams(served):
    """The engine has run each kind of request once before it took work: an engine not
    warmed gives its first request's first token several times later than the next's."""
    first, second = served.first, served.second
    assert first.ttft_s <= 1.5 * second.ttft_s + 0.25, (first.ttft_s, second.ttft_s)
    assert first.chunks > 1


async def test_the_answers_are_the_models_own(served):
    for answer in (served.first, served.second):
        assert answer.finish_reason == "stop", answer
        assert answer.logprobs and mean(answer.logprobs) > LIKELY, answer
        assert english(answer.text), answer


# --- the pages' commands -----------------------------------------------------------------


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


async def run(*command: str, up: Up, timeout_s: float = 120) -> str:
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
async def test_the_curl_commands_stream_the_models_answer_and_replay_names_it(page, served):
    up = served.up
    [curl] = [b for b in blocks(page, "sh") if "curl" in b]
    events = sse_events(await run("bash", "-euo", "pipefail", "-c", filled(curl, up), up=up))
    names = [name for name, _ in events]
    assert names[0] == "request" and "delta" in names and names[-1] == "done", names
    request_id = events[0][1]["request_id"]
    done = events[-1][1]
    assert done["finish_reason"] == "stop" and done["model"] == MODEL, done
    text = "".join(d["delta"] for n, d in events if n == "delta")
    assert english(text), text

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
    replayed = "".join(d["delta"] for n, d in sse_events(as_client) if n == "delta")
    assert replayed == text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
async def test_the_openai_sdk_snippet_prints_the_models_answer(page, served):
    [snippet] = blocks(page, "python")
    out = await run(sys.executable, "-c", filled(snippet, served.up), up=served.up)
    assert "Error" not in out
    assert english(out), out


# --- what else reads text: titles, structured output ---------------------------------


async def test_a_first_exchange_is_titled_by_the_model(served):
    up, question = served.up, "What is the capital of France?"
    headers = {"Authorization": f"Bearer {up.key}"}
    async with httpx.AsyncClient(base_url=up.url, headers=headers, timeout=120) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        async with client.stream(
            "POST", f"/v1/conversations/{cid}/messages", json={"content": question}
        ) as response:
            assert response.status_code == 200
            await response.aread()
        title = question  # the fallback, until the model's title is stored
        for _ in range(120):
            title = (await client.get(f"/v1/conversations/{cid}")).json()["title"]
            if title != question:
                break
            await asyncio.sleep(0.5)
    assert title != question, "no title from the model (the first message stayed the title)"
    assert 1 <= len(title.split()) <= 8 and "\n" not in title, title


async def test_structured_output_holds_the_models_answer_to_the_schema(served):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
    }
    async with AsyncOpenAI(base_url=f"{served.up.url}/v1", api_key=served.up.key) as client:
        answer = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name a big city and its country."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "place", "schema": schema, "strict": True}},
        )  # fmt: skip
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    place = json.loads(choice.message.content or "")
    assert set(place) == {"city", "country"} and all(isinstance(v, str) for v in place.values())


# --- the web page and the terminal ------------------------------------------------------


@needs_chromium
async def test_the_web_page_shows_the_models_answer(browser, served):
    async with signed_in_page(browser, served.up.url, served.up.key) as page:
        await send(page, PROMPT)
        text = await answered(page)
    assert english(text), text


async def test_the_terminal_client_shows_the_models_answer(served):
    with Terminal(served.up.url, api_key=served.up.key) as terminal:
        await terminal.expect("> ")
        await terminal.send(PROMPT)
        shown = await terminal.expect(r"(?s).*?\n> ")
        assert await terminal.close() == 0
    assert english(shown), shown
