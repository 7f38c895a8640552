"""One request lifecycle: states, terminal states and the OpenAI finish_reason map."""

from __future__ import annotations

from enum import StrEnum


class RequestStatus(StrEnum):
    WAITING = "waiting"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    IN_PROGRESS = "in_progress"
    """A stored answer still streaming (the store's view of waiting/dispatched/running)."""
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"
    FINISHED_FILTERED = "finished_filtered"

    @property
    def is_finished(self) -> bool:
        return self in _OPENAI_FINISH_REASON

    @property
    def is_answered(self) -> bool:
        """The model ended the answer itself or at its length limit (not cut short)."""
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)

    @property
    def openai_finish_reason(self) -> str | None:
        """The `finish_reason` an OpenAI client expects; None while running."""
        return _OPENAI_FINISH_REASON.get(self)


_OPENAI_FINISH_REASON: dict[RequestStatus, str] = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "stop",
    RequestStatus.FINISHED_ERROR: "error",
    RequestStatus.FINISHED_FILTERED: "content_filter",
}
