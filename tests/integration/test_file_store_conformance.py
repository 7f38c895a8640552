"""`FileStore` (`conversations.files`) behaves the same in every conversation store:
the stores, names and clock of `test_store_conformance`."""

from __future__ import annotations

import asyncio

from conversations.files import FileChunk, StoredFile
from conversations.store import ConversationStore
from schemas.files import Citation
from schemas.tools import ToolStep
from tests.support.conformance import Clock, Names


def a_file(file_id: str, user_id: str, org_id: str, chunks: int = 2, **fields) -> StoredFile:
    return StoredFile(file_id=file_id, org_id=org_id, user_id=user_id,
                      filename=fields.pop("filename", "notes.md"), content_type="text/markdown",
                      purpose="assistants", size_bytes=1234, chunk_count=chunks,
                      embedding_model="all-MiniLM-L6-v2", **fields)  # fmt: skip


def chunks_of(file_id: str, count: int = 2, tag: str = "") -> list[FileChunk]:
    return [FileChunk(file_id, i, f"{tag}chunk {i} of {file_id}", bytes([i]) * 8)
            for i in range(count)]  # fmt: skip


async def test_a_file_round_trips_with_its_chunks_in_order(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    stored = await store.add_file(a_file(n.f1, n.alice, n.org, 3), chunks_of(n.f1, 3)[::-1])

    assert stored == a_file(n.f1, n.alice, n.org, 3, created_at=clock.now)
    assert await store.get_file(n.f1) == stored
    assert await store.file_chunks([n.f1]) == chunks_of(n.f1, 3)
    assert await store.get_file(n.nothing) is None
    assert await store.file_chunks([n.nothing]) == []


async def test_a_files_name_is_stored_as_it_is_shown(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    sent = a_file(n.f1, n.alice, n.org, filename="\x1b[2Jinvoice\u202efdp\u2066.exe\x85")
    stored = await store.add_file(sent, chunks_of(n.f1))

    shown = a_file(n.f1, n.alice, n.org, filename="[2Jinvoicefdp.exe", created_at=clock.now)
    assert stored == shown
    assert await store.get_file(n.f1) == shown
    assert await store.list_files(n.alice, org_id=n.org) == [shown]


async def test_add_file_is_idempotent_on_its_id(store: ConversationStore, n: Names) -> None:
    first = await store.add_file(a_file(n.f1, n.alice, n.org), chunks_of(n.f1))
    again = await store.add_file(a_file(n.f1, n.alice, n.org, filename="other.txt"),
                                 chunks_of(n.f1, tag="new "))  # fmt: skip

    assert again == first
    assert await store.file_chunks([n.f1]) == chunks_of(n.f1)
    assert [f.file_id for f in await store.list_files(n.alice, org_id=n.org)] == [n.f1]


async def test_chunks_of_several_files_come_file_by_file(
    store: ConversationStore, n: Names
) -> None:
    await store.add_file(a_file(n.f1, n.alice, n.org), chunks_of(n.f1))
    await store.add_file(a_file(n.f2, n.alice, n.org, 3), chunks_of(n.f2, 3))

    found = await store.file_chunks([n.f2, n.f1, n.f2])
    assert [(c.file_id, c.chunk_index) for c in found] == [
        (n.f2, 0),
        (n.f2, 1),
        (n.f2, 2),
        (n.f1, 0),
        (n.f1, 1),
    ]


async def test_files_are_listed_per_owner_newest_first(
    store: ConversationStore, n: Names, clock: Clock
) -> None:
    for file_id, user_id, org_id in [
        (n.f1, n.alice, n.org),
        (n.f2, n.alice, n.org),
        (n.f3, n.bob, n.org),
        (n.f4, n.alice, n.other_org),
    ]:
        clock.now += 1
        await store.add_file(a_file(file_id, user_id, org_id), chunks_of(file_id))

    assert [f.file_id for f in await store.list_files(n.alice, org_id=n.org)] == [n.f2, n.f1]
    assert [f.file_id for f in await store.list_files(n.bob, org_id=n.org)] == [n.f3]
    assert [f.file_id for f in await store.list_files(n.alice, org_id=n.other_org)] == [n.f4]
    assert await store.list_files(n.nobody, org_id=n.org) == []


async def test_only_the_owner_deletes_a_file_and_its_chunks(
    store: ConversationStore, n: Names
) -> None:
    await store.add_file(a_file(n.f1, n.alice, n.org), chunks_of(n.f1))
    await store.add_file(a_file(n.keep, n.alice, n.org), chunks_of(n.keep))

    assert not await store.delete_file(n.f1, n.mallory, org_id=n.org)
    assert not await store.delete_file(n.f1, n.alice, org_id=n.other_org)
    assert not await store.delete_file(n.f1, n.alice, org_id="")
    assert await store.get_file(n.f1) is not None
    assert await store.delete_file(n.f1, n.alice, org_id=n.org)
    assert not await store.delete_file(n.f1, n.alice, org_id=n.org)

    assert await store.get_file(n.f1) is None
    assert await store.file_chunks([n.f1]) == []
    assert [f.file_id for f in await store.list_files(n.alice, org_id=n.org)] == [n.keep]
    assert await store.file_chunks([n.keep]) == chunks_of(n.keep)


async def test_of_two_concurrent_deletes_one_wins(store: ConversationStore, n: Names) -> None:
    await store.add_file(a_file(n.f1, n.alice, n.org), chunks_of(n.f1))

    results = await asyncio.gather(*(store.delete_file(n.f1, n.alice, org_id=n.org)
                                     for _ in range(2)))  # fmt: skip
    assert sorted(results) == [False, True]


async def test_citations_are_kept_per_answer(store: ConversationStore, n: Names) -> None:
    first = [Citation(n.f1, "a.md", 0, 0.75, "the start"), Citation(n.f2, "b.pdf", 3, 0.5, "…")]
    await store.save_citations(n.c1, n.a1, first)
    await store.save_citations(n.c1, n.a2, first[1:])
    await store.save_citations(n.c1, n.a2, first[:1])  # replaces
    await store.save_citations(n.c2, n.a3, first)

    assert await store.list_citations(n.c1) == {n.a1: first, n.a2: first[:1]}
    assert await store.list_citations(n.nothing) == {}


async def test_tool_steps_are_kept_per_answer(store: ConversationStore, n: Names) -> None:
    steps = [
        ToolStep(
            type="tool_call", id="call_1", name="calculator", arguments='{"expression": "6*7"}'
        ),
        ToolStep(type="tool_result", id="call_1", name="calculator", content='{"result": 42}'),
        ToolStep(
            type="tool_result",
            id="call_2",
            name="clock",
            content='{"error": "unknown time zone"}',
            error=True,
        ),
    ]
    await store.save_tool_steps(n.c1, n.a1, steps)
    await store.save_tool_steps(n.c1, n.a2, steps[1:])
    await store.save_tool_steps(n.c1, n.a2, steps[:1])  # replaces
    await store.save_tool_steps(n.c2, n.a3, steps)

    assert await store.list_tool_steps(n.c1) == {n.a1: steps, n.a2: steps[:1]}
    assert await store.list_tool_steps(n.nothing) == {}
