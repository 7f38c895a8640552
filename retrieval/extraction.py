"""A file's text read and chunked in a process of its own, under limits.

pypdf is pure Python, and a hostile PDF makes it work hard (its extraction grows
faster than a content stream's size: a 30 KB file whose one stream inflates to 5 MB
takes tens of seconds). Run in the gateway, that would hold the event loop's GIL and
stall every stream it relays. So each file is read by a child process
(`python -m retrieval.extraction`): it gets the file on stdin, lowers its own
priority (nice 10, so the gateway's own work comes first on a busy machine), sets
its limits before it touches the file — CPU time (`RLIMIT_CPU`: past it the kernel
kills it) and address space (`RLIMIT_AS`: past it an allocation fails) — and answers
the chunks as one JSON object on stdout. The caps on pages, a page's content and the
text (`retrieval.extract.TextCaps`) are checked as it reads, so it stops at the
first one passed. The parent kills it at `timeout_s` of wall-clock time.

A gateway runs at most `concurrency` of them at once; `QUEUED_PER_PROCESS` uploads
per process may wait for one, and one more is refused (`ExtractionBusy`) rather
than piled up. Every refusal is one of `retrieval.extract`'s errors, naming the
limit; a child that fails otherwise (a bug, not the file) raises `RuntimeError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from retrieval.chunking import Chunk, chunk_text
from retrieval.extract import (
    FileTooComplex,
    TextCaps,
    TextTooLong,
    TooManyPages,
    UnreadableFile,
    extract_text,
)

log = logging.getLogger(__name__)

QUEUED_PER_PROCESS = 4
"""Uploads that may wait, per extraction process, before one more is refused."""
NICE = 10
"""What the child adds to its niceness: on a busy machine the gateway runs first."""
OUT_OF_MEMORY_EXIT = 3
"""The child's exit status when an allocation failed under its `RLIMIT_AS`."""

_REFUSALS: dict[str, type[ValueError]] = {
    "unreadable": UnreadableFile,
    "too_many_pages": TooManyPages,
    "text_too_long": TextTooLong,
    "too_complex": FileTooComplex,
}
_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding this `retrieval` package: the child imports the same code."""


@dataclass(frozen=True, slots=True)
class ExtractionLimits:
    """What reading one file may take: its caps, the process's CPU seconds, address
    space and wall-clock seconds, and how many such processes a gateway runs at once."""

    caps: TextCaps = field(default_factory=TextCaps)
    cpu_s: float = 20.0
    memory_bytes: int = 512 << 20
    timeout_s: float = 30.0
    concurrency: int = 2


class ExtractionBusy(RuntimeError):
    """Every extraction process is busy and the uploads waiting fill the queue."""


@dataclass(frozen=True, slots=True)
class _Job:
    """What the child is told, as the first line of its stdin (the file follows)."""

    kind: str
    caps: TextCaps
    chunk_chars: int
    overlap_chars: int
    cpu_s: float
    memory_bytes: int


class Extractor:
    """Reads files into chunks in limited child processes, `concurrency` at a time."""

    def __init__(self, limits: ExtractionLimits, chunk_chars: int, overlap_chars: int) -> None:
        self.limits = limits
        self.chunk_chars = chunk_chars
        self.overlap_chars = overlap_chars
        self._slots = asyncio.Semaphore(limits.concurrency)
        self._waiting = 0
        self.running = 0
        """Extraction processes running now."""

    async def chunks(self, kind: str, data: bytes) -> list[Chunk]:
        """The chunks of `data` (of type `kind`, `retrieval.extract.file_type`). Raises
        `ExtractionBusy`, or what `extract_text` raises: `UnreadableFile`, `TooManyPages`,
        `TextTooLong`, `FileTooComplex` (also for the CPU time, memory or time the
        child ran out of)."""
        async with self._slot():
            return await self._run(kind, data)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        queue = QUEUED_PER_PROCESS * self.limits.concurrency
        if self._slots.locked() and self._waiting >= queue:
            raise ExtractionBusy(
                f"{self.limits.concurrency} files are being read and {queue} wait; retry soon"
            )
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()

    async def _run(self, kind: str, data: bytes) -> list[Chunk]:
        limits = self.limits
        job = _Job(kind, limits.caps, self.chunk_chars, self.overlap_chars, limits.cpu_s,
                   limits.memory_bytes)  # fmt: skip
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "retrieval.extraction",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=_child_env(),
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(
                child.communicate(json.dumps(asdict(job)).encode() + b"\n" + data),
                limits.timeout_s,
            )
        except TimeoutError:
            raise FileTooComplex(
                f"reading the file's text took longer than {limits.timeout_s:g} s"
            ) from None
        finally:
            if child.returncode is None:  # timed out, or the upload was cancelled
                child.kill()
                await child.wait()
        return outcome(child.returncode, out, err, limits)


def outcome(status: int | None, out: bytes, err: bytes, limits: ExtractionLimits) -> list[Chunk]:
    """The child's answer (exit `status`, `out` and `err` as it wrote them) as chunks, or
    the refusal it stands for; `RuntimeError` for a child that failed on its own."""
    if status == -signal.SIGXCPU:
        raise FileTooComplex(f"reading the file's text took more than {limits.cpu_s:g} s of CPU")
    if status == OUT_OF_MEMORY_EXIT:
        raise FileTooComplex(
            f"reading the file's text needs more than {limits.memory_bytes >> 20} MiB of memory"
        )
    if status is not None and status < 0:  # the OOM killer, or a crash in a C library
        name = signal.strsignal(-status) or f"signal {-status}"
        log.warning("the extraction process was killed by %s: %s", name, err[-2000:])
        raise FileTooComplex(f"the process reading the file's text was killed ({name})")
    if status != 0:
        log.error("the extraction process failed (exit %s): %s", status, err[-4000:])
        raise RuntimeError(f"the extraction process failed (exit {status})")
    answer = json.loads(out)
    refused = answer.get("refused")
    if refused is not None:
        raise _REFUSALS[refused](answer["message"])
    return [Chunk(index, text) for index, text in enumerate(answer["chunks"])]


def _child_env() -> dict[str, str]:
    """The gateway's environment, with this checkout first on the child's path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), path) if p)}


def _limit_self(cpu_s: float, memory_bytes: int) -> None:
    import resource

    os.nice(NICE)
    cpu = max(1, math.ceil(cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _answer(job: _Job, data: bytes) -> dict[str, object]:
    try:
        text = extract_text(job.kind, data, job.caps)
    except (UnreadableFile, TooManyPages, TextTooLong, FileTooComplex) as error:
        code = next(code for code, kind in _REFUSALS.items() if isinstance(error, kind))
        return {"refused": code, "message": str(error)}
    chunks = chunk_text(text, job.chunk_chars, job.overlap_chars)
    return {"chunks": [chunk.text for chunk in chunks]}


def main() -> None:
    """The child: the job line, then the file, on stdin; the answer on stdout."""
    import pypdf  # noqa: F401 - loaded before the limits, which bound the file's work only

    stdin = sys.stdin.buffer
    fields = json.loads(stdin.readline())
    job = _Job(**{**fields, "caps": TextCaps(**fields["caps"])})
    _limit_self(job.cpu_s, job.memory_bytes)
    try:
        answer = json.dumps(_answer(job, stdin.read()), ensure_ascii=False)
        sys.stdout.buffer.write(answer.encode())
        sys.stdout.flush()
    except MemoryError:
        os._exit(OUT_OF_MEMORY_EXIT)


if __name__ == "__main__":
    main()
