"""The gateway's embedding model in a process of its own (`common.embedding_process`),
the bundled MiniLM: the same vectors and counts as the model in-process, the work done
in the child (not under the gateway's GIL), a killed child replaced, and no orphan
left when the gateway is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from common.embedding_process import PARENT_CHECK_S, EmbedderGone, EmbeddingProcess
from common.embeddings import SentenceEmbedder

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Anna lights the lamp at dusk.", "The ferry leaves at noon.", "Kafka keeps the log."]


@pytest.fixture(scope="module")
def process() -> Iterator[EmbeddingProcess]:
    embedder = EmbeddingProcess()
    yield embedder
    embedder.close()


def test_it_gives_the_in_process_models_vectors_and_counts(process: EmbeddingProcess) -> None:
    local = SentenceEmbedder()
    assert (process.name, process.dimensions, process.max_input_tokens) == (
        local.name, local.dimensions, local.max_input_tokens)  # fmt: skip
    assert np.allclose(process.embed(TEXTS), local.embed(TEXTS), atol=1e-5)
    assert process.token_counts(TEXTS) == local.token_counts(TEXTS)
    assert process.embed([]).shape == (0, 0)


def test_the_work_is_done_in_the_child_at_a_lower_priority(process: EmbeddingProcess) -> None:
    assert process.pid is not None and process.pid != os.getpid()
    child = psutil.Process(process.pid)
    assert child.nice() >= psutil.Process().nice() + 10
    texts = [f"sentence {i} about the lighthouse keeper and her lamp" for i in range(512)]
    child_before, ours_before = sum(child.cpu_times()[:2]), time.process_time()
    process.embed(texts)
    child_spent = sum(child.cpu_times()[:2]) - child_before
    ours_spent = time.process_time() - ours_before
    assert child_spent > 4 * ours_spent, (child_spent, ours_spent)


def test_a_killed_child_fails_its_call_and_the_next_call_starts_another(
    process: EmbeddingProcess,
) -> None:
    first = process.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    psutil.Process(first).wait(10)
    with pytest.raises(EmbedderGone):
        process.embed(TEXTS)
    assert process.embed(TEXTS).shape == (3, 384)
    assert process.pid not in (None, first)


def test_a_killed_parent_leaves_no_child() -> None:
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from common.embedding_process import EmbeddingProcess
        if __name__ == "__main__":
            embedder = EmbeddingProcess()
            print(embedder.pid, flush=True)
            time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        parent.kill()
        parent.wait(10)
        child.wait(PARENT_CHECK_S + 10)  # psutil.TimeoutExpired if it stays
    finally:
        parent.kill()
