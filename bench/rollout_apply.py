"""How long a weight change on `chat.rollout` takes to reach a running gateway.

    .venv/bin/python -m bench.rollout_apply      # ~30 s; a sim stack, 20 changes

Each change is a `RolloutSet` sent as `chatpipe rollout set` sends it; the delay runs
from `send_and_wait` to the gateway's aliases holding the new weights. Half the changes
come after an idle second (the gateway's consumer may be on its idle fetch wait).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench.metrics import percentile
from bus.clients import Publisher
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.tiny_model import TINY_MODEL_DIR
from schemas import topics
from schemas.events import RolloutSet

CHANGES = 20


async def apply_delays_ms() -> list[float]:
    settings = stack_settings(
        Path(tempfile.mkdtemp()),
        engine="sim",
        model=TINY_MODEL_DIR,
        model_name="v1",
        served_models=["v1", "v2"],
        model_aliases={"chat": {"v1": 0.5, "v2": 0.5}},
        auto_titles=False,
    )
    async with running_sim_stack(settings) as stack:
        aliases = stack.gateway.state.deps.aliases
        producer = stack.kafka.producer()
        await producer.start()
        delays = []
        try:
            for change in range(CHANGES):
                await asyncio.sleep(1.0 if change % 2 else 0.05)
                weights = {"v1": float(change + 1), "v2": 1.0}
                start = time.monotonic()
                await Publisher(producer).send_and_wait(
                    topics.ROLLOUT, RolloutSet(alias="chat", weights=weights), key="chat"
                )
                while aliases.weights("chat") != weights:  # noqa: ASYNC110 - the gateway keeps no event to wait on; polling is the measure
                    await asyncio.sleep(0.001)
                delays.append((time.monotonic() - start) * 1000)
        finally:
            await producer.stop()
    return delays


def main() -> None:
    delays = asyncio.run(apply_delays_ms())
    print(
        f"{len(delays)} weight changes: p50 {percentile(delays, 50):.0f} ms, "
        f"max {max(delays):.0f} ms from send to the gateway using them"
    )


if __name__ == "__main__":
    main()
