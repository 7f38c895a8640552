"""Serving the OpenAI Responses API: `POST /v1/responses`, `GET /v1/responses/{id}` (also
as a stream, resumed `starting_after` a sequence number), `POST /v1/responses/{id}/cancel`,
`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.

Mapping onto chatpipe's conversations (so both APIs see one history):

* A stored response (`store`, the default) is a native turn: its input's last user
  message and the assistant message answering it are stored in a conversation, and
  **the response id is `resp_` + that assistant message's id**; its output item's id is
  `msg_` + the same id, and `conversation.id` names the conversation
  (`GET /v1/conversations/{id}` shows the same messages).
* Without `previous_response_id` a new conversation is made; with it, the answer
  continues the conversation of that response, after that answer: a branch beside any
  later turn, as an edit is (the new turn is selected).
* `input` messages before the last are stored before it (`user`, `assistant`);
  `instructions`, and the `system`/`developer` messages of `input`, go after the
  deployment's system prompt for this answer only, as OpenAI does not carry them over.
* `store: false` runs as a chat completion does (no conversation; the history of a
  `previous_response_id` is read, not added to) and is never retrievable. So does a
  response that offers tools, carries function calls or their outputs, or asks for a
  JSON text format (`ResponseRequest.runs_as_completion`): a native turn has no tool
  calls of the client's nor a format, and such clients send the whole input each turn.
  Its `store` is false.
* `background: true` (stored only) answers at once, `queued`; the gateway reads the
  generation to its end (a job of `BackgroundJobs`, cancelled with its conversation) and
  stores it (with `stream`, the answer is streamed as a reader of it). `GET` gives
  its status and, once ended, its output; with `stream=true` it replays the answer's
  events from `chat.answers` on any gateway, live to the end, numbered as
  `gateway.openai.responses.events` says, after `starting_after`. Reading it never cancels
  it; `POST /v1/responses/{id}/cancel` does.
* A response's input items are the messages above its answer back to the generated
  answer before them (`ConversationTree.turn_inputs`); deleting it deletes the answer
  and those of them no other answer needs, never a response another continues.

Admission, limits, quotas, the prompt's window and the input safety check are the
native turn's (`gateway.native.turns.start_reply`) or the completion's
(`gateway.openai.chat_completions.serving.admitted_request`). A request field chatpipe
does not honour is a 400 naming it (`protocol.check_fields`). A response is
its owner's: any other caller gets 404, as for an unknown id.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request

from conversations.store import ApiKey, Conversation, ConversationStore, StoredMessage
from conversations.tree import ConversationTree, generated
from gateway.admission.limits import check_message_count, served_model
from gateway.context.history import prompt_turns
from gateway.deps import GatewayDeps
from gateway.native.conversations import delete as delete_conversation
from gateway.native.messages import stop
from gateway.native.turn_rules import answer_ended
from gateway.native.turns import send_turn, start_reply, store_answer
from gateway.openai.chat_completions.serving import admitted_request
from gateway.openai.responses.events import ResponseEvents, answered, stored
from gateway.openai.responses.protocol import (
    chat_completion,
    check_fields,
    named_as_responses,
    turn_options,
)
from gateway.refusals import InUse, NotFound, Unacceptable, reply_pending
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.generation import (
    INTERRUPTED,
    Generation,
    StreamTimers,
    collected,
    event_stream,
    merged_deltas,
    start_generation,
)
from gateway.streaming.stream_relay import StreamRelay
from schemas import sse
from schemas.events import GenerationRequest, Role, now
from schemas.lifecycle import RequestStatus
from schemas.response_events import ResponseErrorEvent, ResponseEvent
from schemas.responses import (
    ConversationRef,
    ListedInputMessage,
    ListedInputText,
    ListedItem,
    OutputMessage,
    OutputText,
    ResponseDeleted,
    ResponseItemList,
    ResponseObject,
    ResponseRequest,
    ToolChoiceNamed,
    message_id_of,
    response_id,
)


async def serve_response(
    body: ResponseRequest, owner: ApiKey, deps: GatewayDeps, request: Request
) -> ResponseObject | EventStreamResponse:
    """The response to `body`: its fields checked, started stored (a native turn) or not
    (a chat completion), then streamed, whole, or at once (`background`)."""
    check_fields(body, deps.config.limits)
    check_message_count(deps.config.limits, len(body.items))
    if body.store and not body.runs_as_completion:
        head, generation = await _start_stored(deps, owner, body)
    else:
        head, generation = await _start_unstored(deps, owner, body)
    if body.background:
        conversation_id = head.conversation.id if head.conversation is not None else ""
        deps.background.start(
            (f"response {generation.request_id}", conversation_id), _read_to_end(generation)
        )
        if body.stream:
            return await _followed(deps, head, generation.request_id)
        return head.model_copy(update={"status": "queued"})
    if body.stream:
        return event_stream(response_frames(ResponseEvents(head), generation), generation)
    return answered(head, await collected(generation, request))


async def read_response(
    response_id: str, owner: ApiKey, deps: GatewayDeps, stream: bool, starting_after: int | None
) -> ResponseObject | EventStreamResponse:
    """A stored response as it stands; with `stream`, its events after `starting_after`."""
    message, conversation = await owned_response(deps.store, owner, response_id)
    head = await _stored_head(deps.store, message, conversation)
    if not stream:
        return stored(head, message)
    after = -1 if starting_after is None else starting_after
    return await _followed(deps, head, message.request_id or "", after)


async def cancel(response_id: str, owner: ApiKey, deps: GatewayDeps) -> ResponseObject:
    """Stop a response still being generated; its answer ends `cancelled`."""
    message, conversation = await owned_response(deps.store, owner, response_id)
    head = await _stored_head(deps.store, message, conversation)
    if message.status != RequestStatus.IN_PROGRESS or message.request_id is None:
        return stored(head, message)
    await stop(deps, owner, message.request_id)
    return head.model_copy(update={"status": "cancelled"})


async def delete_response(response_id: str, owner: ApiKey, deps: GatewayDeps
                          ) -> ResponseDeleted:  # fmt: skip
    """Delete a stored response: its answer and the input it was asked with, but no
    message another answer hangs below; its conversation too once nothing is left of it.
    A response still being generated is cancelled first. One that later responses
    continue is refused (409 `response_continued`, naming them)."""
    message, conversation = await owned_response(deps.store, owner, response_id)
    cid = conversation.conversation_id
    tree = await deps.store.get_tree(cid)
    later = _continuations(tree, message.message_id)
    if later:
        raise _continued_by(response_id, later, cid)
    if message.status == RequestStatus.IN_PROGRESS and message.request_id is not None:
        await deps.pipeline.cancel(message.request_id, reason="response_deleted")
    doomed = _asked_only_for(tree, message)
    if len(doomed) == len(tree.messages):
        await delete_conversation(deps, owner, cid)
        return ResponseDeleted(id=response_id)
    try:
        await deps.store.delete_messages(cid, [m.message_id for m in doomed])
    except ValueError:  # a turn was added below it meanwhile
        tree = await deps.store.get_tree(cid)
        raise _continued_by(response_id, _continuations(tree, message.message_id), cid) from None
    return ResponseDeleted(id=response_id)


async def input_items(response_id: str, owner: ApiKey, deps: GatewayDeps, *, after: str | None,
                      limit: int, ascending: bool) -> ResponseItemList:  # fmt: skip
    """One page of the messages a stored response was asked with (newest first unless
    `ascending`), after the item `after`: what the store keeps of its input (the
    instructions and system messages are not kept)."""
    message, conversation = await owned_response(deps.store, owner, response_id)
    tree = await deps.store.get_tree(conversation.conversation_id)
    items = [_listed(m) for m in tree.turn_inputs(message.message_id)]
    if not ascending:
        items.reverse()
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise NotFound("item_not_found", f"no input item {after!r} of {response_id!r}",
                           param="after")  # fmt: skip
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return ResponseItemList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=len(items) > limit,
    )


def _continuations(tree: ConversationTree, message_id: str) -> list[str]:
    """The responses that continue the answer `message_id`: the first generated answer
    on each branch below it."""
    found: list[str] = []
    below = list(tree.children(message_id))
    while below:
        child = below.pop(0)
        if generated(child):
            found.append(response_id(child.message_id))
        else:
            below.extend(tree.children(child.message_id))
    return found


def _continued_by(response: str, later: list[str], conversation_id: str) -> InUse:
    named = ", ".join(later[:3]) + (f" and {len(later) - 3} more" if len(later) > 3 else "")
    return InUse(
        "response_continued",
        f"{response} is continued by {named}: delete those first, or the whole "
        f"conversation with DELETE /v1/conversations/{conversation_id}",
    )


def _asked_only_for(tree: ConversationTree, answer: StoredMessage) -> list[StoredMessage]:
    """`answer`, and its input messages from the last up that no other answer needs:
    each one whose only child is the message deleted below it."""
    doomed = [answer]
    for message in reversed(tree.turn_inputs(answer.message_id)):
        if [c.message_id for c in tree.children(message.message_id)] != [doomed[-1].message_id]:
            break
        doomed.append(message)
    return doomed


def _listed(message: StoredMessage) -> ListedItem:
    item_id = f"msg_{message.message_id}"
    if message.role == Role.ASSISTANT:
        return OutputMessage(
            id=item_id, status="completed", content=[OutputText(text=message.content)]
        )
    return ListedInputMessage(id=item_id, content=[ListedInputText(text=message.content)])


async def _followed(deps: GatewayDeps, head: ResponseObject, request_id: str,
                    after: int = -1) -> EventStreamResponse:  # fmt: skip
    """A stored response's events after `after`, read from `chat.answers` (any gateway),
    live to the end; its reader never cancels it. The reader stores the answer before it
    shows the end (as whoever else stores it: the first write wins), so a `GET` after the
    end has been seen finds it ended."""
    record = await deps.store.get_request(request_id)
    if record is None:
        raise _not_found(head.id)
    followed = await deps.pipeline.follow(
        record.request_id, record.conversation_id, record.answers_partition, record.answers_offset
    )
    generation = Generation(
        deps.pipeline,
        record.request_id,
        followed,
        StreamRelay(),
        StreamTimers(deps.config.stream_stall_s, cancels=False),
        on_end=store_answer(deps.store),
    )
    return event_stream(response_frames(ResponseEvents(head, after), generation), generation)


async def owned_response(
    store: ConversationStore, owner: ApiKey, response_id: str, param: str | None = None
) -> tuple[StoredMessage, Conversation]:
    """The stored answer `response_id` names and its conversation, if the caller (org and
    user) owns them; else `response_not_found`."""
    message_id = message_id_of(response_id)
    message = await store.get_message(message_id) if message_id else None
    conversation = None
    if message is not None and message.role == Role.ASSISTANT:
        conversation = await store.get_conversation(message.conversation_id)
    if conversation is None or not conversation.owned_by(owner):
        raise _not_found(response_id, param)
    return message, conversation  # type: ignore[return-value]


async def response_frames(events: ResponseEvents, generation: Generation
                          ) -> AsyncIterator[bytes]:  # fmt: skip
    """The response's stream; what arrived together is written together."""
    yield _frames(events.head())
    async with aclosing(generation.batches()) as batches:
        async for batch in batches:
            shown = [e for event in merged_deltas(batch) for e in events.add(event)]
            if shown:
                yield _frames(shown)
    if not generation.finished:
        yield _frames(
            [
                ResponseErrorEvent(
                    sequence_number=events.last + 1, code="stream_interrupted", message=INTERRUPTED
                )
            ]
        )


