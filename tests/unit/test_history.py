"""build_prompt and thread: what the model sees of a conversation."""

from __future__ import annotations

from conversations.store import StoredMessage
from gateway.history import build_prompt, thread
from schemas.events import ChatMessage, Role
from schemas.lifecycle import RequestStatus

SYSTEM, USER, ASSISTANT = Role.SYSTEM, Role.USER, Role.ASSISTANT


def stored(
    message_id: str,
    role: Role,
    content: str,
    parent_id: str | None = None,
    status: RequestStatus = RequestStatus.FINISHED_STOPPED,
) -> StoredMessage:
    return StoredMessage(
        message_id=message_id, conversation_id="c1", seq=0, role=role, content=content,
        parent_id=parent_id, model=None, tokens=0, status=status, request_id=None,
        created_at=0.0,
    )  # fmt: skip


def pairs(prompt: list[ChatMessage]) -> list[tuple[Role, str]]:
    return [(m.role, m.content) for m in prompt]


def words(message: ChatMessage) -> int:
    return len(message.content.split())


def test_system_then_history_then_new_message() -> None:
    history = [stored("u1", USER, "hi"), stored("a1", ASSISTANT, "hello", "u1")]

    prompt = build_prompt(history, "how are you?", "be brief")

    assert pairs(prompt) == [
        (SYSTEM, "be brief"), (USER, "hi"), (ASSISTANT, "hello"), (USER, "how are you?"),
    ]  # fmt: skip


def test_no_system_prompt() -> None:
    assert pairs(build_prompt([], "hi", None)) == [(USER, "hi")]


def test_failed_empty_answers_are_skipped_partial_ones_kept() -> None:
    history = [
        stored("u1", USER, "q1"),
        stored("a1", ASSISTANT, "", "u1", RequestStatus.FINISHED_ERROR),
        stored("u2", USER, "q2", "a1"),
        stored("a2", ASSISTANT, "half an ans", "u2", RequestStatus.FINISHED_ABORTED),
        stored("u3", USER, "q3", "a2"),
        stored("a3", ASSISTANT, "", "u3", RequestStatus.FINISHED_ABORTED),
    ]

    prompt = build_prompt(history, "q4", None)

    assert pairs(prompt) == [
        (USER, "q1"), (USER, "q2"), (ASSISTANT, "half an ans"), (USER, "q3"), (USER, "q4"),
    ]  # fmt: skip


def test_prefix_is_stable_turn_over_turn() -> None:
    history = [stored("u1", USER, "q1"), stored("a1", ASSISTANT, "r1", "u1")]
    turn_2 = build_prompt(history, "q2", "sys")

    history += [stored("u2", USER, "q2", "a1"), stored("a2", ASSISTANT, "r2", "u2")]
    turn_3 = build_prompt(history, "q3", "sys")

    assert turn_3[: len(turn_2)] == turn_2


def test_truncation_drops_oldest_turns_never_the_system_prompt() -> None:
    history = [
        stored("u1", USER, "one two three"),
        stored("a1", ASSISTANT, "four five", "u1"),
        stored("u2", USER, "six", "a1"),
        stored("a2", ASSISTANT, "seven eight", "u2"),
    ]

    # budget 8: system 2 + new 1 leaves 5; "six"+"seven eight" fit, "four five" does not
    prompt = build_prompt(history, "nine", "sys prompt", max_prompt_tokens=8, count_tokens=words)

    assert pairs(prompt) == [
        (SYSTEM, "sys prompt"), (USER, "six"), (ASSISTANT, "seven eight"), (USER, "nine"),
    ]  # fmt: skip


def test_truncation_never_starts_with_an_orphaned_answer() -> None:
    history = [
        stored("u1", USER, "one two three"),
        stored("a1", ASSISTANT, "four", "u1"),
    ]

    prompt = build_prompt(history, "five", None, max_prompt_tokens=3, count_tokens=words)

    assert pairs(prompt) == [(USER, "five")]


def test_truncation_keeps_everything_that_fits() -> None:
    history = [stored("u1", USER, "a b"), stored("a1", ASSISTANT, "c", "u1")]

    prompt = build_prompt(history, "d", "s", max_prompt_tokens=5, count_tokens=words)

    assert len(prompt) == 4


def test_thread_follows_parent_links_of_one_branch() -> None:
    messages = [
        stored("u1", USER, "q1"),
        stored("a1", ASSISTANT, "first answer", "u1"),
        stored("a1b", ASSISTANT, "regenerated", "u1"),
        stored("u2", USER, "q2", "a1b"),
        stored("u2x", USER, "edited q2", "a1b"),
    ]

    assert [m.message_id for m in thread(messages, "u2")] == ["u1", "a1b", "u2"]
    assert [m.message_id for m in thread(messages, "a1")] == ["u1", "a1"]
    assert thread(messages, None) == []


def test_thread_stops_on_a_parent_cycle() -> None:
    messages = [stored("x", USER, "x", "y"), stored("y", ASSISTANT, "y", "x")]

    assert len(thread(messages, "x")) == 2
