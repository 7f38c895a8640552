"""Context window management: which history a prompt carries.

The prompt is, in order: one system message (the system prompt, then the
rolling summary if there is one), the kept turns in order, the retrieved
earlier exchanges (strategy `retrieve`), the excerpts of the user's files the
turn names (a system message, `retrieval.ranking.context_block`), the new user
message. Everything up to the retrieved exchanges is a prefix that the next turn
repeats exactly, so vLLM's prefix cache serves it; the excerpts, chosen anew for
each message, come after it.

Strategies, per model:

* `truncate` — drop the oldest turns.
* `summary` — the same, and when the unsummarised history passes
  `summary_trigger_ratio` of its budget, ask (`summary_job`) for a rolling
  summary of the turns the next cut would drop. Once it is stored, prompts
  start with it instead of those turns.
* `retrieve` — keep `retrieve_budget_ratio` of the budget for the earlier
  exchanges most similar to the new message (embeddings); they go just
  before it, after the stable part.

The cut rule keeps the prefix still: when the kept turns no longer fit,
turns are dropped in a block, down to `keep_ratio` of the budget, at a user
message. The next turns append after the same first turn until the budget
is full again, so the prompt's start changes once per `(1 - keep_ratio)` of a
window of new text, not on every turn. The rule is replayed over the whole
thread (`replay_cut`) from the estimated size of each turn, so it needs no
state: every gateway replica reaches the cut its previous prompts used.
The system prompt and the new message are never dropped.

This module is pure: costs, the summary and similarities come in as values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from conversations.store import StoredMessage
from gateway.context.summaries import SummaryJob, summary_note, summary_request
from schemas.events import ChatMessage, Role

Strategy = Literal["truncate", "summary", "retrieve"]


@dataclass(frozen=True, slots=True)
class ContextPolicy:
    strategy: Strategy = "truncate"
    max_prompt_tokens: int = 2048
    keep_ratio: float = 0.5
    summary_trigger_ratio: float = 0.75
    retrieve_top_k: int = 4
    retrieve_min_similarity: float = 0.3
    retrieve_budget_ratio: float = 0.25


@dataclass(frozen=True, slots=True)
class BuiltContext:
    """A prompt and how it was made.

    `fits` is False when the system prompt, summary and new message alone
    pass `max_prompt_tokens` (refuse the turn). `window_start` is the thread
    index of the first kept turn; `summary_job` a summary to ask for.
    """

    messages: tuple[ChatMessage, ...]
    prompt_tokens: int
    max_prompt_tokens: int
    window_start: int
    summary_through: str | None = None
    retrieved_ids: tuple[str, ...] = ()
    summary_job: SummaryJob | None = None
    fits: bool = field(default=True)


@dataclass(frozen=True, slots=True)
class Counting:
    """How to size messages: `estimate` one message, `count_prompt` a whole prompt exactly."""

    estimate: Callable[[ChatMessage], int]
    count_prompt: Callable[[list[ChatMessage]], int]


def replay_cut(costs: Sequence[int], starts: Sequence[bool], budget: float, keep: float) -> int:
    """Index of the first item kept, replaying the cut rule over every past prompt.

    Items are the turns in order with the new message last; `starts[i]` says
    a prompt may start at item i (a user message). Each user message ended
    one past prompt. Whenever items[cut..k] passed `budget`, the cut moved to
    the first start after it that leaves at most `keep` (or to k itself).
    """
    prefix = [0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    cut = 0
    for k in range(len(costs)):
        if not starts[k] or prefix[k + 1] - prefix[cut] <= budget:
            continue
        j = cut + 1
        while j < k and not (starts[j] and prefix[k + 1] - prefix[j] <= keep):
            j += 1
        cut = min(j, k)
    return cut


def exchanges(messages: Sequence[StoredMessage]) -> list[list[StoredMessage]]:
    """Group turns into exchanges: a user message and the answers after it."""
    groups: list[list[StoredMessage]] = []
    for message in messages:
        if message.role == Role.USER or not groups:
            groups.append([])
        groups[-1].append(message)
    return groups


def pick_retrieved(
    candidates: Sequence[StoredMessage],
    relevance: Mapping[str, float],
    budget: float,
    policy: ContextPolicy,
    cost: Callable[[StoredMessage], int],
) -> list[list[StoredMessage]]:
    """The most relevant earlier exchanges within `budget`, in their original order.

    An exchange scores its best message's similarity to the new message."""
    scored = []
    for index, group in enumerate(exchanges(candidates)):
        score = max((relevance.get(m.message_id, -1.0) for m in group), default=-1.0)
        if score >= policy.retrieve_min_similarity:
            scored.append((score, index, group))
    chosen: list[tuple[int, float, list[StoredMessage]]] = []
    for score, index, group in sorted(scored, key=lambda s: (-s[0], s[1])):
        size = sum(map(cost, group))
        if len(chosen) < policy.retrieve_top_k and size <= budget:
            chosen.append((index, score, group))
            budget -= size
    return [group for _, _, group in sorted(chosen, key=lambda c: c[0])]


