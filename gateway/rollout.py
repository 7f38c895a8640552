"""Model aliases with weighted versions: which version a request for an alias runs on.

An alias (`chat`) names weighted versions, each a served model (`{"v1": 0.9, "v2":
0.1}`). A conversation's version is a deterministic hash of its id into the weights:
every turn of a conversation (regenerations too) lands on the same version while the
weights stay, and a change of weights moves only the conversations whose hash crosses
a boundary. Weights come from the settings (`CHATPIPE_MODEL_ALIASES`) and then from
`chat.rollout`, last record per alias wins (`ModelAliases.apply`).

Pure: no Kafka, no clock; the gateway's Kafka side feeds `apply`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from schemas.events import RolloutSet

Weights = Mapping[str, float]


class RolloutError(ValueError):
    """Weights or a rollback that cannot be applied: the message says why."""


def check_weights(alias: str, weights: Weights, served: Collection[str]) -> dict[str, float]:
    """`weights` as a plain dict if every version is served and they pick something;
    RolloutError otherwise. An alias may not shadow a served model."""
    if alias in served:
        raise RolloutError(f"{alias!r} is a served model, not an alias")
    if not weights:
        raise RolloutError(f"alias {alias!r}: name at least one version")
    unknown = sorted(set(weights) - set(served))
    if unknown:
        raise RolloutError(
            f"alias {alias!r}: {', '.join(unknown)} not served here "
            f"(served: {', '.join(sorted(served))})"
        )
    for version, weight in weights.items():
        if not weight >= 0 or weight == float("inf"):
            raise RolloutError(f"alias {alias!r}: weight of {version} must be a number >= 0")
    if not sum(weights.values()) > 0:
        raise RolloutError(f"alias {alias!r}: the weights must sum to more than 0")
    return dict(weights)


def parse_weights(pairs: Sequence[str]) -> dict[str, float]:
    """`["v1=0.9", "v2=0.1"]` as weights; RolloutError for a pair that is not
    VERSION=NUMBER or a version named twice."""
    weights: dict[str, float] = {}
    for pair in pairs:
        version, sep, number = pair.partition("=")
        if not sep or not version:
            raise RolloutError(f"{pair!r}: write VERSION=WEIGHT, e.g. v1=0.9")
        if version in weights:
            raise RolloutError(f"version {version!r} is named twice")
        try:
            weights[version] = float(number)
        except ValueError:
            raise RolloutError(f"{pair!r}: the weight is not a number") from None
    return weights


def hash_point(alias: str, conversation_id: str) -> float:
    """Where a conversation falls in [0, 1) for `alias`: stable across processes."""
    digest = hashlib.sha256(f"{alias}\0{conversation_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick(alias: str, weights: Weights, conversation_id: str) -> str:
    """The version of `alias` that `conversation_id` runs on: its hash point in the
    weights laid end to end, in the order given (versions of weight 0 never picked)."""
    total = sum(weights.values())
    point = hash_point(alias, conversation_id) * total
    upto = 0.0
    chosen = None
    for version, weight in weights.items():
        if weight <= 0:
            continue
        chosen = version
        upto += weight
        if point < upto:
            return version
    if chosen is None:
        raise RolloutError(f"alias {alias!r} has no version of weight > 0")
    return chosen  # rounding at the very top of the range


def rollback_weights(
    alias: str, history: Sequence[Weights], to: str | None, served: Collection[str]
) -> dict[str, float]:
    """The weights a rollback of `alias` sets: `to` alone at 100 %, or (`to` None) the
    weights before the current ones in `history` (oldest first, the current last:
    the settings' weights, then each `chat.rollout` record of the alias)."""
    if to is not None:
        return check_weights(alias, {to: 1.0}, served)
    if len(history) < 2:
        raise RolloutError(
            f"alias {alias!r} has no earlier weights to roll back to; "
            "name a version: rollback ALIAS --to VERSION"
        )
    return check_weights(alias, history[-2], served)


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """What a request runs on: `model` (a served model: the alias's version, or the model
    asked for) and the `alias` it was picked for (None: no alias asked for)."""

    model: str
    alias: str | None = None


class ModelAliases:
    """The aliases a gateway serves now: the settings' weights, each replaced by the
    newest `chat.rollout` record of its alias."""

    def __init__(self, initial: Mapping[str, Weights], served: Collection[str]) -> None:
        self.served = tuple(served)
        self._weights = {
            alias: check_weights(alias, weights, self.served) for alias, weights in initial.items()
        }

    def apply(self, record: RolloutSet) -> None:
        """Take a `chat.rollout` record (read in order): its weights win from now on.
        RolloutError (the record is dead-lettered) if they name a version not served."""
        self._weights[record.alias] = check_weights(record.alias, record.weights, self.served)

    def weights(self, alias: str) -> dict[str, float] | None:
        found = self._weights.get(alias)
        return dict(found) if found is not None else None

    @property
    def names(self) -> list[str]:
        return sorted(self._weights)

    def choose(self, requested: str | None, conversation_id: str) -> ModelChoice | None:
        """The version for a request of `requested` in `conversation_id`, or None when
        `requested` is no alias (a served model, or unknown: the caller checks it)."""
        if requested is None or requested not in self._weights:
            return None
        return ModelChoice(pick(requested, self._weights[requested], conversation_id), requested)
