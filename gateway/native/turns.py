"""Native chat turns: a posted, edited or regenerated message in, the GenerationRequest
that answers it out.

Each turn is checked and admitted first (its fields, the files it names — the
caller's only —, the caller's tier, budgets and rate limits: nothing expensive yet),
then reads the conversation's message tree, finds the excerpts of its files
(`gateway.native.grounding`), builds the prompt with the context builder from the thread it
continues and those excerpts,
checks that the request fits the bus and that its input passes the safety
classifiers, and only then stores its user message (a regeneration has none) and
makes the request (not yet sent):

* post — a new user message after the selected thread's last message;
* edit — a new user message beside the edited one (same parent): a fork;
* regenerate — a new answer beside the old one, to the same user message;
* reply — a new user message after any thread, with the messages the client sent
  before it and instructions for this answer only (the Responses API's turn).

The store selects each new message under its parent, so the thread follows
the newest branch until the user selects another. A post that comes while the
thread's last answer still streams waits for it (`settled_tree`: the decisions are
`gateway.native.turn_rules`', the waiting `wait_for` on an injected sleep and clock).

Turns take `Turns`, what they are served with; the routes build it from `GatewayDeps`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from common.durable import retried
from conversations.answers import answer_started, finish_answer
from conversations.store import (
    ApiKey,
    Conversation,
    ConversationStore,
    NewMessage,
    RequestRecord,
    StoredMessage,
)
from conversations.tree import ConversationTree
from gateway.admission.gates import Admission, Ask
from gateway.admission.leases import Leases
from gateway.admission.limits import check_bus_size, check_message, choose_model, sampling_options
from gateway.admission.rate_limits import admission_tokens, text_tokens
from gateway.config import GatewayConfig
from gateway.context.builder import ContextBuilder
from gateway.context.summaries import fallback_title
from gateway.context.window import BuiltContext
from gateway.native.background import OwnRequests, start_summary
from gateway.native.grounding import NO_GROUNDING, Grounding, ground, named_files
from gateway.native.server_tools import server_tool_use, with_server_tools
from gateway.native.turn_rules import (
    answer_ended,
    check_room,
    edit_thread,
    pending_answer,
    regenerated_question,
)
from gateway.pipeline import Pipeline, owner_request
from gateway.refusals import Refused, pipeline_unavailable, reply_pending
from gateway.rollout import ModelAliases, ModelChoice
from gateway.streaming.generation import (
    Generation,
    LiveRequests,
    OnEnd,
    StreamTimers,
    start_generation,
)
from gateway.streaming.stream_relay import StreamRelay
from retrieval.documents import Documents
from schemas.api import PostMessage, TurnOptions
from schemas.events import GenerationRequest, Role, SamplingOptions, now
from schemas.files import Citation
from schemas.generation import new_id
from schemas.lifecycle import RequestStatus
from schemas.tools import ToolUse


@dataclass(frozen=True, slots=True)
class Turns:
    """What native turns are served with: the conversations' store, the pipeline, the
    prompt's builder, admission's gates, the gateway's own requests (summaries), the
    requests being relayed (who may cancel them), the gateway's configuration, and the
    users' documents (None: no turn can name files)."""

    config: GatewayConfig
    store: ConversationStore
    pipeline: Pipeline
    context: ContextBuilder
    admission: Admission
    own: OwnRequests
    live: LiveRequests
    documents: Documents | None = None
    aliases: ModelAliases | None = None
    """Model aliases and their weighted versions (`gateway.rollout`); None: none."""


@dataclass(frozen=True, slots=True)
class Turn:
    request: GenerationRequest
    user_message: StoredMessage
    """The message answered: new for a post or an edit, the old one for a regeneration."""
    owner: ApiKey
    first: bool = False
    """The conversation's first exchange: it gets a title once answered."""
    citations: tuple[Citation, ...] = ()
    """The chunks of the user's files its prompt carries."""
    leases: Leases = field(default_factory=Leases, compare=False)
    """Its place among its key's concurrent requests, taken at admission (none: no
    limit); its generation holds it to its end."""


async def start_turn(
    turns: Turns, owner: ApiKey, conversation: Conversation, post: PostMessage
) -> Turn:
    """A new user message at the end of the selected thread."""
    check_message(turns.config.limits, post.content)
    tool_use = server_tool_use(turns.config.server_tools, post.tool_choice)
    files = await named_files(turns.store, owner, post.file_ids)
    choice, sampling = _answer_options(turns, owner, post, conversation)
    charged = text_tokens([post.content], sampling.max_tokens)
    ask = await turns.admission.admit(owner, charged, choice.model)
    tree = await settled_tree(turns.store, conversation.conversation_id, turns.config)
    grounding = await ground(turns.documents, files, post.content)
    turn = await _new_user_turn(turns, owner, conversation, tree.thread(), post.content,
                                choice, sampling, ask, grounding,
                                first=not tree.messages)  # fmt: skip
    return _tooled(turns, turn, tool_use)


