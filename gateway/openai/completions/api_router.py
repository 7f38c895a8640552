"""`POST /v1/completions`: OpenAI's legacy text completions, prompt in, text out.

The route reads its inputs and calls one service function: the request becomes its
`GenerationRequest` in `protocol`, is admitted and answered in `serving`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.deps import Deps
from gateway.edge.auth import Owner
from gateway.openai.chat_completions.api_router import STREAMED_COMPLETION
from gateway.openai.completions.serving import serve_completion
from gateway.streaming.event_stream import EventStreamResponse
from schemas.api import CompletionRequest, TextCompletion

router = APIRouter(tags=["openai"])


@router.post("/completions", response_model=TextCompletion, responses=STREAMED_COMPLETION)
async def completions(
    body: CompletionRequest, owner: Owner, deps: Deps, request: Request
) -> TextCompletion | EventStreamResponse:
    return await serve_completion(body, owner, deps, request)
