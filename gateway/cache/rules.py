"""The response cache's rules, pure: which requests it may answer, under
which key, what it keeps of an answer, and how a kept answer is replayed.

A request may be answered from the cache only when its answer depends on nothing but
(model, prompt, sampling) and the sampling is greedy (temperature 0): a single user
turn, optionally after one system prompt, and no other input. The rule fails closed:
any field of the request or of a message that it does not know (tools, files, added
later) refuses the request when it is set, so a feature that adds input to the prompt
cannot be answered from the cache by mistake. A native (stored) prompt is built by the
gateway, so its only system message may be the deployment's system prompt: one the
gateway added (excerpts of the user's files, a summary) refuses it even when the
deployment has no system prompt of its own. A native turn that names the user's files
(`file_ids`) refuses it even when their search found nothing to add.

The key is a digest of the org, the output policy (the safety stage's output check for
the request's tier and model, `moderation.policy.SafetyPolicy.output_policy`), the model,
the messages and every sampling option: two orgs never share an entry, nor two requests
whose answers the safety stage checks differently, so an answer kept for a tier that
nothing retracts is never replayed to one whose check would retract it. The input policy
is not in the key: the input check runs before the lookup and only passes or blocks the
prompt, it never changes the answer.

An answer is kept only when the model ended it itself or at its length limit, nothing
was retracted, and the model that answered is the one asked for (not a router's
substitute). A replay is the kept text in chunks paced at `tokens_per_s`, one every
`chunk_s`, the first at once, and its end carries `usage.cache = "hit"`.
"""

from __future__ import annotations

import hashlib
import math

import orjson

from conversations.store import CachedResponse
from schemas.answer import AnswerText
from schemas.events import (
    ChatMessage,
    DeliverEvent,
    DeliveryDone,
    Delta,
    GenerationRequest,
    Role,
    Usage,
)

KEY_VERSION = 2
"""Part of every key: a change to what a key covers starts a fresh cache."""
KEYED_FIELDS = frozenset({"model", "messages", "sampling"})
"""What the answer depends on: the key covers these (and the org and output policy)."""
ROUTING_FIELDS = frozenset({
    "type", "schema_version", "request_id", "conversation_id", "message_id", "parent_id",
    "user_id", "org_id", "reply_to", "deadline", "cache_salt", "store", "created_at",
    "alias",  # the model alias asked for (rollout): `model` is the version that answers
    "tier",  # what it changes of the answer is the output policy, which the key has
})  # fmt: skip
"""Who asks and where the answer goes: they do not change the answer."""
MESSAGE_FIELDS = frozenset({"role", "content"})
SINGLE_TURNS = ((Role.USER,), (Role.SYSTEM, Role.USER))
"""The prompts the cache may answer: one user turn, optionally after a system prompt."""


def refusal(request: GenerationRequest, system_prompt: str = "") -> str | None:
    """Why `request` may not be answered from (or fill) the cache; None if it may.
    `system_prompt`: the deployment's, the only system message a native prompt may hold."""
    if request.sampling.temperature != 0:
        return "temperature"
    if request.sampling.logprobs is not None:
        return "logprobs"  # a kept answer has its text, not its tokens' probabilities
    if request.attempt or request.requested_model or request.stream:
        return "not_a_new_request"
    unknown = set(request.model_dump(exclude_defaults=True)) - KEYED_FIELDS - ROUTING_FIELDS
    if unknown:
        return "other_input"  # tools, files, retrieval: anything added to the request
    if any(_message_extras(m) for m in request.messages):
        return "other_input"
    if tuple(m.role for m in request.messages) not in SINGLE_TURNS:
        return "history"
    system = request.messages[0] if len(request.messages) == 2 else None
    if request.store and system is not None and system.content != system_prompt:
        return "other_input"  # the gateway added it: retrieved excerpts, a summary
    return None


def _message_extras(message: ChatMessage) -> set[str]:
    return set(message.model_dump(exclude_defaults=True)) - MESSAGE_FIELDS


