"""A stored answer built from its delivery events: the same for the gateway that relays
the end of a stream and for the recorder that stores any answer no gateway finished.

The gateway stores an answer as `in_progress` before it queues the request and
writes the `AnswerStarted` marker (what the answer is) on `chat.answers`. Delivery
events then make its text as every reader collects one (`schemas.answer.AnswerText`:
the one answer rule; deltas, or a retraction's replacement: what the client saw), and
the end event gives status and usage. Whoever stores it first wins: the store only
finishes an answer still in progress.
"""

from __future__ import annotations

from conversations.store import ConversationStore, NewMessage
from schemas.answer import AnswerText
from schemas.events import (
    AnswerStarted,
    DeliveredToolCall,
    DeliveredToolResult,
    DeliveryDone,
    DeliveryError,
    Event,
    GenerationRequest,
    Role,
    Routed,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import ToolStep


def answer_started(request: GenerationRequest) -> AnswerStarted:
    """The marker the gateway writes before it queues a stored request."""
    return AnswerStarted(
        request_id=request.request_id, attempt=request.attempt,
        conversation_id=request.conversation_id, message_id=request.message_id,
        parent_id=request.parent_id, user_id=request.user_id, model=request.model,
        reply_to=request.reply_to,
    )  # fmt: skip


class AnswerBuilder:
    """One answer's delivery events in, the message to store out."""

    def __init__(self, started: AnswerStarted) -> None:
        self.started = started
        self.text = AnswerText()
        self.log = self.text.log
        self.model = started.model
        self.tool_steps: list[ToolStep] = []

    def add(self, event: Event) -> bool:
        """Take one event of this answer; False if the rule drops it."""
        if not self.text.add(event):
            return False
        match event:
            case Routed():
                self.model = event.model
            case DeliveredToolCall():
                self.tool_steps.append(
                    ToolStep(
                        type="tool_call",
                        id=event.call.id,
                        name=event.call.function.name,
                        arguments=event.call.function.arguments,
                    )
                )
            case DeliveredToolResult():
                self.tool_steps.append(
                    ToolStep(
                        type="tool_result",
                        id=event.call_id,
                        name=event.name,
                        content=event.content,
                        error=event.error,
                    )
                )
        return True

    @property
    def ended(self) -> bool:
        return self.log.ended

    def message(self) -> NewMessage:
        """The answer as it stands: final once ended, else cut short (FINISHED_ERROR)."""
        started, end = self.started, self.log.end
        tokens = prompt_tokens = cached_tokens = 0
        status = RequestStatus.FINISHED_ERROR
        if isinstance(end, DeliveryDone):
            status = end.status
            tokens = end.usage.completion_tokens
            prompt_tokens, cached_tokens = end.usage.prompt_tokens, end.usage.cached_tokens
            self.model = end.model or self.model
        elif end is not None and not isinstance(end, DeliveryError):
            raise TypeError(f"not a delivery end: {end!r}")
        return NewMessage(
            message_id=started.message_id,
            conversation_id=started.conversation_id,
            role=Role.ASSISTANT,
            content=str(self.text),
            parent_id=started.parent_id,
            model=self.model,
            tokens=tokens,
            status=status,
            request_id=started.request_id,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            tool_steps=tuple(self.tool_steps),
        )


async def finish_answer(store: ConversationStore, message: NewMessage) -> bool:
    """Store an ended answer (`ConversationStore.finish_answer`) with its tool steps;
    the steps are saved again by whoever stores it (they replace, the same steps)."""
    if message.tool_steps:
        await store.save_tool_steps(message.conversation_id, message.message_id, message.tool_steps)
    return await store.finish_answer(message)
