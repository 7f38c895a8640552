"""OpenAI-compatible route: `POST /v1/chat/completions`.

A route reads its inputs and calls one service function: the request becomes its
`GenerationRequest` in `protocol`, is admitted and answered in `serving`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.deps import Deps
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.openai.chat_completions.serving import serve_chat_completion
from gateway.streaming.event_stream import EventStreamResponse
from schemas.api import ChatCompletion, ChatCompletionRequest

router = APIRouter(tags=["openai"])


STREAMED_COMPLETION = {
    200: {"content": {"text/event-stream": {}},
          "description": "the completion; with `stream`, its chunks as SSE"},
    **error_responses(400, 403, 404, 413, 429, 500, 502, 503)}  # fmt: skip
"""The answers of a completion route (chat or text): JSON, or SSE when streamed."""


@router.post("/chat/completions", response_model=ChatCompletion, responses=STREAMED_COMPLETION)
async def chat_completions(
    completion: ChatCompletionRequest, owner: Owner, deps: Deps, request: Request
) -> ChatCompletion | EventStreamResponse:
    return await serve_chat_completion(completion, owner, deps, request)
