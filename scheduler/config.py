"""The scheduler's settings (composed into `chatpipe.settings.Settings`): tier shares and
waits, model routing, shards."""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel, Field, model_validator

from scheduler.core import Policy
from schemas.topics import Tier

SHARD_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,40}")

ALONE_GC_FREEZE_S = 1.0
"""How often a scheduler process of its own freezes its heap unless set: full
collections then leave out the requests it holds, whose pauses were the tail of its
decision latency (`bench scheduler_sim`)."""


class SchedulerSettings(BaseModel):
    """How requests are queued, routed to models and split among scheduler shards."""

    tier_min_share: dict[Tier, float] = Field(
        default_factory=lambda: {Tier.PRO: 0.2, Tier.FREE: 0.1},
        description="share of dispatches a lower tier keeps while higher tiers are busy",
    )
    tier_max_wait_s: dict[Tier, float] = Field(
        default_factory=lambda: {Tier.ENTERPRISE: 120.0, Tier.PRO: 60.0, Tier.FREE: 30.0},
        description="shed new requests of a tier whose expected wait is longer",
    )
    queue_update_interval_s: float = Field(1.0, description="queued-event period per request")
    affinity_max_load: float = Field(
        0.9, description="a conversation sticks to its worker while its load is under this"
    )
    served_models: list[str] = Field(
        default_factory=list, description="models clients may ask for; empty = model_name only"
    )
    tier_models: dict[Tier, list[str]] = Field(
        default_factory=dict, description="models each tier may use; a tier not named: all"
    )
    fallback_models: dict[str, str] = Field(
        default_factory=dict, description="model -> smaller model used when it is saturated"
    )
    model_aliases: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="alias -> {version (a served model): weight}, "
        'e.g. {"chat": {"v1": 0.9, "v2": 0.1}}: the starting weights; `chatpipe rollout` '
        "changes them live",
    )
    small_model: str | None = Field(None, description="model for simple requests")
    simple_request_max_chars: int = Field(
        0, description="route prompts up to this many characters to small_model; 0 = off"
    )
    scheduler_fair_preemption: bool = Field(
        True,
        description="when a request finds no free slot of its model while another org (or "
        "another user of its org) of its tier or a lower one holds at least two slots more "
        "than its own, take the newest of those back: it continues on its next attempt "
        "(docs/architecture/scheduling.md)",
    )
    scheduler_shards: dict[str, list[str]] = Field(
        default_factory=dict,
        description='schedulers by model, e.g. {"big": ["llama-70b"]}: '
        "each named shard decides for its models alone, on its own chat.work.<shard>; the "
        "unnamed scheduler for every other model (docs/architecture/scale.md)",
    )
    scheduler_shard: str = Field(
        "",
        description="the shard this scheduler process decides for (a key of "
        "scheduler_shards); empty: the unnamed one. `chatpipe up` runs one of each",
    )
    scheduler_gc_freeze_s: float | None = Field(
        None,
        ge=0,
        description="a scheduler process moves what it holds out of CPython's "
        "garbage collector's sight (gc.freeze) this often, so full collections do not walk "
        "every waiting and running request (docs/architecture/scale.md); 0: never. "
        f"Unset: every {ALONE_GC_FREEZE_S:g} s where the scheduler runs alone "
        "(`chatpipe scheduler`, as docker-compose and Kubernetes run it; it freezes the "
        "whole process), never in `chatpipe up`, where every stage shares the heap",
    )

    def gc_freeze_s(self, alone: bool) -> float:
        """How often a scheduler freezes the heap: the setting, else the default for a
        process that runs it `alone` or beside the other stages."""
        if self.scheduler_gc_freeze_s is not None:
            return self.scheduler_gc_freeze_s
        return ALONE_GC_FREEZE_S if alone else 0.0

    @model_validator(mode="after")
    def _check_shards(self) -> SchedulerSettings:
        owners: dict[str, str] = {}
        for shard, models in self.scheduler_shards.items():
            if not SHARD_NAME.fullmatch(shard):
                raise ValueError(f"scheduler shard {shard!r}: lowercase letters, digits and -")
            for model in models:
                if model in owners:
                    raise ValueError(
                        f"model {model!r} is in shards {owners[model]!r} and "
                        f"{shard!r}: one scheduler decides for a model"
                    )
                owners[model] = shard
        if self.scheduler_shard and self.scheduler_shard not in self.scheduler_shards:
            raise ValueError(
                f"scheduler_shard {self.scheduler_shard!r} is not a key of scheduler_shards"
            )
        return self

    def shard_of(self, model: str) -> str:
        """The scheduler shard deciding for `model` ("" : the unnamed one)."""
        return next(
            (shard for shard, models in self.scheduler_shards.items() if model in models), ""
        )

    def shard_models(self, shard: str) -> frozenset[str] | None:
        """The models `shard` decides for; None for the unnamed one: every model no
        named shard lists."""
        return frozenset(self.scheduler_shards[shard]) if shard else None

    def policy(
        self,
        inside: Callable[[str], bool],
        worker_lost_after_s: float,
        gateway_grace_s: float,
    ) -> Policy:
        """The policy of a scheduler deciding for the models `inside` accepts: routes
        between models stay inside its shard."""
        return Policy(
            min_share=self.tier_min_share,
            max_wait_s=self.tier_max_wait_s,
            affinity_max_load=self.affinity_max_load,
            tier_models=self.tier_models,
            fallback_models={
                model: fallback
                for model, fallback in self.fallback_models.items()
                if inside(model) and inside(fallback)
            },
            small_model=self.small_model if self.small_model and inside(self.small_model) else None,
            simple_request_max_chars=self.simple_request_max_chars,
            queue_update_interval_s=self.queue_update_interval_s,
            worker_lost_after_s=worker_lost_after_s,
            gateway_grace_s=gateway_grace_s,
            fair_preemption=self.scheduler_fair_preemption,
        )
