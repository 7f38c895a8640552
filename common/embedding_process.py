"""The embedding model in a process of its own, beside the gateway.

Embedding a batch is seconds of CPU (tokenising, then the model's forward pass), and
in the gateway's process it competes for the GIL with the event loop that relays every
stream. So the gateway's embedder (`/v1/embeddings`, uploads, retrieval) is a child
process that loads the model once and embeds on request: it lowers its own priority
(`NICE`, so on a busy machine the gateway's streams come first), and the gateway's
threads only wait on a pipe for its answer. One child serves one gateway, a batch at
a time; callers take turns a batch at a time (`retrieval.documents.embed`).

A child that dies (killed, out of memory) fails the calls it had, each with
`EmbedderGone`, and the next call starts a new one; a child whose gateway died exits
within `PARENT_CHECK_S`.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.embeddings import SentenceEmbedder, embedding_model_name

NICE = 10
"""What the child adds to its niceness."""
PARENT_CHECK_S = 1.0
"""How often the child checks that its parent still runs."""

_model: SentenceEmbedder | None = None
"""The child's model (set in the child only)."""


class EmbedderGone(RuntimeError):
    """The embedding process died while it had this call."""


@dataclass(frozen=True)
class _Shape:
    dimensions: int
    max_input_tokens: int


def _load(model_dir: Path | None, parent: int) -> None:
    global _model
    os.nice(NICE)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    _model = SentenceEmbedder(model_dir)


def _exit_with(parent: int) -> None:
    """End the child once its parent is gone (a killed gateway leaves no orphan)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _shape() -> _Shape:
    assert _model is not None
    return _Shape(_model.dimensions, _model.max_input_tokens)


def _embed(texts: list[str]) -> np.ndarray:
    assert _model is not None
    return _model.embed(texts)


def _token_counts(texts: list[str]) -> list[int]:
    assert _model is not None
    return _model.token_counts(texts)


class EmbeddingProcess:
    """A `SentenceEmbedder` (an `EmbeddingModel`) run in a child process. Blocking calls:
    call them from a worker thread, as `SentenceEmbedder`'s. Loading takes seconds, in
    the constructor."""

    def __init__(self, model_dir: Path | None = None) -> None:
        self.name = embedding_model_name(model_dir)
        self._model_dir = model_dir
        self._guard = threading.Lock()
        self._pool = self._started()
        shape: _Shape = self._call(_shape)
        self._shape = shape

    @property
    def dimensions(self) -> int:
        return self._shape.dimensions

    @property
    def max_input_tokens(self) -> int:
        return self._shape.max_input_tokens

    @property
    def pid(self) -> int | None:
        """The child's process id, once it runs."""
        processes = list(getattr(self._pool, "_processes", {}) or {})
        return processes[0] if processes else None

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors: np.ndarray = self._call(_embed, texts)
        return vectors

    def token_counts(self, texts: list[str]) -> list[int]:
        counts: list[int] = self._call(_token_counts, texts)
        return counts

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _started(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_load,
            initargs=(self._model_dir, os.getpid()),
        )

    def _call(self, function: Any, *args: Any) -> Any:
        with self._guard:
            pool = self._pool
        try:
            return pool.submit(function, *args).result()
        except BrokenProcessPool as broken:
            with self._guard:
                if self._pool is pool:
                    pool.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._started()
            raise EmbedderGone("the embedding process died; the next call starts another") \
                from broken  # fmt: skip
