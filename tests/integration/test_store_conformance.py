"""One behaviour for every conversation store (`conversations.store` contracts).

Each test runs against:

* `sqlite` — `SQLiteStore` on a fresh in-memory database;
* `cassandra-emulated` — `CassandraStore`'s own code over an in-memory
  emulation of its statements (`cassandra_emulator.py`): exercises the
  store's logic (seq claims, cursors, LWT outcomes, row mapping) on every run;
* `cassandra` — `CassandraStore` on a real cluster, when `CASSANDRA_HOSTS`
  names one (`host[:port]`, comma-separated). The suite uses a keyspace of
  its own and drops it at the end.

Ids are unique per test (`Names`), so tests can share a real keyspace.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace

import pytest

from conversations.store import (
    ApiKey,
    CachedResponse,
    ConversationStore,
    NewMessage,
    NoKeySecret,
    OrgSettings,
    RequestRecord,
    StoredMessage,
)
from schemas.events import Role
from schemas.files import Citation
from schemas.lifecycle import RequestStatus
from schemas.tools import ToolStep
from schemas.topics import Tier
from tests.support.conformance import Clock, Names


def user_message(message_id: str, conversation_id: str, parent_id: str | None = None) -> NewMessage:
    return NewMessage(message_id, conversation_id, Role.USER, f"text of {message_id}",
                      parent_id=parent_id)  # fmt: skip


def answer(message_id: str, conversation_id: str, parent_id: str, **fields) -> NewMessage:
    return NewMessage(
        message_id, conversation_id, Role.ASSISTANT, f"answer {message_id}", parent_id=parent_id,
        model="tiny-random", tokens=7, request_id=f"r-{message_id}", **fields,
    )  # fmt: skip


def started(message_id: str, conversation_id: str, parent_id: str) -> NewMessage:
    """An answer as the gateway stores it on queueing: in progress, still empty."""
    return NewMessage(message_id, conversation_id, Role.ASSISTANT, "", parent_id=parent_id,
                      model="tiny-random", status=RequestStatus.IN_PROGRESS,
                      request_id=f"r-{message_id}")  # fmt: skip


def request_of(message: NewMessage, **fields) -> RequestRecord:
    assert message.request_id is not None
    request = RequestRecord(message.request_id, message.conversation_id, message.message_id,
                            "alice", answers_partition=3, answers_offset=42,
                            reply_to="chat.deliver.gw-1", org_id="acme")  # fmt: skip
    return replace(request, **fields)


async def start(
    store: ConversationStore, message_id: str, conversation_id: str, parent_id: str, **fields
) -> StoredMessage:
    """`start_answer` of `started(...)` with its request (`fields` change the request)."""
    message = started(message_id, conversation_id, parent_id)
    return await store.start_answer(message, request_of(message, **fields))


def ids(messages) -> list[str]:
    return [m.message_id for m in messages]


# --- messages ---------------------------------------------------------------------------


async def test_seq_counts_per_conversation_from_one(store: ConversationStore, n: Names) -> None:
    a = await store.add_message(user_message(n.m1, n.c1))
    b = await store.add_message(answer(n.m2, n.c1, parent_id=n.m1))
    other = await store.add_message(user_message(n.x1, n.c2))

    assert (a.seq, b.seq, other.seq) == (1, 2, 1)
    assert ids(await store.list_messages(n.c1)) == [n.m1, n.m2]


async def test_message_round_trips_every_field(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    clock.now = 1_700_000_123.25
    sent = answer(n.m2, n.c1, parent_id=n.m1, status=RequestStatus.FINISHED_LENGTH,
                  prompt_tokens=321, cached_tokens=256)  # fmt: skip
    stored = await store.add_message(sent)
    root = await store.add_message(user_message(n.m1, n.c1))

    assert await store.get_message(n.m2) == stored
    assert (await store.list_messages(n.c1)) == [stored, root]
    assert (stored.role, stored.content, stored.parent_id, stored.model, stored.created_at) == (
        Role.ASSISTANT, f"answer {n.m2}", n.m1, "tiny-random", 1_700_000_123.25,
    )  # fmt: skip
    assert (stored.tokens, stored.status, stored.request_id) == (
        7, RequestStatus.FINISHED_LENGTH, f"r-{n.m2}",
    )  # fmt: skip
    assert (stored.prompt_tokens, stored.cached_tokens) == (321, 256)
    assert (root.parent_id, root.model, root.request_id, root.prompt_tokens) == (
        None,
        None,
        None,
        0,
    )
    assert await store.get_message(n.missing) is None


async def test_add_message_is_idempotent_on_message_id(store: ConversationStore, n: Names) -> None:
    first = await store.add_message(user_message(n.m1, n.c1))
    again = await store.add_message(NewMessage(n.m1, n.c1, Role.USER, "another text"))

    assert again == first
    assert len(await store.list_messages(n.c1)) == 1


async def test_concurrent_appends_get_distinct_dense_seqs(
    store: ConversationStore, n: Names
) -> None:
    writes = [store.add_message(user_message(f"{n.m}{i}", n.c1)) for i in range(20)]
    stored = await asyncio.gather(*writes)

    assert sorted(m.seq for m in stored) == list(range(1, 21))
    assert [m.seq for m in await store.list_messages(n.c1)] == list(range(1, 21))


async def test_concurrent_duplicates_store_one_message(store: ConversationStore, n: Names) -> None:
    copies = await asyncio.gather(*(store.add_message(user_message(n.m1, n.c1)) for _ in range(5)))

    assert len({c.seq for c in copies}) == 1
    assert ids(await store.list_messages(n.c1)) == [n.m1]


async def test_usage_of_every_answer_in_order(store: ConversationStore, n: Names) -> None:
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(answer(n.a1, n.c1, n.u1, prompt_tokens=40, cached_tokens=0))
    await store.add_message(user_message(n.u2, n.c1, n.a1))
    await store.add_message(answer(n.a2, n.c1, n.u2, prompt_tokens=90, cached_tokens=48))

    usage = await store.message_usage(n.c1)

    assert [(u.message_id, u.seq, u.prompt_tokens, u.cached_tokens) for u in usage] == [
        (n.a1, 2, 40, 0), (n.a2, 4, 90, 48),
    ]  # fmt: skip
    assert all(u.completion_tokens == 7 and u.model == "tiny-random" for u in usage)


# --- answers still streaming ------------------------------------------------------------


async def test_a_started_answer_is_stored_in_progress_and_selected(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(answer(n.a1, n.c1, n.u1))
    clock.now = 1_700_000_500.5
    stored = await start(store, n.a2, n.c1, n.u1)

    assert await store.get_message(n.a2) == stored
    assert (stored.seq, stored.status, stored.content, stored.request_id) == (
        3, RequestStatus.IN_PROGRESS, "", f"r-{n.a2}",
    )  # fmt: skip
    assert ids((await store.get_tree(n.c1)).thread()) == [n.u1, n.a2]
    assert await store.get_request(f"r-{n.a2}") == RequestRecord(
        f"r-{n.a2}", n.c1, n.a2, "alice", answers_partition=3, answers_offset=42,
        reply_to="chat.deliver.gw-1", created_at=1_700_000_500.5, org_id="acme",
    )  # fmt: skip
    assert await store.get_request(n.unknown) is None


async def test_start_answer_is_idempotent_on_message_id(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    await store.add_message(user_message(n.u1, n.c1))
    first = await start(store, n.a1, n.c1, n.u1)
    clock.now += 5
    again = await start(store, n.a1, n.c1, n.u1, answers_offset=99, reply_to="other")

    assert again == first
    assert ids(await store.list_messages(n.c1)) == [n.u1, n.a1]
    request = await store.get_request(f"r-{n.a1}")
    assert request is not None
    assert (request.answers_offset, request.reply_to, request.created_at) == (
        42, "chat.deliver.gw-1", first.created_at,
    )  # fmt: skip


async def test_start_answer_refuses_a_message_that_is_not_its_requests(
    store: ConversationStore, n: Names
) -> None:
    message = started(n.a1, n.c1, n.u1)
    finished = replace(message, status=RequestStatus.FINISHED_STOPPED)

    with pytest.raises(ValueError):
        await store.start_answer(message, request_of(message, message_id=n.other))
    with pytest.raises(ValueError):
        await store.start_answer(finished, request_of(message))
    assert await store.get_message(n.a1) is None


async def test_finish_answer_sets_the_final_answer_once(store: ConversationStore, n: Names) -> None:
    await store.add_message(user_message(n.u1, n.c1))
    begun = await start(store, n.a1, n.c1, n.u1)
    final = answer(n.a1, n.c1, n.u1, status=RequestStatus.FINISHED_LENGTH, prompt_tokens=120,
                   cached_tokens=64)  # fmt: skip
    final = replace(final, model="big")

    assert await store.finish_answer(final)
    finished = await store.get_message(n.a1)
    assert finished == replace(begun, content=f"answer {n.a1}", model="big", tokens=7,
                               status=RequestStatus.FINISHED_LENGTH, prompt_tokens=120,
                               cached_tokens=64)  # fmt: skip

    late = replace(final, content="another ending", status=RequestStatus.FINISHED_ABORTED)
    assert not await store.finish_answer(late)
    assert await store.get_message(n.a1) == finished
    assert not await store.finish_answer(answer(n.missing, n.c1, n.u1))
    assert await store.get_message(n.missing) is None


async def test_an_answer_keeps_the_alias_its_version_was_picked_for(
    store: ConversationStore, n: Names
) -> None:
    """The rollout's version is the answer's model; the alias asked for stays as the
    answer was started, whatever its end says."""
    await store.add_message(user_message(n.u1, n.c1))
    message = replace(started(n.a1, n.c1, n.u1), model="v2", alias="chat")
    begun = await store.start_answer(message, request_of(message))
    await store.add_message(answer(n.a2, n.c1, n.u1))

    assert (begun.model, begun.alias) == ("v2", "chat")
    assert await store.finish_answer(replace(answer(n.a1, n.c1, n.u1), model="v2"))
    finished = await store.get_message(n.a1)
    assert finished is not None and (finished.model, finished.alias) == ("v2", "chat")
    tree = await store.get_tree(n.c1)
    assert {m.message_id: m.alias for m in tree.messages if m.role is Role.ASSISTANT} == {
        n.a1: "chat",
        n.a2: None,
    }


async def test_of_two_concurrent_finishes_one_wins(store: ConversationStore, n: Names) -> None:
    await start(store, n.a1, n.c1, n.u1)
    gateway = answer(n.a1, n.c1, n.u1)
    recorder = replace(gateway, content="the recorder's copy", status=RequestStatus.FINISHED_ERROR)

    outcomes = await asyncio.gather(store.finish_answer(gateway), store.finish_answer(recorder))

    assert sorted(outcomes) == [False, True]
    winner = gateway if outcomes[0] else recorder
    stored = await store.get_message(n.a1)
    assert stored is not None and (stored.content, stored.status) == (
        winner.content, winner.status,
    )  # fmt: skip


async def test_a_deleted_conversation_keeps_no_answer_to_finish(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    await store.add_message(user_message(n.u1, n.c1))
    await start(store, n.a1, n.c1, n.u1)

    assert await store.delete_conversation(n.c1, n.alice, org_id=n.org)
    assert not await store.finish_answer(answer(n.a1, n.c1, n.u1))

    assert await store.get_message(n.a1) is None and await store.list_messages(n.c1) == []
    assert await store.get_request(f"r-{n.a1}") is None
    assert await store.in_progress_requests(n.c1) == []


async def test_in_progress_requests_lists_only_unfinished_answers(
    store: ConversationStore, n: Names
) -> None:
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(answer(n.a0, n.c1, n.u1))  # stored whole by the recorder
    for message_id in (n.a1, n.a2, n.a3):
        await start(store, message_id, n.c1, n.u1)
    await start(store, n.x1, n.c2, n.u1)
    await store.finish_answer(answer(n.a2, n.c1, n.u1))

    assert await store.in_progress_requests(n.c1) == [f"r-{n.a1}", f"r-{n.a3}"]
    assert await store.in_progress_requests(n.unknown) == []


# --- branches ---------------------------------------------------------------------------


async def test_a_new_message_is_selected_under_its_parent(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(answer(n.a1, n.c1, n.u1))
    await store.add_message(answer(n.a2, n.c1, n.u1))  # regenerate: a sibling, now shown

    tree = await store.get_tree(n.c1)

    assert ids(tree.children(n.u1)) == [n.a1, n.a2]
    assert tree.selected == {None: n.u1, n.u1: n.a2}
    assert ids(tree.thread()) == [n.u1, n.a2] and tree.leaf_id == n.a2


async def test_select_an_older_branch_and_fork_by_editing(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    for message in [
        user_message(n.u1, n.c1), answer(n.a1, n.c1, n.u1),
        user_message(n.u2, n.c1, n.a1), answer(n.a2, n.c1, n.u2),
        user_message(n.u2_edit, n.c1, n.a1), answer(n.a3, n.c1, n.u2_edit),  # an edit of u2
    ]:  # fmt: skip
        await store.add_message(message)
    assert ids((await store.get_tree(n.c1)).thread()) == [n.u1, n.a1, n.u2_edit, n.a3]

    assert await store.select_message(n.c1, n.alice, n.u2, org_id=n.org)

    tree = await store.get_tree(n.c1)
    assert ids(tree.thread()) == [n.u1, n.a1, n.u2, n.a2]  # continues below the chosen one
    assert ids(tree.children(n.a1)) == [n.u2, n.u2_edit]
    assert tree.selected[n.a1] == n.u2


async def test_selecting_a_deep_message_selects_its_ancestors(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    for message in [
        user_message(n.u1, n.c1), answer(n.a1, n.c1, n.u1), user_message(n.u2, n.c1, n.a1),
        user_message(n.v1, n.c1), answer(n.b1, n.c1, n.v1),  # an edit of the first message
    ]:  # fmt: skip
        await store.add_message(message)
    assert (await store.get_tree(n.c1)).leaf_id == n.b1

    assert await store.select_message(n.c1, n.alice, n.u2, org_id=n.org)
    assert ids((await store.get_tree(n.c1)).thread()) == [n.u1, n.a1, n.u2]


async def test_only_the_owner_selects_and_only_messages_of_the_conversation(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    await store.create_conversation(n.c2, n.alice, org_id=n.org)
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(user_message(n.u1b, n.c1))
    await store.add_message(user_message(n.x1, n.c2))

    assert not await store.select_message(n.c1, n.mallory, n.u1, org_id=n.org)
    assert not await store.select_message(n.c1, n.alice, n.x1, org_id=n.org)
    assert not await store.select_message(n.c1, n.alice, n.unknown, org_id=n.org)
    assert not await store.select_message(n.unknown, n.alice, n.u1, org_id=n.org)
    assert (await store.get_tree(n.c1)).leaf_id == n.u1b


# --- conversations ----------------------------------------------------------------------


async def test_conversations_are_idempotent(store: ConversationStore, n: Names) -> None:
    first = await store.create_conversation(n.c1, n.alice, "first", org_id=n.org)
    again = await store.create_conversation(n.c1, n.bob, "other title", org_id=n.org)

    assert again == first and first.user_id == n.alice and first.title == "first"
    assert await store.get_conversation(n.c1) == first
    assert await store.get_conversation(n.missing) is None


async def test_conversations_list_newest_first_in_pages(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    stamps = [10.0, 20.0, 20.0, 20.0, 30.0, 40.0, 40.0]  # ties must not lose or repeat any
    for i, stamp in enumerate(stamps):
        clock.now = stamp
        await store.create_conversation(f"{n.c}{i}", n.alice, org_id=n.org)
    await store.create_conversation(n.other, n.bob, org_id=n.org)

    pages, cursor = [], None
    while True:
        page = await store.list_conversations(n.alice, limit=3, cursor=cursor, org_id=n.org)
        pages.append([c.conversation_id for c in page.conversations])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
        clock.now = 99.0  # a conversation started meanwhile does not shift the next pages
        await store.create_conversation(f"{n.late}{len(pages)}", n.alice, org_id=n.org)

    listed = [cid for page in pages for cid in page]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert listed == [f"{n.c}{i}" for i in (5, 6, 4, 1, 2, 3, 0)]


async def test_listing_edges(store: ConversationStore, n: Names) -> None:
    empty = await store.list_conversations(n.nobody, org_id=n.org)
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    exact = await store.list_conversations(n.alice, limit=1, org_id=n.org)

    assert (empty.conversations, empty.next_cursor) == ([], None)
    assert len(exact.conversations) == 1 and exact.next_cursor is None
    with pytest.raises(ValueError):
        await store.list_conversations(n.alice, cursor="not a cursor", org_id=n.org)
    with pytest.raises(ValueError):
        await store.list_conversations(n.alice, limit=0, org_id=n.org)


async def test_rename_only_by_the_owner(store: ConversationStore, n: Names) -> None:
    await store.create_conversation(n.c1, n.alice, "old", org_id=n.org)

    renamed = await store.rename_conversation(n.c1, n.alice, "new", org_id=n.org)
    refused = await store.rename_conversation(n.c1, n.mallory, "pwned", org_id=n.org)
    missing = await store.rename_conversation(n.unknown, n.alice, "x", org_id=n.org)

    assert renamed is not None and renamed.title == "new"
    assert (refused, missing) == (None, None)
    assert (await store.get_conversation(n.c1)).title == "new"  # type: ignore[union-attr]
    [listed] = (await store.list_conversations(n.alice, org_id=n.org)).conversations
    assert listed == renamed


async def test_auto_title_shows_until_the_user_names_it(store: ConversationStore, n: Names) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    await store.set_auto_title(n.c1, "Cat names")
    await store.set_auto_title(n.unknown, "ignored")

    titled = await store.get_conversation(n.c1)
    assert titled is not None and (titled.title, titled.display_title) == ("", "Cat names")
    [listed] = (await store.list_conversations(n.alice, org_id=n.org)).conversations
    assert listed.display_title == "Cat names"

    await store.rename_conversation(n.c1, n.alice, "Mine", org_id=n.org)
    named = await store.get_conversation(n.c1)
    assert named is not None and named.display_title == "Mine" and named.auto_title == "Cat names"


async def test_delete_removes_everything_and_only_for_the_owner(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    await store.create_conversation(n.keep, n.alice, org_id=n.org)
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(answer(n.a1, n.c1, n.u1))
    await store.add_message(user_message(n.k1, n.keep))
    await store.save_summary(n.c1, n.a1, "a summary")
    await store.save_embeddings(n.c1, "mini", {n.u1: b"\x00" * 8})
    await store.save_citations(n.c1, n.a1, [Citation(n.f1, "a.md", 0, 0.5, "text")])
    await store.save_tool_steps(n.c1, n.a1, [ToolStep(type="tool_call", id="c", name="clock")])

    assert not await store.delete_conversation(n.c1, n.mallory, org_id=n.org)
    assert await store.get_conversation(n.c1) is not None
    assert await store.delete_conversation(n.c1, n.alice, org_id=n.org)
    assert not await store.delete_conversation(n.c1, n.alice, org_id=n.org)

    assert await store.get_conversation(n.c1) is None
    assert await store.list_messages(n.c1) == [] and await store.get_message(n.u1) is None
    assert (await store.get_tree(n.c1)).thread() == []
    assert await store.list_summaries(n.c1) == []
    assert await store.load_embeddings(n.c1, "mini") == {}
    assert await store.list_citations(n.c1) == {}
    assert await store.list_tool_steps(n.c1) == {}
    listed = (await store.list_conversations(n.alice, org_id=n.org)).conversations
    assert [c.conversation_id for c in listed] == [n.keep]
    assert ids(await store.list_messages(n.keep)) == [n.k1]


async def test_deleting_a_branch_end_removes_it_with_what_is_kept_of_it(
    store: ConversationStore, n: Names
) -> None:
    await store.create_conversation(n.c1, n.alice, org_id=n.org)
    await store.add_message(user_message(n.u1, n.c1))
    await start(store, n.a1, n.c1, n.u1)
    await store.add_message(user_message(n.u2, n.c1, n.a1))
    await start(store, n.a2, n.c1, n.u2)
    await store.add_message(answer(n.r2, n.c1, n.u2))  # regenerated: selected under u2
    await store.save_summary(n.c1, n.a2, "through a2")
    await store.save_summary(n.c1, n.a1, "through a1")
    await store.save_embeddings(n.c1, "mini", {n.u2: b"\x01" * 4, n.a1: b"\x02" * 4})
    await store.save_embeddings(n.c1, "other", {n.u2: b"\x03" * 4})
    await store.save_citations(n.c1, n.a2, [Citation(n.f1, "a.md", 0, 0.5, "text")])
    await store.save_tool_steps(n.c1, n.a2, [ToolStep(type="tool_call", id="c", name="clock")])

    with pytest.raises(ValueError):  # r2 would lose its parent u2
        await store.delete_messages(n.c1, [n.a2, n.u2])
    assert ids(await store.list_messages(n.c1)) == [n.u1, n.a1, n.u2, n.a2, n.r2]

    assert await store.delete_messages(n.c1, [n.r2]) == 1
    assert ids((await store.get_tree(n.c1)).thread()) == [n.u1, n.a1, n.u2, n.a2]
    assert await store.delete_messages(n.c1, [n.a2, n.u2, n.nowhere]) == 2

    assert ids(await store.list_messages(n.c1)) == [n.u1, n.a1]
    assert ids((await store.get_tree(n.c1)).thread()) == [n.u1, n.a1]
    assert await store.get_message(n.a2) is None and await store.get_message(n.u2) is None
    assert await store.get_request(f"r-{n.a2}") is None
    assert await store.get_request(f"r-{n.a1}") is not None
    assert [s.through_message_id for s in await store.list_summaries(n.c1)] == [n.a1]
    assert await store.load_embeddings(n.c1, "mini") == {n.a1: b"\x02" * 4}
    assert await store.load_embeddings(n.c1, "other") == {}
    assert await store.list_citations(n.c1) == {}
    assert await store.list_tool_steps(n.c1) == {}
    # The conversation goes on below what is left.
    await store.add_message(user_message(n.u3, n.c1, n.a1))
    assert ids((await store.get_tree(n.c1)).thread()) == [n.u1, n.a1, n.u3]
    assert await store.delete_messages(n.c2, [n.u1]) == 0  # not that conversation's


# --- context caches and keys ------------------------------------------------------------


async def test_summaries_are_stored_per_thread_point(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    await store.save_summary(n.c1, n.a1, "first")
    clock.now += 1
    await store.save_summary(n.c1, n.a5, "second")
    clock.now += 1
    await store.save_summary(n.c1, n.a1, "first, redone")

    summaries = await store.list_summaries(n.c1)

    assert [(s.through_message_id, s.content) for s in summaries] == [
        (n.a5, "second"), (n.a1, "first, redone"),
    ]  # fmt: skip
    assert all(s.conversation_id == n.c1 for s in summaries)


async def test_embeddings_are_cached_per_model(store: ConversationStore, n: Names) -> None:
    await store.save_embeddings(n.c1, "mini", {n.m1: b"\x01\x02\x03\x04", n.m2: b"\x05" * 4})
    await store.save_embeddings(n.c1, "other", {n.m1: b"\x09" * 4})
    await store.save_embeddings(n.c1, "mini", {})

    assert await store.load_embeddings(n.c1, "mini") == {
        n.m1: b"\x01\x02\x03\x04",
        n.m2: b"\x05" * 4,
    }
    assert await store.load_embeddings(n.c1, "other") == {n.m1: b"\x09" * 4}
    assert await store.load_embeddings(n.c2, "mini") == {}


async def test_api_keys_are_idempotent(store: ConversationStore, n: Names) -> None:
    await store.add_api_key(n.secret, ApiKey(n.u1, n.o1, Tier.PRO, created_at=5.0))
    await store.add_api_key(n.secret, ApiKey(n.u2, n.o2, Tier.FREE))  # keeps the first

    found = await store.find_api_key(n.secret)
    assert found is not None
    assert (found.user_id, found.org_id, found.tier, found.created_at) == (
        n.u1, n.o1, Tier.PRO, 5.0)  # fmt: skip
    assert await store.find_api_key(n.other) is None


# --- API keys: ids, listing, expiry, revocation -----------------------------------------


async def test_an_api_key_round_trips_every_field(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    row = ApiKey(n.u1, n.o1, Tier.ENTERPRISE, created_at=10.0, key_id=n.k1, name="ci",
                 expires_at=99.5, max_concurrent_requests=3)  # fmt: skip
    await store.add_api_key(n.secret, row)
    clock.now = 20.0
    await store.add_api_key(n.other, ApiKey(n.u2, n.o2, Tier.FREE))  # no id, no time

    assert await store.find_api_key(n.secret) == row
    derived = await store.find_api_key(n.other)
    assert derived is not None and derived.created_at == 20.0 and derived.name == ""
    assert len(derived.key_id) == 12 and derived.key_id not in n.other
    assert (derived.expires_at, derived.revoked_at) == (None, None)
    assert derived.max_concurrent_requests is None
    await store.add_api_key(n.other, ApiKey(n.u2, n.o2, Tier.FREE))
    assert await store.find_api_key(n.other) == derived  # the same id again


async def test_a_key_id_already_taken_keeps_the_first_key(
    store: ConversationStore, n: Names
) -> None:
    await store.add_api_key(n.first, ApiKey(n.u1, n.o1, Tier.PRO, key_id=n.k1))
    await store.add_api_key(n.second, ApiKey(n.u2, n.o2, Tier.PRO, key_id=n.k1))

    assert await store.find_api_key(n.second) is None
    found = await store.find_api_key(n.first)
    assert found is not None and found.user_id == n.u1
    assert await store.revoke_api_key(n.k1)
    revoked = await store.find_api_key(n.first)
    assert revoked is not None and revoked.revoked_at is not None


async def test_keys_are_listed_oldest_first_without_secrets(
    store: ConversationStore, n: Names
) -> None:
    await store.add_api_key(n.newer, ApiKey(n.u2, n.o1, Tier.FREE, 20.0, n.k2))
    await store.add_api_key(n.older, ApiKey(n.u1, n.o1, Tier.PRO, 10.0, n.k1, "mine"))

    listed = [k for k in await store.list_api_keys() if k.key_id in (n.k1, n.k2)]

    assert listed == [ApiKey(n.u1, n.o1, Tier.PRO, 10.0, n.k1, "mine"),
                      ApiKey(n.u2, n.o1, Tier.FREE, 20.0, n.k2)]  # fmt: skip
    assert not any(n.older in repr(k) or n.newer in repr(k) for k in listed)


async def test_revoking_a_key_holds_at_once_and_keeps_its_first_time(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    await store.add_api_key(n.secret, ApiKey(n.u1, n.o1, Tier.PRO, key_id=n.k1))
    await store.add_api_key(n.other, ApiKey(n.u1, n.o1, Tier.PRO, key_id=n.k2))
    clock.now = 1_700_000_777.0

    assert await store.revoke_api_key(n.k1)
    clock.now += 60
    assert await store.revoke_api_key(n.k1)  # again: still revoked, same time
    assert not await store.revoke_api_key(n.unknown)

    revoked = await store.find_api_key(n.secret)
    assert revoked is not None and revoked.revoked_at == 1_700_000_777.0
    assert revoked.refusal(now=0.0) is not None  # revoked is revoked, whatever the time
    kept = await store.find_api_key(n.other)
    assert kept is not None and kept.revoked_at is None and kept.refusal(now=0.0) is None
    [listed] = [k for k in await store.list_api_keys() if k.key_id == n.k1]
    assert listed.revoked_at == 1_700_000_777.0


async def test_an_expired_key_is_found_and_refused_by_the_check(
    store: ConversationStore, n: Names
) -> None:
    await store.add_api_key(n.secret, ApiKey(n.u1, n.o1, Tier.PRO, 100.0, n.k1,
                                             expires_at=200.0))  # fmt: skip

    found = await store.find_api_key(n.secret)

    assert found is not None and found.expires_at == 200.0
    assert found.refusal(now=199.9) is None
    assert found.refusal(now=200.0) is not None


# --- ownership is (org, user) -----------------------------------------------------------


async def test_the_same_user_id_in_two_orgs_are_two_owners(
    store: ConversationStore, n: Names
) -> None:
    mine = await store.create_conversation(n.c1, n.alice, "acme's", org_id=n.acme)
    theirs = await store.create_conversation(n.c2, n.alice, "globex's", org_id=n.globex)
    await store.add_message(user_message(n.u1, n.c1))
    await store.add_message(user_message(n.u2, n.c1))

    assert (mine.org_id, theirs.org_id) == (n.acme, n.globex)
    assert await store.get_conversation(n.c1) == mine
    listed = await store.list_conversations(n.alice, org_id=n.acme)
    assert [c.conversation_id for c in listed.conversations] == [n.c1]
    listed = await store.list_conversations(n.alice, org_id=n.globex)
    assert [c.conversation_id for c in listed.conversations] == [n.c2]
    assert await store.list_conversations(n.alice, org_id="") == (
        await store.list_conversations(n.nobody, org_id=n.acme))  # fmt: skip

    assert await store.rename_conversation(n.c1, n.alice, "pwned", org_id=n.globex) is None
    assert not await store.select_message(n.c1, n.alice, n.u1, org_id=n.globex)
    assert not await store.delete_conversation(n.c1, n.alice, org_id=n.globex)
    assert not await store.delete_conversation(n.c1, n.alice, org_id="")
    assert await store.get_conversation(n.c1) == mine
    assert (await store.get_tree(n.c1)).leaf_id == n.u2

    renamed = await store.rename_conversation(n.c1, n.alice, "ours", org_id=n.acme)
    assert renamed is not None and (renamed.title, renamed.org_id) == ("ours", n.acme)
    assert await store.select_message(n.c1, n.alice, n.u1, org_id=n.acme)
    assert await store.delete_conversation(n.c1, n.alice, org_id=n.acme)
    assert await store.get_conversation(n.c2) == theirs


async def test_a_request_record_keeps_its_owners_org(store: ConversationStore, n: Names) -> None:
    await store.add_message(user_message(n.u1, n.c1))
    await start(store, n.a1, n.c1, n.u1, org_id=n.globex)

    request = await store.get_request(f"r-{n.a1}")

    assert request is not None and (request.org_id, request.user_id) == (n.globex, "alice")
    owner = ApiKey("alice", n.globex, Tier.FREE)
    assert request.owned_by(owner)
    assert not request.owned_by(replace(owner, org_id=n.acme))
    assert not request.owned_by(replace(owner, user_id="mallory"))


async def test_a_store_without_the_key_secret_lists_and_revokes_but_cannot_hash(
    store: ConversationStore, n: Names
) -> None:
    """The same data through a store opened without a secret (the CLI's list/revoke)."""
    await store.add_api_key(n.secret, ApiKey(n.u1, n.o1, Tier.PRO, key_id=n.k1))
    blind = _without_secret(store)

    with pytest.raises(NoKeySecret):
        await blind.find_api_key(n.secret)
    with pytest.raises(NoKeySecret):
        await blind.add_api_key(n.other, ApiKey(n.u1, n.o1, Tier.PRO))
    assert n.k1 in [k.key_id for k in await blind.list_api_keys()]
    assert await blind.revoke_api_key(n.k1)
    found = await store.find_api_key(n.secret)
    assert found is not None and found.revoked_at is not None


# --- orgs and the response cache --------------------------------------------------------


async def test_an_org_never_set_has_the_defaults_and_a_set_one_keeps_its_last(
    store: ConversationStore, n: Names
) -> None:
    assert await store.get_org_settings(n.acme) == OrgSettings(n.acme, response_cache=False)

    await store.set_org_settings(OrgSettings(n.acme, response_cache=True))
    await store.set_org_settings(OrgSettings(n.globex, response_cache=True))
    await store.set_org_settings(OrgSettings(n.globex, response_cache=False))

    assert await store.get_org_settings(n.acme) == OrgSettings(n.acme, response_cache=True)
    assert await store.get_org_settings(n.globex) == OrgSettings(n.globex, response_cache=False)
    listed = [s for s in await store.list_org_settings() if s.org_id in (n.acme, n.globex)]
    assert listed == sorted([OrgSettings(n.acme, True), OrgSettings(n.globex, False)],
                            key=lambda s: s.org_id)  # fmt: skip


async def test_an_orgs_concurrency_limit_is_kept_and_cleared(
    store: ConversationStore, n: Names
) -> None:
    assert (await store.get_org_settings(n.acme)).max_concurrent_requests is None
    await store.set_org_settings(
        OrgSettings(n.acme, response_cache=True, max_concurrent_requests=5)
    )
    assert await store.get_org_settings(n.acme) == OrgSettings(n.acme, True, 5)
    assert OrgSettings(n.acme, True, 5) in await store.list_org_settings()
    await store.set_org_settings(OrgSettings(n.acme, response_cache=True))
    assert await store.get_org_settings(n.acme) == OrgSettings(n.acme, True, None)


def cached(key: str, org_id: str, clock: Clock, ttl_s: float = 60.0, **fields) -> CachedResponse:
    entry = CachedResponse(key, org_id, "tiny-random", "four", prompt_tokens=12,
                           completion_tokens=2, status=RequestStatus.FINISHED_STOPPED,
                           created_at=clock.now,
                           expires_at=clock.now + ttl_s)  # fmt: skip
    return replace(entry, **fields)


async def test_a_cached_response_is_found_by_its_key_and_org_only(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    entry = cached(n.key, n.acme, clock)
    await store.put_cached_response(entry)

    assert await store.get_cached_response(n.key, n.acme) == entry
    assert await store.get_cached_response(n.key, n.globex) is None
    assert await store.get_cached_response(n.other, n.acme) is None

    newer = replace(entry, content="4", completion_tokens=1,
                    status=RequestStatus.FINISHED_LENGTH)  # fmt: skip
    await store.put_cached_response(newer)
    assert await store.get_cached_response(n.key, n.acme) == newer


async def test_a_cached_response_expires_at_its_time(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    await store.put_cached_response(cached(n.key, n.acme, clock, ttl_s=30.0))
    await store.put_cached_response(cached(n.gone, n.acme, clock, ttl_s=-1.0))

    clock.now += 29.0
    assert await store.get_cached_response(n.key, n.acme) is not None
    assert await store.get_cached_response(n.gone, n.acme) is None
    clock.now += 1.0
    assert await store.get_cached_response(n.key, n.acme) is None
    await store.put_cached_response(cached(n.fresh, n.acme, clock))  # purges the expired
    assert await store.get_cached_response(n.key, n.acme) is None
    assert await store.get_cached_response(n.fresh, n.acme) is not None


def _without_secret(store: ConversationStore) -> ConversationStore:
    """The fixture's store, its key secret taken away (same connection, same data)."""
    blind = copy.copy(store)
    blind._key_secret = None  # type: ignore[attr-defined]
    return blind
