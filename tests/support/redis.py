"""A redis-server of the test's own, where one is installed."""

from __future__ import annotations

import shutil

REDIS_SERVER = shutil.which("redis-server")