def cache_key(
    request: GenerationRequest, system_prompt: str = "", *, output_policy: str
) -> str | None:
    """The request's key (hex SHA-256 of org, output policy, model, messages and
    sampling), or None if the cache may not answer it (`refusal`). `output_policy`: the
    output check the safety stage gives the request's answer (its tier and model's)."""
    if refusal(request, system_prompt) is not None:
        return None
    keyed = {
        "v": KEY_VERSION,
        "org": request.org_id,
        "output_policy": output_policy,
        "model": request.model,
        "messages": [[m.role.value, m.content] for m in request.messages],
        "sampling": request.sampling.model_dump(mode="json"),
    }
    return hashlib.sha256(orjson.dumps(keyed, option=orjson.OPT_SORT_KEYS)).hexdigest()


def entry_to_keep(
    request: GenerationRequest,
    key: str,
    text: AnswerText,
    answered_by: str,
    now: float,
    ttl_s: float,
) -> CachedResponse | None:
    """What to cache of `request`'s ended answer (`text`, by model `answered_by`), or None:
    not answered whole (stopped early, cancelled, failed, retracted), or by another model."""
    end = text.end
    if not text.answered or not isinstance(end, DeliveryDone) or answered_by != request.model:
        return None
    if end.usage.cache == "hit":
        return None  # a replay: the entry is already there
    return CachedResponse(
        cache_key=key, org_id=request.org_id, model=request.model, content=str(text),
        prompt_tokens=end.usage.prompt_tokens, completion_tokens=end.usage.completion_tokens,
        status=end.status, created_at=now, expires_at=now + ttl_s)  # fmt: skip


def paced_chunks(
    content: str,
    tokens: int,
    tokens_per_s: float,
    chunk_s: float,
) -> list[tuple[float, str]]:
    """`content` (`tokens` long) as (seconds after the start, text) chunks: one every
    `chunk_s`, each about `tokens_per_s * chunk_s` tokens, the first at 0. The text is
    cut at even character positions (a token is about `len(content) / tokens` chars)."""
    if not content:
        return []
    per_chunk = max(1.0, tokens_per_s * chunk_s)
    count = min(len(content), max(1, math.ceil(max(tokens, 1) / per_chunk)))
    cuts = [round(i * len(content) / count) for i in range(count + 1)]
    interval = per_chunk / tokens_per_s
    return [(i * interval, content[cuts[i] : cuts[i + 1]]) for i in range(count)]


def replay(
    request: GenerationRequest, entry: CachedResponse, tokens_per_s: float, chunk_s: float
) -> list[tuple[float, DeliverEvent]]:
    """The delivery events of `entry` replayed for `request`, each with when to show it
    (seconds after the start): paced deltas, then the end with the last of them, its usage
    the entry's tokens marked `cache: "hit"` (the whole prompt counted as cached)."""
    chunks = paced_chunks(entry.content, entry.completion_tokens, tokens_per_s, chunk_s)
    ids = dict(request_id=request.request_id, attempt=request.attempt)
    events: list[tuple[float, DeliverEvent]] = [
        (at, Delta(**ids, seq=seq, text=text)) for seq, (at, text) in enumerate(chunks)
    ]
    usage = Usage(prompt_tokens=entry.prompt_tokens, completion_tokens=entry.completion_tokens,
                  cached_tokens=entry.prompt_tokens, cache="hit")  # fmt: skip
    done = DeliveryDone(**ids, seq=len(chunks), status=entry.status, usage=usage,
                        model=entry.model)  # fmt: skip
    events.append((chunks[-1][0] if chunks else 0.0, done))
    return events


def marked_miss(done: DeliveryDone) -> DeliveryDone:
    """The end of a generated answer the cache was asked for: `usage.cache = "miss"`."""
    return done.model_copy(update={"usage": done.usage.model_copy(update={"cache": "miss"})})
