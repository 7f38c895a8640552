"""A user's files over HTTP through the whole pipeline (sim engine, the bundled
all-MiniLM-L6-v2): upload, list, read and delete by their owner only; bad uploads
refused with a JSON error; a turn naming files gets the most relevant chunk in the
prompt the engine receives, and its answer cites it in the stream and when read back."""

from __future__ import annotations

import openai
import pytest

from chatpipe.dev_stack import API_KEY
from chatpipe.wiring import Stack
from tests.support.chat import read_sse
from tests.support.conversations import (
    by_id,
    error_code,
    new_conversation,
    queued_request,
    recorded,
    sse_post,
)
from tests.support.documents import hostile_pdf, pdf_of
from tests.support.files import LIGHTHOUSE, owners, upload
from tests.support.stack import client_for

BREAD = (
    "A simple loaf of bread\nMix flour, water, salt and yeast, knead it for ten minutes,\n"
    "let the dough rise for an hour and bake it at 220 degrees."
)


async def test_files_are_uploaded_listed_and_deleted_by_their_owner_only(
    sim_stack: Stack,
) -> None:
    owner, stranger = await owners(sim_stack)
    async with owner, stranger:
        response = await upload(owner, "lighthouse.md", LIGHTHOUSE.encode(), "text/markdown")
        assert response.status_code == 200, response.text
        stored = response.json()
        assert stored["id"].startswith("file-") and stored["object"] == "file"
        assert (stored["filename"], stored["bytes"], stored["purpose"]) == (
            "lighthouse.md",
            len(LIGHTHOUSE.encode()),
            "assistants",
        )
        assert stored["content_type"] == "text/markdown" and stored["chunks"] >= 1
        pdf = (await upload(owner, "bread.pdf", pdf_of(*BREAD.split("\n")))).json()
        assert pdf["content_type"] == "application/pdf"

        listed = (await owner.get("/v1/files")).json()
        assert [f["id"] for f in listed["data"]] == [pdf["id"], stored["id"]]
        assert not listed["has_more"] and listed["last_id"] == stored["id"]
        first = (await owner.get("/v1/files", params={"limit": 1, "order": "asc"})).json()
        assert [f["id"] for f in first["data"]] == [stored["id"]] and first["has_more"]
        rest = (
            await owner.get(
                "/v1/files", params={"limit": 1, "order": "asc", "after": first["last_id"]}
            )
        ).json()
        assert [f["id"] for f in rest["data"]] == [pdf["id"]] and not rest["has_more"]
        assert (await owner.get(f"/v1/files/{stored['id']}")).json() == stored

        assert (await stranger.get("/v1/files")).json()["data"] == []
        for method in ("GET", "DELETE"):
            refused = await stranger.request(method, f"/v1/files/{stored['id']}")
            assert error_code(refused, 404) == "file_not_found"

        deleted = await owner.delete(f"/v1/files/{stored['id']}")
        assert deleted.json() == {"id": stored["id"], "object": "file", "deleted": True}
        assert error_code(await owner.get(f"/v1/files/{stored['id']}"), 404) == "file_not_found"
        assert error_code(await owner.delete(f"/v1/files/{stored['id']}"), 404)
        assert await sim_stack.store.file_chunks([stored["id"]]) == []
        assert [f["id"] for f in (await owner.get("/v1/files")).json()["data"]] == [pdf["id"]]


async def test_bad_uploads_are_refused_with_a_json_error(sim_stack: Stack) -> None:
    limit = sim_stack.settings.files.max_file_bytes
    filler = "A paragraph of filler words."
    many_paragraphs = "\n\n".join([filler] * 30_000).encode()  # 900,000 characters
    too_much_text = "\n\n".join([filler] * 40_000).encode()
    async with client_for(sim_stack) as client:
        cases = [
            (await upload(client, "photo.png", b"\x89PNG\r\n\x1a\n"), 400,
             "unsupported_file_type"),
            (await upload(client, "notes.txt", b"\xff\xfe\xfa broken"), 400, "unreadable_file"),
            (await upload(client, "empty.md", b""), 400, "unreadable_file"),
            (await upload(client, "scan.pdf", b"%PDF-1.7 garbage"), 400, "unreadable_file"),
            (await upload(client, "big.txt", b"x" * (limit + 1)), 413, "file_too_large"),
            (await upload(client, "huge.txt", b"x" * (limit + (1 << 20))), 413,
             "body_too_large"),
            (await upload(client, "long.txt", many_paragraphs), 413, "too_many_chunks"),
            (await upload(client, "longer.txt", too_much_text), 413, "file_text_too_long"),
            (await upload(client, "bomb.pdf", hostile_pdf()), 413, "file_too_complex"),
            (await upload(client, "notes.txt", b"text", purpose="fine-tune"), 422,
             "invalid_request"),
            (await client.post("/v1/files", data={"purpose": "assistants"}), 422,
             "invalid_request"),
        ]  # fmt: skip
        for response, status, code in cases:
            assert response.status_code == status, response.text
            assert response.headers["content-type"].startswith("application/json")
            assert response.json()["error"]["code"].startswith(code), response.text


