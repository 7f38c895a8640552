"""Which gateways are alive, and who relays each stream: so a stream whose gateway died
and that nobody resumed stops costing GPU time (pure, no Kafka: STYLE 1).

Gateways heartbeat on `chat.control` (`GatewayHeartbeat`, keyed by their delivery
topic). A stream is held by the gateway it was asked through (`reply_to`) until another
gateway resumes it (`Reroute`). A request whose holder heartbeated and then went
silent for longer than the resume grace is abandoned: the client had that long to
resume it elsewhere. A gateway never heard from (say, one that died before this
scheduler started) is never judged: its requests run to their end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from scheduler.workers import remember
from schemas.events import GenerationRequest

REMEMBERED = 100_000


class GatewayWatch:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._seen: dict[str, float] = {}
        self._holders: OrderedDict[str, str] = OrderedDict()
        self._abandoned: OrderedDict[str, None] = OrderedDict()

    def heartbeat(self, reply_to: str, now: float) -> None:
        self._seen[reply_to] = max(now, self._seen.get(reply_to, now))

    def rerouted(self, request_id: str, reply_to: str) -> None:
        remember(self._holders, request_id, reply_to, REMEMBERED)

    def holds(self, gateway: str, request_id: str, asked_through: str | None) -> bool:
        """Does `gateway` relay the stream now? It does unless another gateway resumed it
        since (`asked_through`: the request's own `reply_to`, None when unknown here)."""
        holder = self._holders.get(request_id, asked_through)
        return holder is None or holder == gateway

    def abandoned(self, requests: Iterable[GenerationRequest],
                  now: float) -> list[GenerationRequest]:
        """Those of `requests` nobody relays any more, each returned once."""
        if self.grace_s <= 0:
            return []
        found = []
        for request in requests:
            if request.request_id in self._abandoned:
                continue
            last = self._seen.get(self._holders.get(request.request_id, request.reply_to))
            if last is not None and now - last > self.grace_s:
                remember(self._abandoned, request.request_id, None, REMEMBERED)
                found.append(request)
        return found