async def start_edit(
    turns: Turns, owner: ApiKey, conversation: Conversation, message_id: str,
    post: PostMessage,
) -> Turn:  # fmt: skip
    """A new version of user message `message_id`: its sibling, answered after the
    thread up to their parent."""
    check_message(turns.config.limits, post.content)
    tool_use = server_tool_use(turns.config.server_tools, post.tool_choice)
    files = await named_files(turns.store, owner, post.file_ids)
    choice, sampling = _answer_options(turns, owner, post, conversation)
    charged = text_tokens([post.content], sampling.max_tokens)
    ask = await turns.admission.admit(owner, charged, choice.model)
    thread = edit_thread(await turns.store.get_tree(conversation.conversation_id), message_id)
    grounding = await ground(turns.documents, files, post.content)
    turn = await _new_user_turn(turns, owner, conversation, thread, post.content, choice,
                                sampling, ask, grounding)  # fmt: skip
    return _tooled(turns, turn, tool_use)


async def start_regenerate(
    turns: Turns, owner: ApiKey, conversation: Conversation, message_id: str,
    options: TurnOptions,
) -> Turn:  # fmt: skip
    """Another answer to the user message that `message_id` answers (or to
    `message_id` itself, a user message): a sibling of the earlier answers. The question
    is classified again: the model asked for now may have stricter rules."""
    tool_use = server_tool_use(turns.config.server_tools, options.tool_choice)
    files = await named_files(turns.store, owner, options.file_ids)
    choice, sampling = _answer_options(turns, owner, options, conversation)
    model = choice.model
    charged = text_tokens([], sampling.max_tokens)
    ask = await turns.admission.admit(owner, charged, choice.model)
    tree = await turns.store.get_tree(conversation.conversation_id)
    question = regenerated_question(tree, message_id)
    thread = tree.path_to(question.message_id)
    grounding = await ground(turns.documents, files, question.content)
    built = await _build(
        turns.context,
        turns.store,
        conversation.conversation_id,
        thread,
        None,
        model,
        sampling,
        grounding.documents,
    )
    await turns.admission.settle(ask, admission_tokens(built.messages, sampling.max_tokens))
    request = _request(turns, owner, conversation, question.message_id, choice, sampling, built,
                       grounding)  # fmt: skip
    check_bus_size(turns.config.limits, request)
    await turns.admission.check_input(owner, model, [question.content])
    _ask_for_summary(turns.own, owner, model, built)
    return _tooled(
        turns,
        Turn(
            request=request,
            user_message=question,
            owner=owner,
            citations=grounding.citations,
            leases=ask.leases,
        ),
        tool_use,
    )


def _tooled(turns: Turns, turn: Turn, tool_use: ToolUse | None) -> Turn:
    """`turn` with its request offered the server tools of `tool_use` (if any)."""
    if tool_use is None:
        return turn
    request = with_server_tools(turn.request, turns.config.server_tools, tool_use)
    return dataclasses.replace(turn, request=request)


async def start_reply(
    turns: Turns, owner: ApiKey, conversation: Conversation, thread: list[StoredMessage],
    content: str, options: TurnOptions, *, earlier: Sequence[tuple[Role, str]] = (),
    instructions: str | None = None, new: bool = False,
) -> Turn:  # fmt: skip
    """A user message `content` after `thread` (a branch of `conversation`, root first),
    after the messages the client sent before it (`earlier`: stored too, in order),
    answered with the client's `instructions` after the system prompt (this answer
    only: not stored). `new`: `conversation` is not stored yet; it is once the turn
    has passed every check, so a refused one leaves nothing behind."""
    limits = turns.config.limits
    check_message(limits, content)
    for text in (*(text for _, text in earlier), instructions or ""):
        check_message(limits, text, allow_empty=True)
    choice, sampling = _answer_options(turns, owner, options, conversation)
    said = [content, *(text for _, text in earlier), *([instructions] if instructions else [])]
    charged = text_tokens(said, sampling.max_tokens)
    ask = await turns.admission.admit(owner, charged, choice.model)
    return await _new_user_turn(turns, owner, conversation, thread, content, choice, sampling,
                                ask, NO_GROUNDING, first=not thread, earlier=earlier,
                                instructions=instructions, new=new)  # fmt: skip