def _chat(message: StoredMessage) -> ChatMessage:
    return ChatMessage(role=message.role, content=message.content)


def assemble(
    thread: Sequence[StoredMessage],
    new_message: str,
    system_prompt: str,
    policy: ContextPolicy,
    counting: Counting,
    *,
    conversation_id: str = "",
    summary: tuple[str, str] | None = None,
    relevance: Mapping[str, float] | None = None,
    documents: str | None = None,
) -> BuiltContext:
    """The prompt for `new_message` after `thread` (the current branch, prompt-worthy turns).

    `summary` is (through_message_id, text) of the newest summary on this
    thread, if any; `relevance` maps message ids to their similarity to the
    new message (strategy `retrieve`); `documents` the excerpts of the user's files
    for this message, never dropped (like the system prompt, it takes its room
    from the history's budget).
    """
    start = 0
    ids = [m.message_id for m in thread]
    if summary is not None and summary[0] in ids:
        start = ids.index(summary[0]) + 1
    else:
        summary = None
    system = summary_note(system_prompt, summary[1] if summary else None)
    head = [ChatMessage(role=Role.SYSTEM, content=system)] if system else []
    new = ChatMessage(role=Role.USER, content=new_message)
    excerpts = [ChatMessage(role=Role.SYSTEM, content=documents)] if documents else []
    turns = list(thread[start:])

    def cost(message: StoredMessage) -> int:
        return counting.estimate(_chat(message))

    empty = ChatMessage(role=Role.USER, content="")
    fixed = counting.count_prompt([*head, empty]) - counting.estimate(empty)
    fixed += sum(map(counting.estimate, excerpts))
    budget = policy.max_prompt_tokens - fixed
    window_budget: float = budget
    if policy.strategy == "retrieve":
        window_budget = budget * (1 - policy.retrieve_budget_ratio)
    costs = [*map(cost, turns), counting.estimate(new)]
    starts = [m.role == Role.USER for m in turns] + [True]
    keep = policy.keep_ratio * window_budget
    cut = replay_cut(costs, starts, window_budget, keep)

    retrieved: list[list[StoredMessage]] = []
    if policy.strategy == "retrieve" and relevance:
        retrieved = pick_retrieved(turns[:cut], relevance, budget - sum(costs[cut:]), policy, cost)
    job = None
    if policy.strategy == "summary" and sum(costs) > policy.summary_trigger_ratio * window_budget:
        job = _summary_job(conversation_id, turns, costs, starts, keep, summary)

    def prompt() -> list[ChatMessage]:
        extra = [_chat(m) for group in retrieved for m in group]
        return [*head, *map(_chat, turns[cut:]), *extra, *excerpts, new]

    messages = prompt()
    tokens = counting.count_prompt(messages)
    while tokens > policy.max_prompt_tokens and (retrieved or cut < len(turns)):
        if retrieved:
            retrieved.pop(_least_relevant(retrieved, relevance or {}))
        else:
            cut = next((i for i in range(cut + 1, len(turns)) if starts[i]), len(turns))
        messages = prompt()
        tokens = counting.count_prompt(messages)
    return BuiltContext(
        messages=tuple(messages),
        prompt_tokens=tokens,
        max_prompt_tokens=policy.max_prompt_tokens,
        window_start=start + cut,
        summary_through=summary[0] if summary else None,
        retrieved_ids=tuple(m.message_id for group in retrieved for m in group),
        summary_job=job,
        fits=tokens <= policy.max_prompt_tokens,
    )


def _least_relevant(groups: list[list[StoredMessage]], relevance: Mapping[str, float]) -> int:
    scores = [max(relevance.get(m.message_id, -1.0) for m in group) for group in groups]
    return scores.index(min(scores))


def _summary_job(
    conversation_id: str,
    turns: list[StoredMessage],
    costs: list[int],
    starts: list[bool],
    keep: float,
    summary: tuple[str, str] | None,
) -> SummaryJob | None:
    """Summarise the turns before the first user turn that leaves at most `keep` tokens."""
    total = sum(costs)
    covered = 0
    for j in range(len(turns)):
        if j and starts[j] and total - covered <= keep:
            break
        covered += costs[j]
    else:
        return None  # no user turn leaves little enough: nothing to fold away yet
    request = summary_request(summary[1] if summary else None, map(_chat, turns[:j]))
    return SummaryJob(conversation_id, turns[j - 1].message_id, request, covered)