def _frames(events: list[ResponseEvent]) -> bytes:
    return b"".join(sse.frame(event.model_dump_json(), event.type) for event in events)


async def _start_stored(deps: GatewayDeps, owner: ApiKey, body: ResponseRequest
                        ) -> tuple[ResponseObject, Generation]:  # fmt: skip
    items = body.messages
    items = [item for item in items if not item.instructs]
    if not items or items[-1].role != "user":
        raise Unacceptable("invalid_input", "input must end with a user message", param="input")
    conversation, thread = await _continued(deps.store, owner, body.previous_response_id)
    turn = await start_reply(deps.turns, owner, conversation, thread, items[-1].text,
                             turn_options(body),
                             earlier=[(Role(item.role), item.text) for item in items[:-1]],
                             instructions=body.all_instructions,
                             new=body.previous_response_id is None)  # fmt: skip
    generation = await send_turn(deps.turns, turn)
    return _head(body, turn.request), generation


async def _continued(store: ConversationStore, owner: ApiKey, previous: str | None
                     ) -> tuple[Conversation, list[StoredMessage]]:  # fmt: skip
    """The conversation a response continues and the thread up to `previous`'s answer;
    without one, a new conversation (not stored yet)."""
    if previous is None:
        return Conversation(
            conversation_id=uuid.uuid4().hex,
            user_id=owner.user_id,
            title="",
            created_at=now(),
            org_id=owner.org_id,
        ), []
    message, conversation = await owned_response(store, owner, previous, "previous_response_id")
    if not answer_ended(message):
        raise reply_pending()
    tree = await store.get_tree(conversation.conversation_id)
    return conversation, tree.path_to(message.message_id)


