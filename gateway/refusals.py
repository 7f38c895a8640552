"""Why a request is turned down: `Refused` and its kinds, in the domain's words. They
say nothing of HTTP; `gateway.errors` gives each kind its status, in one table.
"""

from __future__ import annotations


class Refused(Exception):
    """A request turned down: `code` (the reason a client matches on), a message for
    its user, the request field at fault (`param`), and when a retry may succeed
    (`retry_after_s`, None: not by waiting)."""

    def __init__(self, code: str, message: str, *, param: str | None = None,
                 retry_after_s: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s


class Unacceptable(Refused):
    """Not something this request can ask for, as sent (an empty or blocked message,
    an edit of an answer)."""


class NotFound(Refused):
    """No such thing of the caller's: a conversation, message, request or model."""


class NotAllowed(Refused):
    """The caller's tier may not use it."""


class NotYet(Refused):
    """It waits on something still under way (the previous answer)."""


class InUse(Refused):
    """Something else depends on it (a response that later responses continue)."""


class TooLarge(Refused):
    """A message, the prompt or the whole request is over a limit."""


class Invalid(Refused):
    """A field's value is outside what it may be."""


class Unavailable(Refused):
    """The pipeline cannot take it now (overloaded, unreachable)."""


def reply_pending() -> NotYet:
    return NotYet("reply_pending",
                  "the previous message is still being answered; retry when it is done",
                  retry_after_s=1)  # fmt: skip


def pipeline_unavailable() -> Unavailable:
    return Unavailable("pipeline_unavailable", "the request could not be queued", retry_after_s=5)


def safety_unavailable() -> Unavailable:
    """The input classifiers gave no verdict (the judge failed): neither passed nor
    blocked, the caller may try again."""
    return Unavailable(
        "safety_unavailable", "the safety check could not run; try again", retry_after_s=5
    )
