"""A response's stream events and its final state, from its answer's delivery events
(pure: the Responses API's stream core).

Every event is numbered (`sequence_number`) so that the same answer read again — a
background response's stream resumed from `chat.answers` on any gateway — gets the
same numbers, and `starting_after=N` shows exactly the events after N:

* 0 `response.created`, 1 `response.in_progress`, 2 `response.output_item.added`,
  3 `response.content_part.added`;
* a delta at answer position `s` (the native stream's `id:`, stable across attempts
  and replays) is `HEAD + s`; deltas read together are merged and numbered by the last;
* the end at position `e`: `response.output_text.done`, `response.content_part.done`,
  `response.output_item.done` and `response.completed` (or `response.incomplete`:
  cut at `max_output_tokens`, retracted by the safety stage, cancelled) are
  `HEAD + e` to `HEAD + e + 3`; a failure is one `response.failed` at `HEAD + e`.

A response that offers tools holds its answer back (it may be a call, known only at
its end): its head is `response.created` and `response.in_progress` (0, 1), and its
end at position `e` sends each output item whole — `response.output_item.added`, a
message's `content_part.added`, one `output_text.delta`, `output_text.done` and
`content_part.done`, or a call's `function_call_arguments.delta` and `.done`, then
`response.output_item.done` — numbered on from `HEAD + e`, then the lifecycle end.

Numbers grow but may skip (positions do). The text follows the one answer rule
(`AnswerText`): a retraction replaces it with the policy's replacement, which the
`done` events carry (deltas already sent cannot be taken back), status `incomplete`,
reason `content_filter`.
"""

from __future__ import annotations

from conversations.store import StoredMessage
from schemas.answer import AnswerText
from schemas.events import DeliverEvent, DeliveryDone, DeliveryError, Delta, Usage
from schemas.lifecycle import RequestStatus
from schemas.response_events import (
    ContentPartEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    OutputItemEvent,
    ResponseEvent,
    ResponseLifecycleEvent,
    TextDeltaEvent,
    TextDoneEvent,
)
from schemas.responses import (
    RESPONSE_ID_PREFIX,
    FunctionCallItem,
    IncompleteDetails,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
    response_status,
)
from schemas.tools import ToolCalls

HEAD = 4
"""Events before the first delta."""

_END_EVENT = {"completed": "response.completed", "failed": "response.failed"}


def item_id(response: ResponseObject) -> str:
    """The id of the response's one output item: `msg_` and its message id."""
    return "msg_" + response.id.removeprefix(RESPONSE_ID_PREFIX)


def ended(response: ResponseObject, text: str, status: RequestStatus, usage: Usage | None,
          error: ResponseError | None = None, calls: ToolCalls | None = None
          ) -> ResponseObject:  # fmt: skip
    """`response` once its answer has ended with `status` and `text`, or with the
    function `calls` (after a message of the text beside them, if any)."""
    state, reason = response_status(status)
    if state == "failed" and error is None:
        error = ResponseError(code="server_error", message="the answer failed")
    done = "completed" if state == "completed" else "incomplete"
    message = OutputMessage(id=item_id(response), content=[OutputText(text=text)], status=done)
    output: list[OutputMessage | FunctionCallItem] = [message]
    if calls is not None:
        output = [
            *([message.model_copy(update={"content": [OutputText(text=calls.content)]})]
              if calls.content else []),
            *(FunctionCallItem(type="function_call", id="fc_" + call.id.removeprefix("call_"),
                               call_id=call.id, name=call.function.name,
                               arguments=call.function.arguments, status=done)
              for call in calls.calls),
        ]  # fmt: skip
    return response.model_copy(update={
        "status": state, "output": output, "error": error,
        "incomplete_details": IncompleteDetails(reason=reason) if reason else None,
        "usage": ResponseUsage.of(usage) if usage is not None else None})  # fmt: skip


def answered(response: ResponseObject, answer: AnswerText) -> ResponseObject:
    """`response` as its collected answer ended (`answer.end` is set)."""
    match end := answer.end:
        case DeliveryError():
            return ended(
                response, str(answer), RequestStatus.FINISHED_ERROR, None, ResponseError.of(end)
            )
        case DeliveryDone():
            status = RequestStatus.FINISHED_FILTERED if answer.retracted else end.status
            calls = None if answer.retracted else end.tool_calls
            return ended(response, str(answer), status, end.usage, calls=calls)
    raise ValueError("the answer has not ended")


def stored(response: ResponseObject, message: StoredMessage) -> ResponseObject:
    """`response` as its stored assistant message stands now."""
    state, _ = response_status(message.status)
    if state == "in_progress":
        return response.model_copy(update={"status": "in_progress"})
    usage = Usage(
        prompt_tokens=message.prompt_tokens,
        completion_tokens=message.tokens,
        cached_tokens=message.cached_tokens,
    )
    return ended(response, message.content, message.status, usage)


