"""`chatpipe up` kills an embedded broker that spins while nothing streams (then
`keep_broker` starts a new one), and leaves a busy one alone: a real spinning process
stands in for the broker."""

from __future__ import annotations

import asyncio
import signal
import sys

from chatpipe.supervise import SpinWatch, restart_a_spinning_broker


async def test_a_spinning_idle_broker_is_killed_and_a_busy_one_is_not() -> None:
    spinner = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    idle = [False, False, True, True, True, True, True, True]
    clock = iter(range(0, 10_000, 5))

    async def sleep(_: float) -> None:
        await asyncio.sleep(1.0)  # real time: the spinner's CPU grows meanwhile

    watching = asyncio.create_task(restart_a_spinning_broker(
        lambda: spinner.pid if spinner.returncode is None else None,
        lambda: idle.pop(0) if idle else True,
        SpinWatch(cpu=0.1, spin_s=10), sample_s=1.0, sleep=sleep,
        clock=lambda: float(next(clock)),
    ))  # fmt: skip
    try:
        code = await asyncio.wait_for(spinner.wait(), 20)
    finally:
        watching.cancel()
        if spinner.returncode is None:
            spinner.kill()
    assert code == -signal.SIGKILL
    assert len(idle) <= 3, "killed only after idle samples, never while busy"
