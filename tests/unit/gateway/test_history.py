"""What the model sees of a conversation: the thread (`ConversationTree.path_to`) and
the turns of it a prompt carries (`prompt_turns`)."""

from __future__ import annotations

from conversations.store import StoredMessage
from conversations.tree import ConversationTree
from gateway.context.history import prompt_turns
from schemas.events import Role
from schemas.lifecycle import RequestStatus

USER, ASSISTANT = Role.USER, Role.ASSISTANT


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


def test_failed_empty_answers_are_skipped_partial_ones_kept() -> None:
    history = [
        stored("u1", USER, "q1"),
        stored("a1", ASSISTANT, "", "u1", RequestStatus.FINISHED_ERROR),
        stored("u2", USER, "q2", "a1"),
        stored("a2", ASSISTANT, "half an ans", "u2", RequestStatus.FINISHED_ABORTED),
        stored("u3", USER, "q3", "a2"),
        stored("a3", ASSISTANT, "", "u3", RequestStatus.FINISHED_ABORTED),
    ]

    kept = prompt_turns(history)

    assert [(m.role, m.content) for m in kept] == [
        (USER, "q1"), (USER, "q2"), (ASSISTANT, "half an ans"), (USER, "q3"),
    ]  # fmt: skip


def test_thread_follows_parent_links_of_one_branch() -> None:
    messages = [
        stored("u1", USER, "q1"),
        stored("a1", ASSISTANT, "first answer", "u1"),
        stored("a1b", ASSISTANT, "regenerated", "u1"),
        stored("u2", USER, "q2", "a1b"),
        stored("u2x", USER, "edited q2", "a1b"),
    ]

    tree = ConversationTree(messages)
    assert [m.message_id for m in tree.path_to("u2")] == ["u1", "a1b", "u2"]
    assert [m.message_id for m in tree.path_to("a1")] == ["u1", "a1"]
    assert tree.path_to("nope") == []


def test_thread_stops_on_a_parent_cycle() -> None:
    messages = [stored("x", USER, "x", "y"), stored("y", ASSISTANT, "y", "x")]

    assert len(ConversationTree(messages).path_to("x")) == 2
