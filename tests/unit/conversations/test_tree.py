"""ConversationTree: branches, the selected thread, and the list cursor codec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conversations.store import Conversation, StoredMessage, decode_cursor, encode_cursor
from conversations.tree import ROOT_KEY, ConversationTree
from schemas.events import Role
from schemas.lifecycle import RequestStatus


def stored(message_id: str, parent_id: str | None, seq: int, role: Role = Role.USER):
    return StoredMessage(
        message_id=message_id, conversation_id="c1", seq=seq, role=role, content=message_id,
        parent_id=parent_id, model=None, tokens=0, status=RequestStatus.FINISHED_STOPPED,
        request_id=None, created_at=0.0,
    )  # fmt: skip


# u1 ─ a1 ─ u2
#    └ a2 ─ u3 ─ a3
#           └ u3b
MESSAGES = [
    stored("u1", None, 1), stored("a1", "u1", 2, Role.ASSISTANT), stored("u2", "a1", 3),
    stored("a2", "u1", 4, Role.ASSISTANT), stored("u3", "a2", 5),
    stored("a3", "u3", 6, Role.ASSISTANT), stored("u3b", "a2", 7),
]  # fmt: skip


def ids(messages) -> list[str]:
    return [m.message_id for m in messages]


def test_without_choices_the_newest_child_is_shown() -> None:
    tree = ConversationTree.of(reversed(MESSAGES), {})

    assert ids(tree.messages) == ["u1", "a1", "u2", "a2", "u3", "a3", "u3b"]  # seq order
    assert ids(tree.thread()) == ["u1", "a2", "u3b"]
    assert ids(tree.children("a2")) == ["u3", "u3b"] and tree.children("u3b") == []


def test_stored_choices_pick_the_branch_root_key_included() -> None:
    tree = ConversationTree.of(MESSAGES, {ROOT_KEY: "u1", "u1": "a2", "a2": "u3"})

    assert ids(tree.thread()) == ["u1", "a2", "u3", "a3"] and tree.leaf_id == "a3"
    assert tree.selected == {None: "u1", "u1": "a2", "a2": "u3", "a1": "u2", "u3": "a3"}


def test_a_choice_of_a_missing_child_falls_back_to_the_newest() -> None:
    tree = ConversationTree.of(MESSAGES, {"u1": "deleted", "a2": "u2"})  # u2 is not a2's child

    assert ids(tree.thread()) == ["u1", "a2", "u3b"]


def test_path_to_a_message_and_empty_trees() -> None:
    tree = ConversationTree.of(MESSAGES, {})

    assert ids(tree.path_to("a3")) == ["u1", "a2", "u3", "a3"]
    assert tree.path_to("nope") == []
    assert ConversationTree([]).thread() == [] and ConversationTree([]).leaf_id is None


def test_an_answers_turn_inputs_go_back_to_the_generated_answer_before_them() -> None:
    # s (system, sent) ─ u1 ─ a1 (sent by the client) ─ u2 ─ g1 (generated) ─ u3 ─ g2
    sent = [stored("u1", None, 1), stored("a1", "u1", 2, Role.ASSISTANT), stored("u2", "a1", 3)]
    g1 = replace(stored("g1", "u2", 4, Role.ASSISTANT), request_id="r1")
    g2 = replace(stored("g2", "u3", 6, Role.ASSISTANT), request_id="r2")
    tree = ConversationTree.of([*sent, g1, stored("u3", "g1", 5), g2], {})

    assert ids(tree.turn_inputs("g1")) == ["u1", "a1", "u2"]
    assert ids(tree.turn_inputs("g2")) == ["u3"]
    assert tree.turn_inputs("nope") == []


def test_parent_cycles_end_the_walk() -> None:
    looped = [stored("x", None, 1), stored("y", "x", 2), stored("x2", "y", 3)]
    tree = ConversationTree(looped, {"y": "x2", "x2": "y"})

    assert ids(tree.thread()) == ["x", "y", "x2"]


def test_cursor_round_trip_and_rejection() -> None:
    conversation = Conversation("c-7", "u1", "", 1_700_000_000.125)

    assert decode_cursor(encode_cursor(conversation)) == (1_700_000_000.125, "c-7")
    for bad in ["", "%%%", "bm90IGpzb24=", "WzEsMl0="]:  # empty, not base64, not JSON, [1,2]
        with pytest.raises(ValueError):
            decode_cursor(bad)
