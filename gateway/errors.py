"""One error shape for every failure: `{"error": {"code", "message", "type", "param"}}`.

Bad input is always a 4xx: malformed JSON → 400, a field that fails validation
→ 422, a limit → its own status (413, 404 model_not_found, …). Over a rate limit,
a token budget or the key's concurrent generations → 429 `rate_limited` /
`quota_exceeded` / `too_many_concurrent_requests`, with Retry-After.
A message is written here or by a stage for the client: no exception's own text
ever reaches one (an unexpected error is 500 `internal_error`, logged).

The gateway's decisions refuse in the domain's words (`gateway.refusals.Refused`);
`STATUS` is the one place that gives each kind of refusal its HTTP status. `ApiError`
is for what speaks HTTP already: keys, rate limits and budgets, the routes' own checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.embedding_process import EmbedderGone
from gateway.refusals import (
    InUse,
    Invalid,
    NotAllowed,
    NotFound,
    NotYet,
    Refused,
    TooLarge,
    Unacceptable,
    Unavailable,
)
from schemas.api import ErrorBody, ErrorDetail
from schemas.events import DeliveryError

EMBEDDER_RESTART_S = 5
"""Retry-After of a call the embedding process died under: about how long the next one
takes to load the model."""

_MEANING = {
    400: "malformed JSON, or a request this route refuses (the code says why)",
    401: "missing or unknown API key",
    403: "the caller's tier may not use this model",
    404: "no such resource of the caller's, or model not served",
    408: "the request's body did not arrive in time",
    409: "the previous answer is still streaming, or later responses continue this one",
    413: "the body, a message, the prompt or the request is too large",
    422: "a field fails validation",
    429: "over a rate limit, a token budget or the key's concurrent requests (Retry-After)",
    500: "the answer failed in the pipeline",
    502: "the answer stopped before its end",
    503: "overloaded or the pipeline is unavailable (Retry-After)",
}


STATUS: dict[type[Refused], int] = {
    Unacceptable: 400,
    NotAllowed: 403,
    NotFound: 404,
    NotYet: 409,
    InUse: 409,
    TooLarge: 413,
    Invalid: 422,
    Unavailable: 503,
}
"""The HTTP status of each kind of refusal."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` for the error statuses a route can answer, each an ErrorBody."""
    return {status: {"model": ErrorBody, "description": _MEANING[status]} for status in statuses}


_TYPE_BY_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    return "server_error" if status >= 500 else "invalid_request_error"


class ApiError(HTTPException):
    """An HTTP error with a machine-readable code, rendered as `ErrorBody`."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status_code, message, dict(headers) if headers else None)
        self.code = code
        self.param = param

    @property
    def detail_body(self) -> ErrorDetail:
        return ErrorDetail(
            code=self.code, message=self.detail, type=error_type(self.status_code), param=self.param
        )


def refusal_response(refused: Refused) -> JSONResponse:
    """The answer to a refused request: its kind's status, its code and message, and
    Retry-After when waiting may help."""
    status = STATUS[type(refused)]
    detail = ErrorDetail(code=refused.code, message=refused.message, type=error_type(status),
                         param=refused.param)  # fmt: skip
    headers = None if refused.retry_after_s is None else {"Retry-After": str(refused.retry_after_s)}
    return error_response(status, detail, headers)


def error_response(
    status: int, detail: ErrorDetail, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(ErrorBody(error=detail).model_dump(), status_code=status, headers=headers)


def from_delivery_error(error: DeliveryError) -> ApiError:
    """A pipeline failure for a caller still waiting on a plain HTTP answer."""
    if error.retry_after is not None:
        retry_after = str(max(1, round(error.retry_after)))
        return ApiError(503, error.code, error.message, headers={"Retry-After": retry_after})
    return ApiError(500, error.code, error.message)


def _field(loc: Sequence[Any]) -> str | None:
    path = [str(part) for part in loc if part not in ("body", "query", "path", "header")]
    return ".".join(path) or None


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    if any(error["type"] == "json_invalid" for error in errors):
        detail = ErrorDetail(
            code="invalid_json",
            message="request body is not valid JSON",
            type=error_type(400),
        )
        return error_response(400, detail)
    message = "; ".join(f"{_field(error['loc']) or 'body'}: {error['msg']}" for error in errors)
    first = _field(errors[0]["loc"]) if errors else None
    detail = ErrorDetail(code="invalid_request", message=message, type=error_type(422), param=first)
    return error_response(422, detail)


def _unparsed_body(exc: StarletteHTTPException) -> str | None:
    """Why FastAPI could not parse a JSON body that is not malformed JSON as such (it
    answers those with a bare 400 "There was an error parsing the body", raised from the
    parser's error); None for any other HTTP error."""
    if exc.status_code != 400 or isinstance(exc, ApiError):
        return None
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return "request body nests arrays or objects deeper than the JSON parser goes"
    if isinstance(cause, UnicodeDecodeError):
        return "request body is not UTF-8"
    if isinstance(cause, ValueError):  # the parser's other refusal: over 4,300 digits
        return "request body holds a number too long to read"
    return None


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc, ApiError):
        return error_response(exc.status_code, exc.detail_body, exc.headers)
    if (why := _unparsed_body(exc)) is not None:
        return error_response(400, ErrorDetail(code="invalid_json", message=why,
                                               type=error_type(400)))  # fmt: skip
    try:
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
    except ValueError:
        code = "http_error"
    message = _no_route(request, exc) or str(exc.detail)
    detail = ErrorDetail(code=code, message=message, type=error_type(exc.status_code))
    return error_response(exc.status_code, detail, exc.headers)


SHOWN_PATH_CHARS = 200


def _no_route(request: Request, exc: StarletteHTTPException) -> str | None:
    """The message of the router's own 404 and 405, naming the route asked for (its path
    cut at `SHOWN_PATH_CHARS`); None for any other HTTP error."""
    path = request.url.path
    shown = path if len(path) <= SHOWN_PATH_CHARS else path[:SHOWN_PATH_CHARS] + "…"
    route = f"{request.method} {shown}"
    if exc.status_code == 404 and exc.detail == HTTPStatus.NOT_FOUND.phrase:
        return f"no route {route}"
    if exc.status_code == 405 and exc.detail == HTTPStatus.METHOD_NOT_ALLOWED.phrase:
        allowed = (exc.headers or {}).get("Allow")
        return f"no route {route}" + (f"; its path takes {allowed}" if allowed else "")
    return None


async def _on_refused(request: Request, exc: Refused) -> JSONResponse:
    return refusal_response(exc)


async def _on_embedder_gone(request: Request, exc: EmbedderGone) -> JSONResponse:
    return refusal_response(
        Unavailable("embedding_unavailable", str(exc), retry_after_s=EMBEDDER_RESTART_S)
    )


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises the exception after this answer, so the server still logs it.
    detail = ErrorDetail(code="internal_error", message="internal error", type=error_type(500))
    return error_response(500, detail)


def install_error_handlers(app: FastAPI) -> None:
    # Starlette's stubs type every handler as taking Exception, though it calls each one
    # only with the class it was registered for.
    app.add_exception_handler(RequestValidationError, _on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Refused, _on_refused)  # type: ignore[arg-type]
    app.add_exception_handler(EmbedderGone, _on_embedder_gone)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected_error)