async def test_a_turn_with_file_ids_answers_from_the_top_chunk_and_cites_it(
    sim_stack: Stack,
) -> None:
    owner, stranger = await owners(sim_stack)
    async with owner, stranger:
        lighthouse = (await upload(owner, "lighthouse.md", LIGHTHOUSE.encode())).json()
        bread = (await upload(owner, "bread.pdf", pdf_of(BREAD))).json()
        cid = await new_conversation(owner)
        result = await sse_post(owner, f"/v1/conversations/{cid}/messages", {
            "content": "[[sim:reply=At dusk.]] When does Anna light the lamp?",
            "file_ids": [bread["id"], lighthouse["id"]], "max_tokens": 16})  # fmt: skip
        assert result.ended_with_done and result.text == "At dusk."

        kinds = [e.event for e in result.events]
        assert kinds.index("citations") < kinds.index("delta")
        cited = result.of("citations")[0].json()["citations"]
        top = cited[0]
        assert (top["file_id"], top["filename"]) == (lighthouse["id"], "lighthouse.md")
        assert lighthouse["chunks"] > 1
        chunks = await sim_stack.store.file_chunks([lighthouse["id"]])
        assert "lights the great\nlamp" in chunks[top["chunk_index"]].text
        assert top["score"] == max(c["score"] for c in cited) > 0.3

        request = await queued_request(sim_stack, result.request["request_id"])
        system_prompt, *_, excerpts, question = request.messages
        assert system_prompt.content == sim_stack.settings.context.system_prompt
        assert excerpts.role == "system"
        assert (
            f"[1] lighthouse.md (chunk {top['chunk_index']})\n"
            f"{chunks[top['chunk_index']].text}" in excerpts.content
        )
        assert question.content.endswith("When does Anna light the lamp?")

        tree = await recorded(owner, cid, result.request["message_id"])
        answer = by_id(tree)[result.request["message_id"]]
        assert answer["citations"] == cited
        assert by_id(tree)[result.request["user_message_id"]]["citations"] == []

        async with owner.stream("GET", f"/v1/requests/{result.request['request_id']}/events"
                                ) as replayed:  # fmt: skip
            resumed = await read_sse(replayed)
        assert [e.json() for e in resumed if e.event == "citations"] == [{"citations": cited}]

        again = await sse_post(
            owner,
            f"/v1/conversations/{cid}/messages/{answer['message_id']}/regenerate",
            {"file_ids": [lighthouse["id"]], "max_tokens": 16},
        )
        assert again.ended_with_done
        assert again.of("citations")[0].json()["citations"][0] == top

        # someone else's file, or none at all: refused before anything is stored or queued
        other = await new_conversation(stranger)
        for file_ids in ([lighthouse["id"]], ["file-nonexistent"]):
            refused = await stranger.post(
                f"/v1/conversations/{other}/messages", json={"content": "hi", "file_ids": file_ids}
            )
            assert error_code(refused, 404) == "file_not_found"
        assert (await stranger.get(f"/v1/conversations/{other}")).json()["messages"] == []


async def test_the_openai_sdk_uploads_lists_reads_and_deletes_files(sim_stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=f"{sim_stack.base_url}/v1", api_key=API_KEY)
    created = await client.files.create(file=("notes.md", LIGHTHOUSE.encode(), "text/markdown"),
                                        purpose="assistants")  # fmt: skip
    assert created.id.startswith("file-") and created.filename == "notes.md"
    assert created.bytes == len(LIGHTHOUSE.encode()) and created.purpose == "assistants"

    assert created.id in [f.id async for f in client.files.list()]
    assert (await client.files.retrieve(created.id)).filename == "notes.md"
    deleted = await client.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.files.create(file=("photo.png", b"\x89PNG\r\n", "image/png"),
                                  purpose="assistants")  # fmt: skip
    assert refused.value.code == "unsupported_file_type"
