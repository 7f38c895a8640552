"""`POST /v1/embeddings`, served in the gateway by its embedding model (all-MiniLM-L6-v2,
bundled, unless `CHATPIPE_EMBEDDING_MODEL` names another), the one retrieval loads.

The gateway runs it rather than a worker stage: the model is small (22 M parameters,
~90 MB, on the CPU), it needs no GPU slot, no queue position and no stream, and the
gateway already holds it for retrieval, so one copy serves both. The encoding runs in
the gateway's embedding process (`common.embedding_process`), a batch of texts at a
time, callers in turn (`retrieval.documents.embed`): the event loop, and so every
stream this gateway relays, never waits on it, and a turn's retrieval waits for one
batch of each other caller at most.

Order, as for a generation: the fields (pure, charging nothing), the model's own limits
(`dimensions`), the budgets and rate limits (charged from an estimate, characters / 4),
then each text's tokens (the rest charged: a refused text stays charged) and the vectors.
"""

from __future__ import annotations

import asyncio
import base64
import uuid

import numpy as np
from fastapi import APIRouter

from common.embeddings import EmbeddingModel, embedding_model_name, to_bytes
from conversations.store import ApiKey
from gateway.admission.rate_limits import text_tokens
from gateway.deps import Deps, GatewayDeps
from gateway.edge.auth import Owner
from gateway.errors import error_responses
from gateway.openai.chat_completions.protocol import check_known_fields
from gateway.refusals import NotFound, TooLarge, Unacceptable
from retrieval.documents import embed
from schemas.api import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from schemas.events import UsageEvent
from schemas.lifecycle import RequestStatus

router = APIRouter(tags=["openai"])

EMBEDDING_WORKER = "gateway-embeddings"
"""`worker_id` of an embedding's usage: the gateway made it, no worker."""


@router.post("/embeddings", responses=error_responses(400, 404, 413, 422, 429, 503))
async def create_embeddings(body: EmbeddingRequest, owner: Owner, deps: Deps) -> EmbeddingList:
    name = served_embedding_model(deps)
    texts = embedding_inputs(body, name, deps.config.max_embedding_inputs)
    assert name is not None, "embedding_inputs refuses a request when no model is served"
    model = await deps.context.embedding_model()  # loaded once, in a thread
    if not isinstance(model, EmbeddingModel):
        raise _not_served(body.model)
    check_dimensions(body.dimensions, model)
    estimated = text_tokens(texts, 0)
    ask = await deps.admission.admit(owner, estimated, name, generations=0)
    counts = await asyncio.to_thread(model.token_counts, texts)
    await deps.admission.settle(ask, sum(counts))
    check_input_tokens(counts, model.max_input_tokens, name)
    vectors = await embed(model, texts)  # in batches: a turn's retrieval gets a turn
    await deps.pipeline.usage(embedding_usage(owner, name, sum(counts)))
    return embedding_list(vectors, counts, name, body.encoding_format)


def embedding_usage(owner: ApiKey, model: str, tokens: int) -> UsageEvent:
    """What an embedding request bills, on `chat.usage` as a generation's usage: its
    input tokens as prompt tokens, no completion, no engine slot (`gpu_ms` 0). Its own
    request id; no conversation."""
    return UsageEvent(
        request_id=f"emb-{uuid.uuid4().hex}", conversation_id="", user_id=owner.user_id,
        org_id=owner.org_id, tier=owner.tier, model=model, worker_id=EMBEDDING_WORKER,
        status=RequestStatus.FINISHED_STOPPED, prompt_tokens=tokens, completion_tokens=0,
        cached_tokens=0, gpu_ms=0.0)  # fmt: skip


def served_embedding_model(deps: GatewayDeps) -> str | None:
    """The embedding model's id (`GET /v1/models` lists it), None where none is served."""
    if not deps.context.embeds:
        return None
    return embedding_model_name(deps.config.context.embedding_model)


def embedding_inputs(body: EmbeddingRequest, served: str | None, max_inputs: int) -> list[str]:
    """The texts to embed; refused unless `body` has only OpenAI's fields (400), names
    the embedding model (404), gives
    text (token arrays are another model's tokens: 400), none of it empty (400), and at
    most `max_inputs` texts (413)."""
    check_known_fields(body)
    if served is None or body.model != served:
        raise _not_served(body.model)
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise Unacceptable("empty_input", "input holds no text", param="input")
    if not all(isinstance(text, str) for text in texts):
        raise Unacceptable(
            "unsupported_input",
            "token arrays are not taken: send the text (a string or a list of strings)",
            param="input",
        )
    empty = next((index for index, text in enumerate(texts) if not text), None)
    if empty is not None:
        raise Unacceptable(
            "empty_input",
            "an input is empty",
            param="input" if isinstance(body.input, str) else f"input.{empty}",
        )
    if len(texts) > max_inputs:
        raise TooLarge(
            "too_many_inputs", f"one request embeds at most {max_inputs} texts", param="input"
        )
    return texts  # type: ignore[return-value]  # every item is a str, checked above


def check_dimensions(dimensions: int | None, model: EmbeddingModel) -> None:
    """Vectors are the model's own length: shortening them is refused, not ignored."""
    if dimensions is not None and dimensions != model.dimensions:
        raise Unacceptable(
            "unsupported_dimensions",
            f"{model.name} makes vectors of {model.dimensions} dimensions only",
            param="dimensions",
        )


def check_input_tokens(counts: list[int], max_tokens: int, name: str) -> None:
    """A text longer than the model reads would be embedded cut short: refused instead."""
    for index, count in enumerate(counts):
        if count > max_tokens:
            raise TooLarge(
                "input_too_long",
                f"input {index} has {count} tokens; {name} reads at most {max_tokens}",
                param=f"input.{index}",
            )


def embedding_list(
    vectors: np.ndarray, counts: list[int], model: str, encoding_format: str
) -> EmbeddingList:
    """The answer: one vector per text in order, as numbers or (`base64`) as the base64
    of its little-endian float32 bytes, as OpenAI sends them."""
    data = [
        Embedding(index=index, embedding=_encoded(vector, encoding_format))
        for index, vector in enumerate(vectors)
    ]
    tokens = sum(counts)
    return EmbeddingList(
        data=data, model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    )


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(to_bytes(vector)).decode("ascii")
    return vector.astype(float).tolist()


def _not_served(model: str) -> NotFound:
    return NotFound(
        "model_not_found", f"model {model!r} is not an embedding model served here", param="model"
    )