async def _start_unstored(deps: GatewayDeps, owner: ApiKey, body: ResponseRequest
                          ) -> tuple[ResponseObject, Generation]:  # fmt: skip
    """As a chat completion: the instructions, the previous response's thread, `input`."""
    history: list[StoredMessage] = []
    if body.previous_response_id is not None:
        message, conversation = await owned_response(
            deps.store, owner, body.previous_response_id, "previous_response_id"
        )
        tree = await deps.store.get_tree(conversation.conversation_id)
        history = prompt_turns(tree.path_to(message.message_id))
    model = body.model or served_model(deps.config.limits, None, owner.tier)
    completion = chat_completion(body, history, model)
    with named_as_responses():
        request, ask = await admitted_request(completion, owner, deps)
    generation = await start_generation(
        deps.pipeline, request, deps.live, timers=StreamTimers(deps.config.stream_stall_s),
        lease=ask.leases.claim(),
    )  # fmt: skip
    return _head(body, request), generation


def _head(body: ResponseRequest, request: GenerationRequest) -> ResponseObject:
    """The response as created: in progress, nothing generated yet; its tools, tool
    choice and text format as asked."""
    sampling = request.sampling
    stored = body.store and not body.runs_as_completion
    choice = body.tool_choice
    head = ResponseObject(
        id=response_id(request.message_id), created_at=now(), status="in_progress",
        model=request.alias or request.model, instructions=body.instructions,
        max_output_tokens=sampling.max_tokens, temperature=sampling.temperature,
        top_p=sampling.top_p, previous_response_id=body.previous_response_id,
        store=stored, background=body.background,
        conversation=ConversationRef(id=request.conversation_id) if stored else None,
        tools=[tool.model_dump(exclude_none=True) for tool in body.tools or ()],
        tool_choice=choice.model_dump(exclude_none=True) if isinstance(choice, ToolChoiceNamed)
        else choice or ("auto" if body.tools else "none"),
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )  # fmt: skip
    if body.text is not None and body.text.format is not None:
        head.text = {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)}
    return head


async def _stored_head(store: ConversationStore, message: StoredMessage,
                       conversation: Conversation) -> ResponseObject:  # fmt: skip
    """A stored response as created (what the store keeps of it: no instructions nor
    sampling); its previous response is the generated answer before its input, if any."""
    tree = await store.get_tree(conversation.conversation_id)
    inputs = tree.turn_inputs(message.message_id)
    previous = inputs[0].parent_id if inputs else None
    return ResponseObject(
        id=response_id(message.message_id), created_at=message.created_at,
        status="in_progress", model=message.alias or message.model or "",
        previous_response_id=response_id(previous) if previous else None,
        conversation=ConversationRef(id=conversation.conversation_id))  # fmt: skip


async def _read_to_end(generation: Generation) -> None:
    """A background response's generation, read to its end (then stored)."""
    async with aclosing(generation.events()) as events:
        async for _ in events:
            pass


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound("response_not_found", f"no response {response_id!r}", param=param)
