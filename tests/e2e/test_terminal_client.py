"""`chatpipe chat` driven through a pseudo-terminal (pexpect) against a running pipeline.

pexpect blocks, and the pipeline runs on this test's event loop: every wait on
the terminal runs in a thread. A connection dropped mid-answer is a proxy between the
client and the gateway (`tests/support/dropped_connections.py`).
"""

from __future__ import annotations

import asyncio
import io

import pytest

from chatpipe.terminal import RECONNECTING
from schemas.lifecycle import RequestStatus
from tests.support.chat import post_message
from tests.support.dropped_connections import CuttingProxy, hold_dropped_answers
from tests.support.stack import client_for
from tests.support.terminal import Terminal

WORDS = [f"w{i:02d}" for i in range(30)]


@pytest.fixture
async def terminal(slow_stack):
    with Terminal(slow_stack.base_url) as term:
        await term.expect("> ")
        yield term


async def test_answer_streams_into_the_terminal_and_regen_answers_again(terminal, slow_stack):
    await terminal.send(f"[[sim:reply={' '.join(WORDS)}]]")
    await terminal.expect(WORDS[0])
    assert WORDS[-1] not in terminal.unread, "the whole answer came at once"
    await terminal.expect(WORDS[-1])
    await terminal.expect("> ")

    await terminal.send("/regen")
    await terminal.expect(WORDS[-1])
    await terminal.expect("> ")
    await terminal.send("/list")
    cid = await current_conversation(terminal)
    assert await terminal.close() == 0

    answers = await stored_answers(slow_stack, cid, 2)
    assert {a["parent_id"] for a in answers} == {answers[0]["parent_id"]}, (
        "the regenerated answer is a sibling of the first"
    )


async def test_ctrl_c_stops_the_answer_and_the_client_goes_on(terminal, slow_stack):
    await terminal.send("[[sim:length=2000]]")
    await terminal.expect(r"\w+ \w+ \w+ \w+ ")
    terminal.child.sendintr()
    await terminal.expect(r"\[stopped\]")
    await terminal.expect("> ")

    await terminal.send("[[sim:reply=still here]]")
    await terminal.expect("still here")
    await terminal.expect("> ")
    cid = await current_conversation(terminal)
    answers = await stored_answers(slow_stack, cid, 2)
    assert [a["status"] for a in answers] == [
        RequestStatus.FINISHED_ABORTED,
        RequestStatus.FINISHED_STOPPED,
    ]
    assert len(answers[0]["content"].split()) < 200, "the stopped answer kept going"


async def test_queue_position_shows_while_waiting_and_stop_leaves_the_queue(terminal, busy_slot):
    await busy_slot.occupy()
    await terminal.send("[[sim:reply=my turn came]]")
    await terminal.expect(r"waiting in line: position \d+")
    await terminal.send("/stop")
    await terminal.expect(r"\[stopped\]")
    await busy_slot.release()

    await terminal.send("[[sim:reply=my turn came]]")
    await terminal.expect("my turn came")


async def test_a_dropped_connection_is_followed_again_where_it_stopped(slow_stack, monkeypatch):
    hold_dropped_answers(slow_stack, monkeypatch)
    async with CuttingProxy(slow_stack.base_url, deltas=8) as proxy:
        with Terminal(proxy.url) as terminal:
            await terminal.expect("> ")
            await terminal.send("[[sim:length=120]]")
            await terminal.expect("\r\n> ")
            printed = terminal.child.before
            cid = await current_conversation(terminal)
        assert proxy.cut.is_set()

    # The note goes on a line of its own, which the answer's next words replace.
    note = f"\r\n{RECONNECTING}\r\x1b[2K"
    assert printed.count(note) == 1, printed
    [answer] = await stored_answers(slow_stack, cid, 1)
    assert answer["status"] == RequestStatus.FINISHED_STOPPED
    assert len(answer["content"].split()) == 120
    assert printed.replace(note, "") == answer["content"], "a gap or a repeat"


async def test_conversation_option_continues_a_conversation(slow_stack):
    async with client_for(slow_stack) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        first = await post_message(client, cid, {"content": "[[sim:reply=an earlier answer]]"})
    assert first.text == "an earlier answer"
    with Terminal(slow_stack.base_url, "--conversation", cid) as terminal:
        await terminal.expect("chatpipe: an earlier answer")
        await terminal.expect("> ")
        await terminal.send("/regen")
        await terminal.expect("an earlier answer")
        await terminal.expect("> ")
        assert await terminal.close() == 0
    answers = await stored_answers(slow_stack, cid, 2)
    assert [a["content"] for a in answers] == ["an earlier answer"] * 2


async def test_escape_sequences_from_the_model_never_reach_the_terminal(slow_stack):
    """The answer clears the screen (CSI 2J) and resets the terminal (ESC c); the
    message beside it would write the clipboard (OSC 52) and set the window title."""
    hostile = (
        "[[sim:reply=first\x1b[2J\x1b[Hwords \x1bcreset done]] "
        "\x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;pwned\x07\x1b[31mtail"
    )
    async with client_for(slow_stack) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        first = await post_message(client, cid, {"content": hostile})
    assert first.text == "first\x1b[2J\x1b[Hwords \x1bcreset done", "the model said it"
    printed = io.StringIO()
    with Terminal(slow_stack.base_url, "--conversation", cid) as terminal:
        terminal.child.logfile_read = printed  # everything the client writes, from the start
        await terminal.expect("chatpipe: firstwords reset done")
        await terminal.expect("> ")
        await terminal.send("/regen")  # the same words, streamed delta by delta
        await terminal.expect("firstwords reset done")
        await terminal.expect("> ")
        assert await terminal.close() == 0
    shown = printed.getvalue()
    assert "you: [[sim:reply=firstwords reset done]] tail" in shown, repr(shown)
    assert shown.count("firstwords reset done") == 3, repr(shown)
    assert "\x1b" not in shown and "\x07" not in shown, repr(shown)


async def current_conversation(terminal: Terminal) -> str:
    """The id `/list` marks as the current conversation."""
    await terminal.send("/list")
    await terminal.expect(r"\*\s+1\s+[^\r\n]+\[(\w+)\]")
    conversation_id = terminal.child.match.group(1)
    await terminal.expect("> ")
    return conversation_id


async def stored_answers(stack, conversation_id: str, count: int) -> list[dict]:
    """The conversation's answers once the recorder has stored `count` of them."""
    async with client_for(stack) as client:
        for _ in range(100):
            detail = (await client.get(f"/v1/conversations/{conversation_id}")).json()
            answers = [m for m in detail["messages"] if m["role"] == "assistant"]
            if len(answers) >= count:
                return answers
            await asyncio.sleep(0.1)
    raise AssertionError(f"{len(answers)} answers stored, expected {count}")
