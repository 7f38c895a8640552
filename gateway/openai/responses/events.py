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
from schemas.responses import (
    RESPONSE_ID_PREFIX,
    ContentPartEvent,
    IncompleteDetails,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseEvent,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponseUsage,
    TextDeltaEvent,
    TextDoneEvent,
    response_status,
)

HEAD = 4
"""Events before the first delta."""

_END_EVENT = {"completed": "response.completed", "failed": "response.failed"}


def item_id(response: ResponseObject) -> str:
    """The id of the response's one output item: `msg_` and its message id."""
    return "msg_" + response.id.removeprefix(RESPONSE_ID_PREFIX)


def ended(response: ResponseObject, text: str, status: RequestStatus, usage: Usage | None,
          error: ResponseError | None = None) -> ResponseObject:  # fmt: skip
    """`response` once its answer has ended with `status` and `text`."""
    state, reason = response_status(status)
    if state == "failed" and error is None:
        error = ResponseError(code="server_error", message="the answer failed")
    item = OutputMessage(
        id=item_id(response),
        content=[OutputText(text=text)],
        status="completed" if state == "completed" else "incomplete",
    )
    return response.model_copy(update={
        "status": state, "output": [item], "error": error,
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
            return ended(response, str(answer), status, end.usage)
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
        return self._after([
            ResponseLifecycleEvent(type="response.created", sequence_number=0,
                                   response=self.response),
            ResponseLifecycleEvent(type="response.in_progress", sequence_number=1,
                                   response=in_progress),
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
            case Delta() if not self.answer.retracted:
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
        [item] = final.output
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
