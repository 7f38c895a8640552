"""The gateway's pure decisions (`gateway.native.turn_rules`, `gateway.refusals`) on
hand-made trees, and the one table that gives each refusal its HTTP status; the wait for
the previous answer on a fake clock."""

from __future__ import annotations

import pytest

from conversations.store import ApiKey, StoredMessage
from conversations.tree import ConversationTree
from gateway import pipeline, refusals
from gateway.errors import STATUS, refusal_response
from gateway.native import turn_rules
from gateway.native.turns import wait_for
from schemas.events import ChatMessage, Role, SamplingOptions
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.clock import FakeClock

NOW = 1_000_000.0


def message(message_id: str, role: Role, parent_id: str | None = None, *,
            status: RequestStatus = RequestStatus.FINISHED_STOPPED,
            created_at: float = NOW) -> StoredMessage:  # fmt: skip
    seq = int(message_id[1:])
    return StoredMessage(message_id, "c1", seq, role, "text", parent_id, None, 0, status, None,
                         created_at)  # fmt: skip


def tree(*messages: StoredMessage) -> ConversationTree:
    return ConversationTree(list(messages))


Q1, A1 = message("m1", Role.USER), message("m2", Role.ASSISTANT, "m1")
Q2 = message("m3", Role.USER, "m2")


def test_an_edit_continues_the_thread_up_to_the_edited_messages_parent():
    assert turn_rules.edit_thread(tree(Q1, A1, Q2), "m3") == [Q1, A1]
    assert turn_rules.edit_thread(tree(Q1, A1, Q2), "m1") == []


@pytest.mark.parametrize(
    ("target", "refusal", "code"),
    [
        ("m2", refusals.Unacceptable, "not_a_user_message"),
        ("m9", refusals.NotFound, "message_not_found"),
    ],
)
def test_only_a_users_message_of_this_conversation_is_edited(target, refusal, code):
    with pytest.raises(refusal) as refused:
        turn_rules.edit_thread(tree(Q1, A1, Q2), target)
    assert refused.value.code == code


def test_a_regeneration_answers_the_user_message_again():
    assert turn_rules.regenerated_question(tree(Q1, A1), "m2") == Q1
    assert turn_rules.regenerated_question(tree(Q1, A1), "m1") == Q1


def test_an_answer_without_a_question_is_not_regenerated():
    orphan = message("m1", Role.ASSISTANT)
    with pytest.raises(refusals.Unacceptable) as refused:
        turn_rules.regenerated_question(tree(orphan), "m1")
    assert refused.value.code == "nothing_to_regenerate"


@pytest.mark.parametrize(
    ("thread", "pending"),
    [
        ([], None),
        ([Q1], None),
        ([Q1, A1], None),
        ([Q1, message("m2", Role.ASSISTANT, "m1", status=RequestStatus.IN_PROGRESS)], "m2"),
        (
            [
                Q1,
                message(
                    "m2",
                    Role.ASSISTANT,
                    "m1",
                    status=RequestStatus.IN_PROGRESS,
                    created_at=NOW - 301,
                ),
            ],
            None,
        ),  # stale: nothing finished it
    ],
)
def test_a_turn_waits_only_for_an_answer_still_streaming(thread, pending):
    assert turn_rules.pending_answer(thread, NOW, stale_after_s=300) == pending


@pytest.mark.parametrize(
    ("answer", "ended"),
    [
        (None, True),  # deleted meanwhile
        (message("m2", Role.ASSISTANT, "m1", status=RequestStatus.IN_PROGRESS), False),
        (message("m2", Role.ASSISTANT, "m1"), True),
    ],
)
def test_a_waiting_turn_goes_on_once_the_answer_it_waits_for_has_ended(answer, ended):
    assert turn_rules.answer_ended(answer) is ended


@pytest.mark.parametrize(("ends_after", "waited"), [(0, True), (3, True), (None, False)])
async def test_a_turn_looks_again_more_and_more_slowly_until_the_wait_is_up(ends_after, waited):
    clock = FakeClock()
    looks = 0

    async def ended() -> bool:
        nonlocal looks
        looks += 1
        return ends_after is not None and looks > ends_after

    assert await wait_for(ended, 1.0, sleep=clock.sleep, clock=clock) is waited
    if ends_after is not None:
        assert clock.sleeps == [0.02, 0.04, 0.08][:ends_after]
    else:  # doubling up to 0.25 s, the last nap cut to the deadline
        assert clock.sleeps == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.2])
        assert clock.now == pytest.approx(1.0)


def test_an_owners_request_is_billed_and_cached_as_the_owner():
    owner = ApiKey("alice", "acme", Tier.PRO)
    messages = (ChatMessage(role=Role.USER, content="hi"),)
    request = pipeline.owner_request(owner, model="tiny-random", messages=messages,
                                     sampling=SamplingOptions(), reply_to="chat.deliver.g1",
                                     timeout_s=30, sent_at=NOW, conversation_id="c1",
                                     parent_id="m1", store=True)  # fmt: skip
    assert (request.user_id, request.org_id, request.tier, request.cache_salt) == (
        "alice",
        "acme",
        Tier.PRO,
        "acme",
    )
    assert (request.conversation_id, request.parent_id, request.store) == ("c1", "m1", True)
    assert request.deadline == NOW + 30
    other = pipeline.owner_request(owner, model="tiny-random", messages=messages,
                                   sampling=SamplingOptions(), reply_to="r", timeout_s=30,
                                   sent_at=NOW)  # fmt: skip
    assert len({request.request_id, request.message_id, other.request_id,
                other.conversation_id, other.message_id}) == 5  # fmt: skip
    assert not other.store


def test_every_kind_of_refusal_has_its_status():
    kinds = set(refusals.Refused.__subclasses__())
    assert kinds == set(STATUS)


def test_a_refusal_answers_with_its_status_code_and_retry_after():
    response = refusal_response(refusals.reply_pending())
    assert response.status_code == 409
    assert response.headers["Retry-After"] == "1"
    assert b'"code":"reply_pending"' in response.body
