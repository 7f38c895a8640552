"""A whole pipeline in this process on a throwaway broker and database, for the tests
and the benchmarks (`chatpipe up` is the same stack, run until stopped).

    settings = stack_settings(tmp_path, engine="sim", max_slots=4)
    async with running_sim_stack(settings) as stack:
        ...  # stack.base_url, with API_KEY as the bearer key
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from chatpipe.settings import Settings
from chatpipe.tiny_model import TINY_MODEL_DIR
from chatpipe.wiring import Stack, running_stack
from workers.engine import Engine
from workers.sim_engine import SimEngine

API_KEY = "test-dev-key"
"""The development key every stack of `stack_settings` accepts."""


def stack_settings(tmp: Path, **overrides: object) -> Settings:
    """Settings of a stack on its own embedded broker, free port and database under
    `tmp`, quick to notice a dropped stream, with no tier's limit on a key's concurrent
    generations (tests and benchmarks load the stack from one key; a key or org given
    its own limit keeps it), serving the tiny model ("tiny-random"); `overrides` win."""
    values: dict[str, Any] = {
        "kafka_bootstrap_servers": None,
        "model": TINY_MODEL_DIR,
        "port": 0,
        "dev_api_key": API_KEY,
        "database_path": tmp / "chatpipe.db",
        "coalesce_ms": 50,
        "heartbeat_interval_s": 0.5,
        # A dropped stream frees its slot soon (tests of the grace itself set their own).
        "resume_grace_s": 0.5,
        "max_concurrent_requests": {},
        **overrides,
    }
    return Settings(**values)


def running_sim_stack(settings: Settings) -> contextlib.AbstractAsyncContextManager[Stack]:
    """Every stage in process around a sim engine made from `settings`."""
    return running_engine_stack(
        settings,
        SimEngine(
            settings.inference.model_name,
            settings.inference.max_slots,
            settings.inference.sim_tokens_per_s,
            settings.inference.sim_prompt_tokens_per_s,
        ),
    )


@contextlib.asynccontextmanager
async def running_engine_stack(settings: Settings, engine: Engine) -> AsyncIterator[Stack]:
    """Every stage in process around `engine`, started here and stopped after."""
    await engine.start()
    try:
        async with running_stack(settings, engine) as stack:
            yield stack
    finally:
        await engine.stop()
