"""Prompts for the small model's background jobs: rolling summaries and titles.

Neither runs here. The context builder says when a summary is due
(`BuiltContext.summary_job`); whoever owns the turn (the gateway) sends the
job's messages through the pipeline like any request — low tier, the small
model, `store=False` — and saves the answer with
`store.save_summary(conversation_id, job.through_message_id, text)`. The
next turns on that thread then start from the summary (`summary_note`).
Titles work the same way: `title_request` after the first answer, then
`store.set_auto_title(conversation_id, clean_title(text))`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schemas.events import ChatMessage, Role

SUMMARY_INSTRUCTIONS = (
    "You maintain the running summary of a conversation between a user and an assistant. "
    "Write a concise summary of the conversation so far that keeps every fact, name, number, "
    "decision, preference and open question a later reply could need. Write it in the third "
    "person as plain prose, without preamble."
)

TITLE_INSTRUCTIONS = (
    "Write a title of at most six words for a conversation that starts with the exchange "
    "below. Answer with the title only, without quotes or final punctuation."
)

SUMMARY_HEADING = "Summary of the earlier conversation:"

MAX_TITLE_CHARS = 80


@dataclass(frozen=True, slots=True)
class SummaryJob:
    """A summary to generate: of the thread from its root through `through_message_id`.

    `messages` is the complete prompt for the summarising model;
    `covered_tokens` estimates the turns it replaces.
    """

    conversation_id: str
    through_message_id: str
    messages: tuple[ChatMessage, ...]
    covered_tokens: int


def summary_request(previous: str | None, turns: Iterable[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The prompt asking for a new rolling summary: the previous summary (if any)
    followed by the turns it does not cover yet, as one transcript."""
    parts = []
    if previous:
        parts.append(f"Summary so far:\n{previous}\n")
    parts.append("Conversation to add:")
    parts.extend(f"{turn.role.value.capitalize()}: {turn.content}" for turn in turns)
    parts.append("\nWrite the updated summary.")
    return (
        ChatMessage(role=Role.SYSTEM, content=SUMMARY_INSTRUCTIONS),
        ChatMessage(role=Role.USER, content="\n".join(parts)),
    )


def summary_note(system_prompt: str, summary: str | None) -> str:
    """The system message content: the system prompt, then the summary (if any).

    The summary joins the system message, not a message of its own, because
    many chat templates accept a system message only in first place."""
    if not summary:
        return system_prompt
    note = f"{SUMMARY_HEADING}\n{summary.strip()}"
    return f"{system_prompt}\n\n{note}" if system_prompt else note


def title_request(user_message: str, answer: str = "") -> tuple[ChatMessage, ...]:
    """The prompt asking for a conversation's title from its first exchange."""
    exchange = f"User: {user_message[:2000]}"
    if answer:
        exchange += f"\nAssistant: {answer[:2000]}"
    return (
        ChatMessage(role=Role.SYSTEM, content=TITLE_INSTRUCTIONS),
        ChatMessage(role=Role.USER, content=exchange),
    )


def clean_title(text: str) -> str:
    """A model's title answer made fit for a list: first line, no quotes, short."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    title = lines[0].strip().strip("\"'`*#").strip() if lines else ""
    title = title.removeprefix("Title:").strip().rstrip(".")
    return fallback_title(title) if len(title) > MAX_TITLE_CHARS else title


def fallback_title(user_message: str) -> str:
    """A title from the first user message alone, cut on a word boundary."""
    words = " ".join(user_message.split())
    if len(words) <= MAX_TITLE_CHARS:
        return words
    cut = words[: MAX_TITLE_CHARS - 1].rsplit(" ", 1)[0]
    return cut + "…"
