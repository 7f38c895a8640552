"""OpenAI's models API: `GET /v1/models` and `GET /v1/models/{model}`.

A model here is what a request may name: a served chat model, an alias the gateway
routes to its versions, or the embedding model. Each card says its `kind` (a field
OpenAI lacks and its SDKs keep as an extra), so a client can offer chat models only.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import Deps, GatewayDeps
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.openai.embeddings.api_router import served_embedding_model
from gateway.refusals import NotFound
from schemas.api import ModelCard, ModelList
from schemas.topics import Tier

router = APIRouter(tags=["openai"])


def model_cards(deps: GatewayDeps, tier: Tier) -> list[ModelCard]:
    """The models served here that `tier` may use, then the aliases, then the embedding
    model (`/v1/embeddings`, every tier); each `created` when this gateway started."""
    allowed = deps.config.limits.tier_models.get(tier)
    names = [*deps.config.limits.models, *(deps.aliases.names if deps.aliases else ())]
    cards = [
        ModelCard(id=name, created=deps.started_at, kind="chat")
        for name in names
        if allowed is None or name in allowed
    ]
    embedding_model = served_embedding_model(deps)
    if embedding_model is not None:
        cards.append(ModelCard(id=embedding_model, created=deps.started_at, kind="embedding"))
    return cards


@router.get("/models")
async def list_models(deps: Deps, owner: Owner) -> ModelList:
    """The models the caller may name (`model_cards`)."""
    return ModelList(data=model_cards(deps, owner.tier))


@router.get("/models/{model:path}", responses=error_responses(404))
async def retrieve_model(model: str, deps: Deps, owner: Owner) -> ModelCard:
    """One model the caller may name; `model_not_found` for any other."""
    card = next((card for card in model_cards(deps, owner.tier) if card.id == model), None)
    if card is None:
        raise NotFound("model_not_found", f"model {model!r} is not served here", param="model")
    return card
