"""Fixtures every tier shares: the models, the vLLM engine and the running stacks
(`tests.support.engine`, `tests.support.stack`), a browser for each module that drives
one (`tests.support.browser`), and a redis-server of the module's own."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from bus.broker import free_port
from tests.support.redis import REDIS_SERVER

pytest_plugins = ["tests.support.engine", "tests.support.stack", "tests.support.browser"]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            raise AssertionError("redis-server did not start")
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