async def send_turn(turns: Turns, turn: Turn) -> Generation:
    """Store the answer as in progress with where its events start, then queue it (its
    generation holding the turn's lease). If queueing fails, the answer is stored as
    failed so the next turn can go on."""
    request = turn.request
    try:
        partition, offset = await turns.pipeline.start_answer(request)
    except Exception as exc:
        raise pipeline_unavailable() from exc
    await turns.store.start_answer(
        NewMessage(message_id=request.message_id, conversation_id=request.conversation_id,
                   role=Role.ASSISTANT, content="", parent_id=turn.user_message.message_id,
                   model=request.model, status=RequestStatus.IN_PROGRESS,
                   request_id=request.request_id, alias=request.alias),
        RequestRecord(request_id=request.request_id, conversation_id=request.conversation_id,
                      message_id=request.message_id, user_id=request.user_id,
                      org_id=request.org_id,
                      answers_partition=partition, answers_offset=offset,
                      reply_to=request.reply_to),
    )  # fmt: skip
    if turn.citations:
        await turns.store.save_citations(
            request.conversation_id, request.message_id, turn.citations
        )
    relay = StreamRelay(answer_started(request))
    try:
        return await start_generation(
            turns.pipeline,
            request,
            turns.live,
            relay,
            native_timers(turns.config),
            store_answer(turns.store),
            turn.leases.claim(),
        )
    except Refused:
        failed = relay.answer()
        assert failed is not None
        await turns.store.finish_answer(failed)
        raise


def native_timers(config: GatewayConfig) -> StreamTimers:
    """Native streams are held for a resume when their client drops them."""
    return StreamTimers(config.stream_stall_s, config.resume_grace_s)


STORE_END_FOR_S = 10.0
"""How long the end of a stream waits for a store that fails; the recorder stores the
answer later if this gives up."""


def store_answer(store: ConversationStore) -> OnEnd:
    """Stores a stream's answer once it has ended, before the end is shown."""

    async def finish(relay: StreamRelay) -> None:
        answer = relay.answer()
        if answer is not None:
            await retried(
                lambda: finish_answer(store, answer),
                f"storing the end of {answer.message_id}",
                STORE_END_FOR_S,
            )

    return finish


async def _new_user_turn(
    turns: Turns, owner: ApiKey, conversation: Conversation, thread: list[StoredMessage],
    content: str, choice: ModelChoice, sampling: SamplingOptions, ask: Ask,
    grounding: Grounding, *, first: bool = False, earlier: Sequence[tuple[Role, str]] = (),
    instructions: str | None = None, new: bool = False,
) -> Turn:  # fmt: skip
    """Store `content` as a user message after `thread` (and the `earlier` messages
    before it) and answer it (the turn was admitted as `ask`), from the
    excerpts of `grounding`; `start_reply` says what the rest is."""
    cid = conversation.conversation_id
    model = choice.model
    thread = [*thread, *_unsaved(cid, thread, earlier)]
    pending = thread[len(thread) - len(earlier) :]
    built = await _build(
        turns.context,
        turns.store,
        cid,
        thread,
        content,
        model,
        sampling,
        grounding.documents,
        instructions,
    )
    await turns.admission.settle(ask, admission_tokens(built.messages, sampling.max_tokens))
    user_message_id = new_id()
    request = _request(turns, owner, conversation, user_message_id, choice, sampling, built,
                       grounding)  # fmt: skip
    # Before the message is stored: a refused turn leaves no unanswered message behind.
    check_bus_size(turns.config.limits, request)
    await turns.admission.check_input(
        owner,
        model,
        [*(m.content for m in pending), content, *([instructions] if instructions else [])],
    )
    if new:
        await turns.store.create_conversation(cid, owner.user_id, org_id=owner.org_id)
    for message in pending:
        await turns.store.add_message(NewMessage(
            message_id=message.message_id, conversation_id=cid, role=message.role,
            content=message.content, parent_id=message.parent_id))  # fmt: skip
    user_message = await turns.store.add_message(
        NewMessage(
            message_id=user_message_id,
            conversation_id=cid,
            role=Role.USER,
            content=content,
            parent_id=thread[-1].message_id if thread else None,
        )
    )
    if first:
        await turns.store.set_auto_title(cid, fallback_title(content))
    _ask_for_summary(turns.own, owner, model, built)
    return Turn(
        request=request,
        user_message=user_message,
        owner=owner,
        first=first,
        citations=grounding.citations,
        leases=ask.leases,
    )


