"""OpenAI-compatible routes: `GET /v1/models` and `POST /v1/chat/completions`.

A route reads its inputs and calls one service function: the request becomes its
`GenerationRequest` in `protocol`, is admitted and answered in `serving`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.deps import Deps
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.openai.chat_completions.serving import serve_chat_completion
from gateway.openai.embeddings.api_router import served_embedding_model
from gateway.streaming.event_stream import EventStreamResponse
from schemas.api import ChatCompletion, ChatCompletionRequest, ModelCard, ModelList

router = APIRouter(tags=["openai"])


@router.get("/models")
async def list_models(deps: Deps, owner: Owner) -> ModelList:
    """The models served here that the caller's tier may use, then the aliases, then the
    embedding model (`/v1/embeddings`, every tier)."""
    allowed = deps.config.limits.tier_models.get(owner.tier)
    names = [*deps.config.limits.models, *(deps.aliases.names if deps.aliases else ())]
    cards = [ModelCard(id=name) for name in names if allowed is None or name in allowed]
    embedding_model = served_embedding_model(deps)
    if embedding_model is not None:
        cards.append(ModelCard(id=embedding_model))
    return ModelList(data=cards)


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
