"""A stored response's items through the official `openai` SDK, on the sim stack:
`input_items.list` pages through the messages it was asked with (the SDK's own
pagination too); `responses.delete` removes a response with its input, refuses one that
later responses continue, cancels one still being generated, and leaves no empty
conversation behind; an input part chatpipe cannot read is a 400 naming its place.
(Another tenant's calls to these routes are tried in tests/e2e/test_cross_tenant.py.)"""

from __future__ import annotations

import openai
import pytest

from tests.support.responses import deltas
from tests.support.stack import client_for
from tests.support.tool_calls import sdk

ASKED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "an answer sent back"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "[[sim:reply=done]] and now?"}]},
]


async def test_input_items_page_through_what_a_response_was_asked_with(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    response = await client.responses.create(model=model, input=ASKED)
    assert response.output_text == "done"

    newest_first = await client.responses.input_items.list(response.id)
    assert [(item.role, item.content[0].text) for item in newest_first.data] == [
        ("user", "[[sim:reply=done]] and now?"),
        ("assistant", "an answer sent back"),
        ("user", "first question"),
    ]  # the system message is this answer's instructions, not kept
    assert newest_first.has_more is False
    assert newest_first.first_id == newest_first.data[0].id
    assert newest_first.last_id == newest_first.data[-1].id

    page = await client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [item.content[0].text for item in page.data] == [
        "first question",
        "an answer sent back",
    ]
    assert page.has_more is True
    rest = await client.responses.input_items.list(
        response.id, order="asc", limit=2, after=page.last_id
    )
    assert [item.content[0].text for item in rest.data] == ["[[sim:reply=done]] and now?"]
    assert rest.has_more is False

    walked = [item.id async for item in client.responses.input_items.list(response.id, limit=1)]
    assert walked == [item.id for item in newest_first.data]

    later = await client.responses.create(
        model=model, input="[[sim:reply=ok]] next", previous_response_id=response.id
    )
    listed = await client.responses.input_items.list(later.id)
    assert [item.content[0].text for item in listed.data] == ["[[sim:reply=ok]] next"]
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.input_items.list(later.id, after="msg_nothing")
    assert unknown.value.body["param"] == "after"


async def test_deleting_responses_from_the_last_to_the_first(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    first = await client.responses.create(model=model, input="[[sim:reply=one]]")
    left = await client.responses.create(
        model=model, input="[[sim:reply=two]]", previous_response_id=first.id
    )
    right = await client.responses.create(
        model=model, input="[[sim:reply=three]]", previous_response_id=first.id
    )
    conversation = f"/v1/conversations/{first.conversation.id}"

    with pytest.raises(openai.ConflictError) as continued:
        await client.responses.delete(first.id)
    assert continued.value.body["code"] == "response_continued"
    assert (
        left.id in continued.value.body["message"] and right.id in continued.value.body["message"]
    )
    assert (await client.responses.retrieve(first.id)).output_text == "one"

    assert await client.responses.delete(left.id) is None
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(left.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(left.id)
    async with client_for(sim_stack) as native:
        kept = (await native.get(conversation)).json()
    assert [m["content"] for m in kept["messages"]] == [
        "[[sim:reply=one]]",
        "one",
        "[[sim:reply=three]]",
        "three",
    ]
    assert kept["thread"] == [m["message_id"] for m in kept["messages"]]

    await client.responses.delete(right.id)
    await client.responses.delete(first.id)
    async with client_for(sim_stack) as native:
        assert (await native.get(conversation)).status_code == 404


async def test_deleting_a_response_still_generated_cancels_it(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    stream = await client.responses.create(
        model=model, input="[[sim:length=2000]]", max_output_tokens=2000, background=True,
        stream=True,
    )  # fmt: skip
    events = []
    async for event in stream:
        events.append(event)
        if len(deltas(events)) >= 3:
            break
    response_id = events[0].response.id
    await client.responses.delete(response_id)
    async for event in stream:  # the reader sees the generation end: it was cancelled
        events.append(event)
    assert (events[-1].type, events[-1].response.status) == ("response.incomplete", "cancelled")
    assert len(deltas(events).split()) < 2000
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response_id)
    async with client_for(sim_stack) as native:
        gone = await native.get(f"/v1/conversations/{events[0].response.conversation.id}")
        assert gone.status_code == 404
    again = await client.responses.create(model=model, input="[[sim:reply=still here]]")
    assert again.output_text == "still here"


@pytest.mark.parametrize(("content", "param"), [
    ([{"type": "input_text", "text": "what is this?"},
      {"type": "input_image", "image_url": "https://example.com/cat.png"}],
     "input.0.content.1.type"),
    ([{"type": "input_file", "file_id": "file-1"}], "input.0.content.0.type"),
])  # fmt: skip
async def test_a_part_chatpipe_cannot_read_is_a_400_naming_its_place(sim_stack, content, param):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=model, input=[{"role": "user", "content": content}])
    assert (refused.value.body["code"], refused.value.body["param"]) == (
        "unsupported_content",
        param,
    )
