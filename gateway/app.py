"""The gateway's HTTP app: `create_app(deps)` is all the wiring calls.

The store and the pipeline are opened and closed by the wiring, outside the app.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI

from gateway import chat, openai_compat
from gateway.admission import ResponseHeaders
from gateway.auth import current_owner
from gateway.deps import GatewayDeps
from gateway.errors import install_error_handlers

__all__ = ["GatewayDeps", "create_app"]


def create_app(deps: GatewayDeps) -> FastAPI:
    app = FastAPI(title="chatpipe", summary="ChatGPT-style chat over a Kafka pipeline")
    app.state.deps = deps
    install_error_handlers(app)
    app.add_middleware(ResponseHeaders)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(current_owner)])
    v1.include_router(chat.router)
    v1.include_router(openai_compat.router)
    app.include_router(v1)
    return app