class ResponseEvents:
    """The stream events of one response, those numbered after `after` only."""

    def __init__(self, response: ResponseObject, after: int = -1) -> None:
        """`response`: as created (in progress, no output)."""
        self.response = response
        self.after = after
        self.held = bool(response.tools) and response.tool_choice != "none"
        """It offers the model tools: its items are sent whole at the end."""
        self.answer = AnswerText()
        self.item_id = item_id(response)
        self.last = -1
        """The highest sequence number made so far (shown or not)."""

    @property
    def final(self) -> ResponseObject | None:
        """The response once its answer has ended."""
        return answered(self.response, self.answer) if self.answer.end is not None else None

    def head(self) -> list[ResponseEvent]:
        in_progress = self.response.model_copy(update={"status": "in_progress"})
        lifecycle: list[ResponseEvent] = [
            ResponseLifecycleEvent(type="response.created", sequence_number=0,
                                   response=self.response),
            ResponseLifecycleEvent(type="response.in_progress", sequence_number=1,
                                   response=in_progress),
        ]  # fmt: skip
        if self.held:
            return self._after(lifecycle)
        return self._after([
            *lifecycle,
            OutputItemEvent(type="response.output_item.added", sequence_number=2,
                            item=OutputMessage(id=self.item_id)),
            ContentPartEvent(type="response.content_part.added", sequence_number=3,
                             item_id=self.item_id, part=OutputText()),
        ])  # fmt: skip

    def add(self, event: DeliverEvent) -> list[ResponseEvent]:
        """The events `event` makes (none for queue updates, routing, a retraction)."""
        if not self.answer.add(event):
            return []
        match event:
            case Delta() if not self.answer.retracted and not self.held:
                return self._after(
                    [
                        TextDeltaEvent(
                            sequence_number=HEAD + event.seq, item_id=self.item_id, delta=event.text
                        )
                    ]
                )
            case DeliveryDone() | DeliveryError():
                return self._after(self._end(HEAD + event.seq))
        return []

    def _end(self, first: int) -> list[ResponseEvent]:
        final = self.final
        assert final is not None
        end = ResponseLifecycleEvent(
            type=_END_EVENT.get(final.status, "response.incomplete"),
            sequence_number=first,
            response=final,
        )
        if final.status == "failed":
            return [end]
        if self.held:
            items = [e for i, item in enumerate(final.output) for e in _whole_item(i, item)]
            numbered = [e.model_copy(update={"sequence_number": first + n})
                        for n, e in enumerate([*items, end])]  # fmt: skip
            return numbered
        [item] = final.output
        assert isinstance(item, OutputMessage)
        [part] = item.content
        return [
            TextDoneEvent(sequence_number=first, item_id=self.item_id, text=part.text),
            ContentPartEvent(type="response.content_part.done", sequence_number=first + 1,
                             item_id=self.item_id, part=part),
            OutputItemEvent(type="response.output_item.done", sequence_number=first + 2,
                            item=item),
            end.model_copy(update={"sequence_number": first + 3}),
        ]  # fmt: skip

    def _after(self, events: list[ResponseEvent]) -> list[ResponseEvent]:
        self.last = max([self.last, *(event.sequence_number for event in events)])
        return [event for event in events if event.sequence_number > self.after]


def _whole_item(index: int, item: OutputMessage | FunctionCallItem) -> list[ResponseEvent]:
    """The events of one output item sent whole (numbered by the caller)."""
    item_id = item.id or ""
    if isinstance(item, FunctionCallItem):
        body: list[ResponseEvent] = [
            FunctionCallArgumentsDeltaEvent(sequence_number=0, item_id=item_id,
                                            output_index=index, delta=item.arguments),
            FunctionCallArgumentsDoneEvent(sequence_number=0, item_id=item_id, output_index=index,
                                           name=item.name, arguments=item.arguments),
        ]  # fmt: skip
        added: OutputMessage | FunctionCallItem = item.model_copy(
            update={"arguments": "", "status": "in_progress"}
        )
    else:
        [part] = item.content
        part_event = ContentPartEvent(
            type="response.content_part.added",
            sequence_number=0,
            item_id=item_id,
            output_index=index,
            part=OutputText(),
        )
        body = [
            part_event,
            *([TextDeltaEvent(sequence_number=0, item_id=item_id, output_index=index,
                              delta=part.text)] if part.text else []),
            TextDoneEvent(sequence_number=0, item_id=item_id, output_index=index, text=part.text),
            part_event.model_copy(update={"type": "response.content_part.done", "part": part}),
        ]  # fmt: skip
        added = OutputMessage(id=item_id)
    return [
        OutputItemEvent(type="response.output_item.added", sequence_number=0,
                        output_index=index, item=added),
        *body,
        OutputItemEvent(type="response.output_item.done", sequence_number=0,
                        output_index=index, item=item),
    ]  # fmt: skip
