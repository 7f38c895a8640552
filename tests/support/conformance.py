"""What the store conformance tests share: a clock moved by hand, fresh names, and where
a real Cassandra is (`CASSANDRA_HOSTS`)."""

from __future__ import annotations

import os
import uuid

CASSANDRA_HOSTS = [h.strip() for h in os.environ.get("CASSANDRA_HOSTS", "").split(",") if h.strip()]
KEY_SECRET = b"conformance-key-secret"
NO_SERVER = (
    "CASSANDRA_HOSTS is not set: no Cassandra server to run the store against"
    " (e.g. CASSANDRA_HOSTS=127.0.0.1:9042); the emulated run still covers its logic"
)


class Names:
    """`n.c1` -> "c1-<unique suffix>": ids no other test uses."""

    def __init__(self) -> None:
        self._suffix = uuid.uuid4().hex[:10]

    def __getattr__(self, name: str) -> str:
        return f"{name}-{self._suffix}"


class Clock:
    """A settable clock: `store_clock.now` is what the next write is stamped with."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now
