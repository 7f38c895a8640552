"""The OpenAI Responses API's routes: `POST /v1/responses`, `GET /v1/responses/{id}` (also
as a stream), `POST /v1/responses/{id}/cancel`, `DELETE /v1/responses/{id}` and
`GET /v1/responses/{id}/input_items`; each calls one function of `serving`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from gateway.deps import Deps
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.openai.responses import serving
from gateway.streaming.event_stream import EventStreamResponse
from schemas.bounds import INT32_MAX
from schemas.responses import ResponseDeleted, ResponseItemList, ResponseObject, ResponseRequest

router = APIRouter(tags=["responses"])

_SSE: dict[int | str, dict[str, Any]] = {200: {"content": {"text/event-stream": {}},
              "description": "the response; with `stream`, its events as SSE"}}  # fmt: skip


@router.post("/responses", response_model=ResponseObject, responses={
    **_SSE, **error_responses(400, 403, 404, 409, 413, 429, 500, 502, 503)})  # fmt: skip
async def create_response(
    body: ResponseRequest, owner: Owner, deps: Deps, request: Request
) -> ResponseObject | EventStreamResponse:
    """A response to `input`: streamed, whole, or at once (`background`)."""
    return await serving.serve_response(body, owner, deps, request)


@router.get("/responses/{response_id}", response_model=ResponseObject,
            responses={**_SSE, **error_responses(404)})  # fmt: skip
async def retrieve_response(
    response_id: str, owner: Owner, deps: Deps, stream: bool = False,
    starting_after: Annotated[int | None, Query(
        ge=-1, le=INT32_MAX,
        description="with `stream`: the events after this sequence number")] = None,
) -> ResponseObject | EventStreamResponse:  # fmt: skip
    """A stored response as it stands; with `stream`, its events (live until its end)."""
    return await serving.read_response(response_id, owner, deps, stream, starting_after)


@router.post("/responses/{response_id}/cancel", response_model=ResponseObject,
             responses=error_responses(404))  # fmt: skip
async def cancel_response(response_id: str, owner: Owner, deps: Deps) -> ResponseObject:
    """Stop a response still being generated; its answer ends `cancelled`."""
    return await serving.cancel(response_id, owner, deps)


@router.delete("/responses/{response_id}", response_model=ResponseDeleted,
               responses=error_responses(404, 409))  # fmt: skip
async def delete_response(response_id: str, owner: Owner, deps: Deps) -> ResponseDeleted:
    """Delete a stored response (cancelled first if still generated) with the input it was
    asked with; 409 if later responses continue it."""
    return await serving.delete_response(response_id, owner, deps)


@router.get("/responses/{response_id}/input_items", response_model=ResponseItemList,
            responses=error_responses(404, 422))  # fmt: skip
async def list_input_items(
    response_id: str, owner: Owner, deps: Deps,
    after: Annotated[str | None, Query(description="the items after this item id")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> ResponseItemList:  # fmt: skip
    """The messages a stored response was asked with, one page at a time."""
    return await serving.input_items(
        response_id, owner, deps, after=after, limit=limit, ascending=order == "asc"
    )
