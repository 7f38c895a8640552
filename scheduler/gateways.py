"""Which gateways are alive, and who relays each stream: so a stream whose gateway died
and that nobody resumed stops costing GPU time (pure, no Kafka).

Gateways heartbeat on `chat.control` (`GatewayHeartbeat`, keyed by their delivery
topic). A stream is held by the gateway it was asked through (`reply_to`) until another
gateway resumes it (`Reroute`). A request whose holder heartbeated and then went
silent for longer than the resume grace is abandoned: the client had that long to
resume it elsewhere. A gateway never heard from (say, one that died before this
scheduler started) is never judged: its requests run to their end.

A gateway's delivery topic outlives it by `topic_ttl_s`: it is gone (`gone_topics`, the
scheduler deletes it) once its gateway has been silent that long, or, never heard from,
has been listed that long, and no request waiting or running here delivers to it. The
TTL covers what may still write there after a stream ends here: the safety stage's lag,
a resumer's `Reroute`, a request another scheduler shard runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from scheduler.workers import remember
from schemas.events import GenerationRequest

REMEMBERED = 100_000
FRESH_S = 5.0
"""A heartbeat younger than this (or than the grace) is news of now."""


class GatewayWatch:
    def __init__(self, grace_s: float, topic_ttl_s: float = 0.0) -> None:
        if 0 < topic_ttl_s <= grace_s:  # a resumer's Reroute would find no topic
            raise ValueError(
                f"the delivery topics' TTL ({topic_ttl_s} s) must be longer "
                f"than the resume grace ({grace_s} s), or 0 (never deleted)"
            )
        self.grace_s = grace_s
        self.topic_ttl_s = topic_ttl_s
        """0: delivery topics are never deleted."""
        self._seen: dict[str, float] = {}
        self._listed: dict[str, float] = {}
        self._holders: OrderedDict[str, str] = OrderedDict()
        self._abandoned: OrderedDict[str, None] = OrderedDict()
        self._walked: tuple[frozenset[str], float] = (frozenset(), 0.0)

    def fresh(self, sent_at: float, wall_now: float) -> bool:
        """Does a heartbeat sent at `sent_at` (wall clock) say its gateway is alive now?
        One read again after a restart may be old."""
        return sent_at >= wall_now - max(self.grace_s, FRESH_S)

    def heartbeat(self, reply_to: str, now: float) -> None:
        self._seen[reply_to] = max(now, self._seen.get(reply_to, now))

    def rerouted(self, request_id: str, reply_to: str) -> None:
        remember(self._holders, request_id, reply_to, REMEMBERED)

    def holds(self, gateway: str, request_id: str, asked_through: str | None) -> bool:
        """Does `gateway` relay the stream now? It does unless another gateway resumed it
        since (`asked_through`: the request's own `reply_to`, None when unknown here)."""
        holder = self._holders.get(request_id, asked_through)
        return holder is None or holder == gateway

    def worth_walking(self, now: float) -> bool:
        """Is a walk of every request (`abandoned`) worth its cost now? Only when the
        set of gateways silent past the grace changed since the last walk, or a grace
        has passed since it while one is silent (a request that reached a dead gateway's
        streams since, say a continuation read back): a scheduler holding 100,000
        requests then walks them once per gateway death, not once per decision."""
        if self.grace_s <= 0:
            return False
        silent = frozenset(g for g, last in self._seen.items() if now - last > self.grace_s)
        if not silent:
            self._walked = (silent, now)
            return False
        walked, at = self._walked
        if silent == walked and now - at < self.grace_s:
            return False
        self._walked = (silent, now)
        return True

    def abandoned(
        self, requests: Iterable[GenerationRequest], now: float
    ) -> list[GenerationRequest]:
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

    def gone_topics(
        self, listed: Iterable[str], delivering: Collection[str], now: float
    ) -> list[str]:
        """The delivery topics among `listed` (all that exist) whose gateway is gone;
        `delivering`: the `reply_to` of every request waiting or running here."""
        if self.topic_ttl_s <= 0:
            return []
        listed = set(listed)
        for topic in set(self._listed) - listed:
            del self._listed[topic]
        gone = []
        for topic in sorted(listed):
            last = self._seen.get(topic)
            if last is None:
                last = self._listed.setdefault(topic, now)
            if now - last > self.topic_ttl_s and topic not in delivering:
                gone.append(topic)
        return gone

    def deleted(self, topics: Iterable[str]) -> None:
        """`topics` are deleted: one that shows up again is a new one (its gateway
        heartbeats again, or something wrote to it), judged from then on."""
        for topic in topics:
            self._seen.pop(topic, None)
            self._listed.pop(topic, None)
