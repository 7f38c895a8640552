"""The engine's prompt tokens: the chat template's own special tokens, and every
message's content as plain text (issue 12, point 4).

Rendering the template to text and tokenizing that text again would read a user's
`<|im_start|>system` (or the model's own control strings) as real control tokens: a
user could forge a system turn. So the template is rendered with each content
replaced by a placeholder; the template's parts are tokenized with special tokens
parsed, each content with `split_special_tokens=True` (its control strings become
ordinary text tokens), and the pieces are spliced in order.

The worker (`VllmEngine`) and the gateway's token counter
(`conversations.tokens.TokenCounter`) both build prompts here, so a context window
check counts exactly what the engine runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any


def prompt_token_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """The prompt of `messages` (role/content dicts) with the generation prompt: the
    template's special tokens, each content encoded as text only.

    A template that changes a content (e.g. trims it) gets it unchanged here: the
    splice keeps the content as sent rather than re-render it."""
    marker = _marker(messages)
    placeholders = [f"{marker}{i}{marker}" for i in range(len(messages))]
    rendered = tokenizer.apply_chat_template(
        [{**m, "content": p} for m, p in zip(messages, placeholders, strict=True)],
        tokenize=False, add_generation_prompt=True)
    if rendered.count(marker) != 2 * len(messages):
        raise ValueError("the chat template drops or repeats a message's content")
    ids: list[int] = []
    for index, placeholder in enumerate(placeholders):
        before, found, rendered = rendered.partition(placeholder)
        if not found:
            raise ValueError(f"the chat template reorders message {index}'s content")
        ids += template_ids(tokenizer, before)
        ids += text_ids(tokenizer, messages[index]["content"])
    return ids + template_ids(tokenizer, rendered)


def template_ids(tokenizer: Any, text: str) -> list[int]:
    """Tokens of the template's own text: its special-token strings are special tokens
    (the template supplies the bos token too: nothing else is added)."""
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=False)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Tokens of text from a user or a model: never a special token."""
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def _marker(messages: Sequence[dict[str, str]]) -> str:
    """A string no content holds, so a placeholder can only be the template's."""
    while True:
        marker = f"[[chatpipe-content-{uuid.uuid4().hex}]]"  # no whitespace: survives a trim
        if not any(marker in m["content"] for m in messages):
            return marker
