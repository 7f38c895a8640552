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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.events import ChatMessage, Role

SUMMARY_INSTRUCTIONS = (
    "Summarize the following conversation in a few sentences, in the third person:"
)
"""The head of a summary's one user message, the text to summarise after it: the shape
small instruct models are trained on (SmolLM2-135M-Instruct, the default model, answers a
system message of instructions with a letter, not a summary)."""

TITLE_INSTRUCTIONS = (
    "You write a short title for each conversation: two to six words, nothing else."
)
TITLE_EXAMPLES = (
    ("How do I change a flat tire on my car?", "Changing a Flat Tire"),
    ("hi there", "Greeting"),
    ("Write a short poem about rain", "Poem About Rain"),
    ("Can you help me write an email to my landlord about a broken heater?",
     "Email About a Broken Heater"),
)  # fmt: skip
"""Titles shown before the one asked for: a small model given the instructions alone
answers the question instead of naming it."""
TITLE_MAX_WORDS = 8

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
    """The prompt asking for a new rolling summary: one user message, the instructions,
    then the previous summary (if any) and the turns it does not cover yet as a
    transcript."""
    parts = [SUMMARY_INSTRUCTIONS, ""]
    if previous:
        parts += [f"Summary so far: {previous}", ""]
    parts.extend(f"{turn.role.value.capitalize()}: {turn.content}" for turn in turns)
    return (ChatMessage(role=Role.USER, content="\n".join(parts)),)


def is_summary_request(messages: Sequence[ChatMessage]) -> bool:
    return bool(messages) and messages[0].content.startswith(SUMMARY_INSTRUCTIONS)


def summary_note(system_prompt: str, summary: str | None) -> str:
    """The system message content: the system prompt, then the summary (if any).

    The summary joins the system message, not a message of its own, because
    many chat templates accept a system message only in first place."""
    if not summary:
        return system_prompt
    note = f"{SUMMARY_HEADING}\n{summary.strip()}"
    return f"{system_prompt}\n\n{note}" if system_prompt else note


def title_request(user_message: str) -> tuple[ChatMessage, ...]:
    """The prompt asking for a conversation's title from its first message: the
    instructions, the examples as earlier turns, then the message."""
    messages = [ChatMessage(role=Role.SYSTEM, content=TITLE_INSTRUCTIONS)]
    for question, title in (*TITLE_EXAMPLES, (user_message[:2000], None)):
        messages.append(ChatMessage(role=Role.USER, content=f"Title for: {question}"))
        if title is not None:
            messages.append(ChatMessage(role=Role.ASSISTANT, content=title))
    return tuple(messages)


def clean_title(text: str, user_message: str = "") -> str:
    """A model's title answer made fit for a list: first line, no quotes or final
    punctuation; one too long to be a title (a small model may answer the question
    instead) gives way to `fallback_title(user_message)`."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    title = lines[0].strip().strip("\"'`*#").strip() if lines else ""
    title = title.removeprefix("Title:").strip().rstrip(".!")
    if len(title) > MAX_TITLE_CHARS or len(title.split()) > TITLE_MAX_WORDS:
        return fallback_title(user_message)
    return title


def fallback_title(user_message: str) -> str:
    """A title from the first user message alone, cut on a word boundary."""
    words = " ".join(user_message.split())
    if len(words) <= MAX_TITLE_CHARS:
        return words
    cut = words[: MAX_TITLE_CHARS - 1].rsplit(" ", 1)[0]
    return cut + "…"
