"""What the routes are given: the wiring builds `GatewayDeps`, routes read it through
`Annotated` dependencies (thin routes) and hand each domain module the narrow value it
takes (`admission`, `own_requests`, `turns`). The store and pipeline live outside the app."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from conversations.store import ConversationStore
from gateway.admission.concurrency import ConcurrencyGate
from gateway.admission.gates import Admission, BusGate, SheddingGate
from gateway.admission.quotas import QuotaGate
from gateway.admission.rate_limits import RateLimiter
from gateway.config import GatewayConfig
from gateway.context.builder import ContextBuilder
from gateway.native.background import BackgroundJobs, OwnRequests
from gateway.native.turns import Turns
from gateway.pipeline import Pipeline
from gateway.rollout import ModelAliases
from gateway.streaming.generation import LiveRequests
from moderation.policy import SafetyPolicy
from retrieval.documents import Documents


@dataclass(frozen=True, slots=True)
class GatewayDeps:
    config: GatewayConfig
    store: ConversationStore
    pipeline: Pipeline
    context: ContextBuilder
    """Builds every native turn's prompt within its model's window."""
    rate_limiter: RateLimiter | None = None
    """Requests and tokens per minute; None: no rate limits."""
    quotas: QuotaGate | None = None
    """Token budgets per period; None: no budgets."""
    concurrency: ConcurrencyGate | None = None
    """Generations one key may run at once; None: no limit."""
    safety: SafetyPolicy | None = None
    """Input classifiers run before a request is queued; None: no input check."""
    live: LiveRequests = field(default_factory=LiveRequests)
    """The requests this gateway relays: who may cancel them."""
    background: BackgroundJobs = field(default_factory=BackgroundJobs)
    """Titles and summaries being generated; closed when the app stops."""
    documents: Documents | None = None
    """The users' files: uploads and the search of turns that name them; None: no files."""
    aliases: ModelAliases | None = None
    """Model aliases and their weighted versions, kept current from chat.rollout."""
    started_at: int = field(default_factory=lambda: int(time.time()))
    """When these dependencies were built from the gateway's config (Unix seconds): the
    `created` of every model `GET /v1/models` lists."""

    @property
    def admission(self) -> Admission:
        """The gates a request passes: the bus, shedding, budgets, concurrent generations,
        then rate limits."""
        gates = [BusGate(self.pipeline), SheddingGate(self.pipeline), self.quotas,
                 self.concurrency, self.rate_limiter]  # fmt: skip
        return Admission([g for g in gates if g is not None], self.pipeline, self.safety)

    @property
    def own_requests(self) -> OwnRequests:
        """What titles and summaries are generated with."""
        return OwnRequests(self.background, self.pipeline, self.store, self.context, self.config)

    @property
    def turns(self) -> Turns:
        """What native turns are served with."""
        return Turns(self.config, self.store, self.pipeline, self.context, self.admission,
                     self.own_requests, self.live, self.documents, self.aliases)  # fmt: skip


def gateway_deps(request: Request) -> GatewayDeps:
    return request.app.state.deps


def _config(deps: Annotated[GatewayDeps, Depends(gateway_deps)]) -> GatewayConfig:
    return deps.config


def _store(deps: Annotated[GatewayDeps, Depends(gateway_deps)]) -> ConversationStore:
    return deps.store


def _pipeline(deps: Annotated[GatewayDeps, Depends(gateway_deps)]) -> Pipeline:
    return deps.pipeline


def _turns(deps: Annotated[GatewayDeps, Depends(gateway_deps)]) -> Turns:
    return deps.turns


Deps = Annotated[GatewayDeps, Depends(gateway_deps)]
ConfigDep = Annotated[GatewayConfig, Depends(_config)]
StoreDep = Annotated[ConversationStore, Depends(_store)]
PipelineDep = Annotated[Pipeline, Depends(_pipeline)]
TurnsDep = Annotated[Turns, Depends(_turns)]
