"""Where a running `chatpipe up` listens, for the commands that talk to it.

`chatpipe up` writes `<database>.run.json` beside its SQLite database when it is up
and removes it when it stops: its pid, the broker's address (the embedded one, or
the external Kafka it was given) and the gateway's URL. A command without
KAFKA_BOOTSTRAP_SERVERS reads it from the same `CHATPIPE_DATABASE_PATH` (by default
`chatpipe.db` in the current directory), and ignores a file whose process is gone
(a `chatpipe up` that was killed leaves its file behind)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_FILE_SUFFIX = ".run.json"


@dataclass(frozen=True)
class RunInfo:
    pid: int
    bootstrap_servers: str
    embedded_broker: bool
    """The broker is `chatpipe up`'s own (no credential: it listens on loopback only)."""
    gateway_url: str
    started_at: float


class NoRunningStack(LookupError):
    """No broker to talk to: the message says why and what to do."""


def run_file(database_path: Path) -> Path | None:
    """The runtime file beside the database; None for an in-memory database."""
    if str(database_path) == ":memory:":
        return None
    return database_path.with_name(database_path.name + RUN_FILE_SUFFIX)


@contextlib.contextmanager
def published_run(
    database_path: Path, bootstrap_servers: str, gateway_url: str, embedded_broker: bool
) -> Iterator[Path | None]:
    """The runtime file, there while the block runs (removed after, if still ours)."""
    path = run_file(database_path)
    if path is None:
        yield None
        return
    info = RunInfo(os.getpid(), bootstrap_servers, embedded_broker, gateway_url, time.time())
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(asdict(info), indent=2) + "\n")
    partial.replace(path)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            if read_run_file(path).pid == info.pid:
                path.unlink()


def read_run_file(path: Path) -> RunInfo:
    return RunInfo(**json.loads(path.read_text()))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, alive
    return True


def running_stack_info(database_path: Path, alive: Callable[[int], bool] = pid_alive) -> RunInfo:
    """The running `chatpipe up` of this database; NoRunningStack if there is none."""
    path = run_file(database_path)
    hint = "start `chatpipe up` (in this directory) or set KAFKA_BOOTSTRAP_SERVERS"
    if path is None or not path.exists():
        raise NoRunningStack(
            f"no broker: KAFKA_BOOTSTRAP_SERVERS is not set and no running "
            f"`chatpipe up` was found ({path or database_path} missing); {hint}"
        )
    try:
        info = read_run_file(path)
    except (ValueError, TypeError, KeyError) as exc:
        raise NoRunningStack(f"no broker: {path} is unreadable ({exc}); {hint}") from None
    if not alive(info.pid):
        raise NoRunningStack(
            f"no broker: {path} is stale (its `chatpipe up`, pid {info.pid}, "
            f"is not running); {hint}"
        )
    return info
