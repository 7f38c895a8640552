"""Checks of one request against what this deployment serves and allows."""

from __future__ import annotations

from pydantic import ValidationError

from chatpipe.settings import Settings
from gateway.errors import ApiError
from schemas.events import SamplingOptions


def served_model(settings: Settings, requested: str | None) -> str:
    """The model to run: the one asked for, or the default; 404 if not served here."""
    if requested is None:
        return settings.model_name
    if requested not in settings.models:
        raise ApiError(
            404, "model_not_found", f"model {requested!r} is not served here", param="model"
        )
    return requested


def check_message(settings: Settings, content: str, *, allow_empty: bool = False) -> None:
    if not allow_empty and not content.strip():
        raise ApiError(400, "empty_message", "the message is empty", param="content")
    if len(content) > settings.max_message_chars:
        raise ApiError(
            413,
            "message_too_long",
            f"a message holds at most {settings.max_message_chars} characters",
            param="content",
        )


def sampling_options(
    settings: Settings,
    *,
    max_tokens: int | None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = False,
) -> SamplingOptions:
    """SamplingOptions from request fields; unset fields take the defaults."""
    if max_tokens is not None and max_tokens > settings.max_tokens_limit:
        raise ApiError(
            422,
            "max_tokens_too_large",
            f"max_tokens is at most {settings.max_tokens_limit}",
            param="max_tokens",
        )
    given = {"temperature": temperature, "top_p": top_p, "seed": seed}
    try:
        return SamplingOptions(
            max_tokens=settings.default_max_tokens if max_tokens is None else max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            **{name: value for name, value in given.items() if value is not None},
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"])
        raise ApiError(422, "invalid_request", f"{param}: {error['msg']}", param=param) from exc
