"""What a client learns when a tool round cannot be handed on.

A round's own failures (a tool that raises, a result that is not JSON) are the model's
error results (`servertools.toolbox`); this is for the rest: its results or next round
could not be built or sent. The answer ends with a stable code and a fixed message; the
exception stays in the stage's log and on `chat.dlq`.
"""

from __future__ import annotations

from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE, RecordRejected

TOOL_ROUND_FAILED = "tool_round_failed"
TOOL_ROUND_FAILED_MESSAGE = "the server tools could not go on with this answer; send it again"


def round_error(exc: BaseException) -> tuple[str, str]:
    """The code and message a round that raised `exc` ends its answer with: never the
    exception's text. `pipeline_rejected` when the bus refused one of its records (a
    next round over the bus's limit: sending it again fails the same way)."""
    if isinstance(exc, RecordRejected):
        return PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE
    return TOOL_ROUND_FAILED, TOOL_ROUND_FAILED_MESSAGE
