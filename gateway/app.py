"""The gateway's HTTP app: `create_app(deps)` is all the wiring calls.

The store and the pipeline are opened and closed by the wiring, outside the app.
Every request's body is bounded (`BodyLimits`) before anything else, the key check
included; /docs, /redoc and /openapi.json are served only with `api_docs`.
The app's lifespan loads the served models' tokenizers before it takes requests
(the embedding model, slower, in the background when a model retrieves), and on
shutdown cancels the titles and summaries still being generated and stops renewing
the leases of concurrent generations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gateway import web
from gateway.admission.headers import ResponseHeaders
from gateway.admission.leases import ReleasesLeases
from gateway.api_document import api_document
from gateway.deps import GatewayDeps
from gateway.edge.auth import current_owner
from gateway.edge.body_limits import BodyLimits
from gateway.errors import error_responses, install_error_handlers
from gateway.native import conversations, feedback, files
from gateway.native import messages as chat
from gateway.openai.chat_completions import api_router as chat_completions
from gateway.openai.completions import api_router as completions
from gateway.openai.embeddings import api_router as embeddings
from gateway.openai.models import api_router as models
from gateway.openai.responses import api_router as responses
from ops.http_spans import HttpSpans
from ops.metrics import exposition

__all__ = ["GatewayDeps", "create_app"]

UPLOAD_FRAMING = 64 << 10
"""Room in an upload's body for its multipart headers and fields around the file."""


NOT_READY_RETRY_S = 5


def create_app(deps: GatewayDeps, *, api_docs: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        models = deps.config.limits.models
        await deps.context.warm_up(models)
        if any(deps.context.policy(model, 1).strategy == "retrieve" for model in models):
            deps.background.start(("warm_up", "embedder"),
                                  deps.context.warm_up([], embedder=True))  # fmt: skip
        try:
            yield
        finally:
            await deps.background.close()
            if deps.concurrency is not None:
                await deps.concurrency.aclose()
            await deps.context.close()

    config = deps.config
    app = FastAPI(
        title="chatpipe",
        summary="ChatGPT-style chat over a Kafka pipeline",
        lifespan=lifespan,
        openapi_url="/openapi.json" if api_docs else None,
        docs_url="/docs" if api_docs else None,
        redoc_url="/redoc" if api_docs else None,
    )
    app.state.deps = deps
    install_error_handlers(app)
    app.add_middleware(ResponseHeaders)
    app.add_middleware(HttpSpans)  # a span per request while tracing is on, its noted headers seen
    app.add_middleware(ReleasesLeases)  # a request's leases no generation claimed
    # Added last, so it runs first.
    app.add_middleware(
        BodyLimits,
        max_bytes=config.max_body_bytes,
        read_timeout_s=config.body_read_timeout_s,
        larger={"/v1/files": config.files.max_file_bytes + UPLOAD_FRAMING},
    )

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """Liveness: the gateway answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"description": "not ready"}})
    async def readyz() -> JSONResponse:
        """Readiness: whether a request can be carried now. 200 when the bus takes this
        gateway's records, the default model's scheduler spoke lately and counts a live
        worker for it; else 503 with Retry-After. The body says which."""
        report = deps.pipeline.readiness(config.limits.models, config.limits.default_model)
        if report.ready:
            return JSONResponse(report.body())
        return JSONResponse(report.body(), 503, {"Retry-After": str(NOT_READY_RETRY_S)})

    @app.get("/metrics", tags=["ops"], include_in_schema=False)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics of every stage in this process (ops.metrics)."""
        body, content_type = exposition(request.headers.get("accept"))
        return Response(body, media_type=content_type)

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(current_owner)],
                   responses=error_responses(401))  # fmt: skip
    v1.include_router(conversations.router)
    v1.include_router(chat.router)
    v1.include_router(files.router)
    v1.include_router(feedback.router)
    v1.include_router(models.router)
    v1.include_router(chat_completions.router)
    v1.include_router(completions.router)
    v1.include_router(embeddings.router)
    v1.include_router(responses.router)
    app.include_router(v1)
    app.include_router(web.router)
    app.openapi = lambda: _cached_document(app)  # type: ignore[method-assign]
    return app


def _cached_document(app: FastAPI) -> dict:
    if app.openapi_schema is None:
        deps = app.state.deps
        app.openapi_schema = api_document(
            app, deps.config.limits, deps.aliases.names if deps.aliases else ()
        )
    return app.openapi_schema
