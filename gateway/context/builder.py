"""The context builder the gateway calls per turn: store reads and model work around
the pure `context.assemble`.

Tokenizers (one per model) and the embedding model load on first use, in a
worker thread; `warm_up` loads them at start instead. Tokenizing and
embedding run in worker threads too, so the event loop never waits on them.

Embeddings (strategy `retrieve`) are cached in the conversation store per
message and embedding model (`save_embeddings` / `load_embeddings`): every
gateway replica shares them and a restart recomputes nothing. Each turn
embeds only the new message and the thread's messages not seen before
(usually just the previous answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from common.embeddings import Embedder, from_bytes, similarities, to_bytes
from conversations.store import ConversationStore, StoredMessage, Summary
from gateway.config import ContextConfig
from gateway.context.history import prompt_turns
from gateway.context.tokens import TokenCounter
from gateway.context.window import BuiltContext, ContextPolicy, Counting, assemble
from schemas.events import ChatMessage, Role


class ContextBuilder:
    """Builds each turn's prompt under its model's policy (see `gateway.context.window`)."""

    def __init__(
        self,
        *,
        system_prompt: str,
        policy: Callable[[str, int], ContextPolicy],
        counter: Callable[[str], TokenCounter],
        embedder: Callable[[], Embedder] | None = None,
        summary_model: Callable[[str], str] = lambda model: model,
    ) -> None:
        """`policy(model, max_tokens)`, `counter(model)` (called once per model, in a
        thread), `embedder()` (once, in a thread; None: no retrieval), and
        `summary_model(model)`: which model summarises a conversation on `model`."""
        self.system_prompt = system_prompt
        self.policy = policy
        self.summary_model = summary_model
        self._make_counter = counter
        self._make_embedder = embedder
        self._counters: dict[str, TokenCounter] = {}
        self._embedder: Embedder | None = None
        self._loading = asyncio.Lock()

    @classmethod
    def from_config(cls, config: ContextConfig) -> ContextBuilder:
        """Per-model windows, strategies and tokenizers (a model not named: the defaults)."""

        def policy(model: str, max_tokens: int) -> ContextPolicy:
            return ContextPolicy(
                strategy=config.strategies.get(model, config.default_strategy),
                max_prompt_tokens=config.window_tokens.get(model, config.default_window_tokens)
                - max_tokens,
                keep_ratio=config.keep_ratio,
                summary_trigger_ratio=config.summary_trigger_ratio,
                retrieve_top_k=config.retrieve_top_k,
                retrieve_min_similarity=config.retrieve_min_similarity,
                retrieve_budget_ratio=config.retrieve_budget_ratio,
            )

        def counter(model: str) -> TokenCounter:
            return TokenCounter.from_dir(config.tokenizers.get(model, config.default_tokenizer))

        def embedder() -> Embedder:
            from common.embedding_process import EmbeddingProcess

            return EmbeddingProcess(config.embedding_model)

        def summary_model(model: str) -> str:
            return config.summary_model or model

        return cls(system_prompt=config.system_prompt, policy=policy, counter=counter,
                   embedder=embedder, summary_model=summary_model)  # fmt: skip

    async def warm_up(self, models: Sequence[str], *, embedder: bool = False) -> None:
        """Load the tokenizers of `models` (and the embedding model) now."""
        for model in models:
            await self._counter(model)
        if embedder:
            await self.embedding_model()

    async def prompt_tokens(
        self, model: str, messages: Sequence[ChatMessage], tools: list[dict[str, Any]] | None = None
    ) -> int:
        """Tokens of `messages` as `model`'s prompt (its tokenizer and chat template),
        with the `tools` it shows the model."""
        counter = await self._counter(model)
        return await asyncio.to_thread(counter.count_prompt, list(messages), tools)

    async def completion_prompt_tokens(self, model: str, prompt: str) -> int:
        """Tokens of a text completion's `prompt` for `model` (no chat template)."""
        counter = await self._counter(model)
        return await asyncio.to_thread(counter.count_completion_prompt, prompt)

    async def vocab_size(self, model: str) -> int:
        """How many token ids `model`'s tokenizer has."""
        return (await self._counter(model)).vocab_size

    async def build(
        self,
        store: ConversationStore,
        conversation_id: str,
        thread: Sequence[StoredMessage],
        new_user_message: str | None,
        *,
        model: str,
        max_tokens: int,
        documents: str | None = None,
        instructions: str | None = None,
    ) -> BuiltContext:
        """The prompt answering `new_user_message` after `thread` (the current branch,
        root first, e.g. `(await store.get_tree(cid)).thread()`).

        With `new_user_message=None` (regenerate) the thread's last message is
        the user message to answer. `max_tokens` is the answer's limit: the
        prompt gets the model's window minus it. `documents`: excerpts of the user's
        files to answer from (`gateway.context.window.assemble`). `instructions`: the client's
        own system text for this answer, after the deployment's system prompt.
        """
        turns = prompt_turns(thread)
        if new_user_message is None:
            if not turns or turns[-1].role != Role.USER:
                raise ValueError("regenerating needs a thread ending with a user message")
            new_user_message = turns.pop().content
        policy = self.policy(model, max_tokens)
        summary = None
        if policy.strategy == "summary":
            summary = _newest_on_thread(await store.list_summaries(conversation_id), turns)
        relevance = None
        if policy.strategy == "retrieve":
            relevance = await self._relevance(store, conversation_id, turns, new_user_message)
        counter = await self._counter(model)
        system = "\n\n".join(text for text in (self.system_prompt, instructions) if text)
        return await asyncio.to_thread(
            assemble, turns, new_user_message, system, policy,
            Counting(counter.estimate, counter.count_prompt),
            conversation_id=conversation_id, summary=summary, relevance=relevance,
            documents=documents,
        )  # fmt: skip

    async def _relevance(
        self, store: ConversationStore, conversation_id: str, turns: list[StoredMessage], query: str
    ) -> dict[str, float]:
        if not turns or self._make_embedder is None:
            return {}
        embedder = await self.embedding_model()
        cached = await store.load_embeddings(conversation_id, embedder.name)
        missing = [m for m in turns if m.message_id not in cached]
        vectors = await asyncio.to_thread(embedder.embed, [query, *(m.content for m in missing)])
        fresh = {m.message_id: to_bytes(v) for m, v in zip(missing, vectors[1:], strict=True)}
        if fresh:
            await store.save_embeddings(conversation_id, embedder.name, fresh)
        cached.update(fresh)
        known = [m.message_id for m in turns]
        scores = similarities(vectors[0], np.stack([from_bytes(cached[i]) for i in known]))
        return dict(zip(known, map(float, scores), strict=True))

    async def _counter(self, model: str) -> TokenCounter:
        if model not in self._counters:
            async with self._loading:
                if model not in self._counters:
                    self._counters[model] = await asyncio.to_thread(self._make_counter, model)
        return self._counters[model]

    @property
    def embeds(self) -> bool:
        """Whether an embedding model is configured (`embedding_model` loads it)."""
        return self._make_embedder is not None

    async def embedding_model(self) -> Embedder:
        """The embedding model, loaded (in a thread) on the first call."""
        if self._embedder is None:
            if self._make_embedder is None:
                raise RuntimeError("no embedding model configured")
            async with self._loading:
                if self._embedder is None:
                    self._embedder = await asyncio.to_thread(self._make_embedder)
        return self._embedder

    async def close(self) -> None:
        """Stop the embedding model's process, if one was started."""
        close = getattr(self._embedder, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


def _newest_on_thread(
    summaries: list[Summary], turns: Sequence[StoredMessage]
) -> tuple[str, str] | None:
    """(through_message_id, text) of the summary reaching furthest down this thread."""
    position = {m.message_id: i for i, m in enumerate(turns)}
    on_thread = [s for s in summaries if s.through_message_id in position]
    if not on_thread:
        return None
    best = max(on_thread, key=lambda s: (position[s.through_message_id], s.created_at))
    return best.through_message_id, best.content
