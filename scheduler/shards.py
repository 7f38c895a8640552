"""Scheduler shards: schedulers side by side, each deciding for its own models.

One scheduler carries about 5,000 decisions a second on one core (docs/architecture/scale.md). Past
that, `scheduler_shards` names groups of models, each decided by its own scheduler with
its own journal (`chat.work.<shard>`), claim and consumer group; workers of a model
read the journal of the model's shard. The unnamed shard decides for every model no
named shard lists, on `chat.work`, as a scheduler without shards does. A model's
requests, queue, fair shares and routes stay inside its shard: every shard reads every
request topic and passes over the requests of other shards' models.

`HeapFreezer`: CPython's full collections walk every object that survived two young
ones, so with ~150,000 requests in flight a collection stalls the scheduler for up to a
second. Freezing (`gc.freeze`) moves what the process holds out of their sight.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

from schemas import topics

GROUP = "chatpipe-scheduler"


@dataclass(frozen=True)
class Shard:
    """What one scheduler decides for: `models` of shard `name`, or (the unnamed shard)
    every model but those of the named shards (`elsewhere`)."""

    name: str = ""
    models: frozenset[str] | None = None
    elsewhere: frozenset[str] = frozenset()

    def decides(self, model: str) -> bool:
        return model in self.models if self.models is not None else model not in self.elsewhere

    @property
    def sharded(self) -> bool:
        """Whether other schedulers decide beside this one."""
        return bool(self.name or self.elsewhere)

    @property
    def work_topic(self) -> str:
        return topics.work_topic(self.name)

    @property
    def group(self) -> str:
        return f"{GROUP}-{self.name}" if self.name else GROUP

    @classmethod
    def of(cls, shards: dict[str, list[str]], name: str) -> Shard:
        """Shard `name` of `shards` (shard name -> its models)."""
        if name:
            return cls(name, frozenset(shards[name]))
        return cls(elsewhere=frozenset(m for models in shards.values() for m in models))


UNFREEZE_EVERY = 600
"""Freezes between two thaws: cyclic garbage frozen by mistake is collected then."""


class HeapFreezer:
    """Freeze the heap every `every_s` (0: never); every UNFREEZE_EVERY freezes thaw it,
    so the next full collection frees what became garbage while frozen (one long pause
    in that many seconds, instead of many)."""

    def __init__(self, every_s: float, clock: Callable[[], float]) -> None:
        self.every_s = every_s
        self._clock = clock
        self._frozen_at = clock()
        self._freezes = 0

    def tick(self) -> None:
        now = self._clock()
        if self.every_s <= 0 or now - self._frozen_at < self.every_s:
            return
        self._frozen_at = now
        self._freezes += 1
        if self._freezes % UNFREEZE_EVERY == 0:
            gc.unfreeze()
        else:
            gc.freeze()