def _answer_options(
    turns: Turns, owner: ApiKey, options: TurnOptions, conversation: Conversation
) -> tuple[ModelChoice, SamplingOptions]:
    """The model (an alias's version for this conversation) and sampling of a turn."""
    limits = turns.config.limits
    choice = choose_model(
        limits, turns.aliases, options.model, owner.tier, conversation.conversation_id
    )
    sampling = sampling_options(
        limits,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        seed=options.seed,
        ignore_eos=options.ignore_eos,
    )
    return choice, sampling


def _unsaved(conversation_id: str, thread: list[StoredMessage],
             earlier: Sequence[tuple[Role, str]]) -> list[StoredMessage]:  # fmt: skip
    """`earlier` as the messages they will be once stored, each after the one before."""
    messages: list[StoredMessage] = []
    parent = thread[-1].message_id if thread else None
    for role, content in earlier:
        messages.append(
            StoredMessage(
                message_id=new_id(),
                conversation_id=conversation_id,
                seq=0,
                role=role,
                content=content,
                parent_id=parent,
                model=None,
                tokens=0,
                status=RequestStatus.FINISHED_STOPPED,
                request_id=None,
                created_at=now(),
            )
        )
        parent = messages[-1].message_id
    return messages


async def _build(
    context: ContextBuilder, store: ConversationStore, conversation_id: str,
    thread: list[StoredMessage], new_message: str | None, model: str,
    sampling: SamplingOptions, documents: str | None = None, instructions: str | None = None,
) -> BuiltContext:  # fmt: skip
    """The prompt, refused if the system prompt, summary, excerpts of the user's files
    and new message alone pass the window less max_tokens."""
    built = await context.build(
        store,
        conversation_id,
        thread,
        new_message,
        model=model,
        max_tokens=sampling.max_tokens,
        documents=documents,
        instructions=instructions,
    )
    check_room(built, model, sampling.max_tokens)
    return built


def _ask_for_summary(own: OwnRequests, owner: ApiKey, model: str, built: BuiltContext) -> None:
    if built.summary_job is not None:
        start_summary(own, owner, model, built.summary_job)


def _request(
    turns: Turns, owner: ApiKey, conversation: Conversation, question_id: str,
    choice: ModelChoice, sampling: SamplingOptions, built: BuiltContext, grounding: Grounding,
) -> GenerationRequest:  # fmt: skip
    """The turn's request, carrying the files it named (`grounding.file_ids`)."""
    request = owner_request(owner, model=choice.model, alias=choice.alias,
                            messages=built.messages, sampling=sampling,
                            reply_to=turns.pipeline.reply_to,
                            timeout_s=turns.config.request_timeout_s, sent_at=now(),
                            conversation_id=conversation.conversation_id,
                            parent_id=question_id, store=True)  # fmt: skip
    if not grounding.file_ids:
        return request
    return request.model_copy(update={"file_ids": grounding.file_ids})


FIRST_LOOK_S = 0.02
LAST_LOOK_S = 0.25
"""How often a waiting turn looks again: at first, and at most (doubling between)."""


async def settled_tree(
    store: ConversationStore, conversation_id: str, config: GatewayConfig, *,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    clock: Callable[[], float] = anyio.current_time,
) -> ConversationTree:  # fmt: skip
    """The conversation's tree once the thread's last answer has ended: a next turn that
    comes quickly waits for it up to `config.reply_wait_s`, then is refused
    `reply_pending`."""
    tree = await store.get_tree(conversation_id)
    pending = pending_answer(tree.thread(), now(), config.request_timeout_s)
    if pending is None:
        return tree

    async def ended() -> bool:
        return answer_ended(await store.get_message(pending))

    settled = False
    with anyio.move_on_after(config.reply_wait_s):  # a store read that hangs is cut off too
        settled = await wait_for(ended, config.reply_wait_s, sleep=sleep, clock=clock)
    if not settled:
        raise reply_pending()
    return await store.get_tree(conversation_id)


async def wait_for(
    ended: Callable[[], Awaitable[bool]], wait_s: float, *,
    sleep: Callable[[float], Awaitable[None]], clock: Callable[[], float],
) -> bool:  # fmt: skip
    """Ask `ended` until it says so (True) or `wait_s` has passed on `clock` (False),
    sleeping between asks from `FIRST_LOOK_S`, doubling up to `LAST_LOOK_S`."""
    deadline = clock() + wait_s
    delay = FIRST_LOOK_S
    while not await ended():
        left = deadline - clock()
        if left <= 0:
            return False
        await sleep(min(delay, left))
        delay = min(delay * 2, LAST_LOOK_S)
    return True
