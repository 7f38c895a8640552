"""Token counts of prompts as the engine will see them: rendered with the chat template.

The exact count (`count_prompt`) builds the whole message list's prompt as the
worker does (`common.prompt`): the template's special tokens, each content as
plain text, never as control tokens. Choosing which turns fit
needs a cost per message without rendering every candidate list, so
`estimate` adds a per-message template overhead, measured once, to the
tokens of the content; the context builder checks its final choice with
`count_prompt`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from common.prompt import (
    completion_prompt_ids,
    prompt_token_ids,
    template_ids,
    template_messages,
    text_ids,
)
from schemas.events import ChatMessage, Role

_PROBE = "probe"


class TokenCounter:
    """Counts tokens with one model's tokenizer and chat template; thread-safe."""

    def __init__(self, tokenizer: Any, *, cache_size: int = 50_000) -> None:
        self._tokenizer = tokenizer
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # fast tokenizers refuse concurrent use ("Already borrowed")
        self.overhead = self._measure_overhead()

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer has: 0 to vocab_size - 1."""
        return len(self._tokenizer)

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> TokenCounter:
        """The tokenizer (and chat template) of a local Hugging Face model directory."""
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text: chat template with the generation prompt (and `tools`), or a
        plain `role: content` transcript for a tokenizer without a template."""
        dicts = template_messages(messages)
        if getattr(self._tokenizer, "chat_template", None):
            with self._lock:
                return self._tokenizer.apply_chat_template(
                    dicts, tools=tools, tokenize=False, add_generation_prompt=True
                )
        return "".join(f"{m['role']}: {m['content']}\n" for m in dicts) + "assistant: "

    def count_prompt(
        self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> int:
        """Tokens of the prompt (with the `tools` it shows the model, OpenAI function
        tools): what the engine reports as prompt_tokens."""
        if not self._templated:
            with self._lock:
                return len(template_ids(self._tokenizer, self.render(messages, tools)))
        with self._lock:
            return len(prompt_token_ids(self._tokenizer, template_messages(messages), tools))

    def count_completion_prompt(self, prompt: str) -> int:
        """Tokens of a text completion's prompt (no template): its prompt_tokens."""
        with self._lock:
            return len(completion_prompt_ids(self._tokenizer, prompt))

    def count_text(self, text: str) -> int:
        """Tokens of a message's content: plain text, its control strings included."""
        with self._lock:
            if not self._templated:  # no template, no control tokens to guard against
                return len(template_ids(self._tokenizer, text))
            return len(text_ids(self._tokenizer, text))

    @property
    def _templated(self) -> bool:
        return bool(getattr(self._tokenizer, "chat_template", None))

    def estimate(self, message: ChatMessage) -> int:
        """Tokens one message adds to a prompt: its content plus the template's
        per-message overhead. Cached by role and content."""
        key = hashlib.blake2b(
            f"{message.role}\0{message.content}".encode(), digest_size=16
        ).digest()
        cached = self._cache.get(key)
        if cached is None:
            cached = self.count_text(message.content) + self.overhead
            with self._lock:
                self._cache[key] = cached
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return cached

    def _measure_overhead(self) -> int:
        """Template tokens around one message's content (role markers, end marker)."""
        one = [ChatMessage(role=Role.USER, content=_PROBE)]
        two = [*one, ChatMessage(role=Role.ASSISTANT, content=_PROBE)]
        added = self.count_prompt(two) - self.count_prompt(one)
        return max(0, added - self.count_text(_PROBE))
