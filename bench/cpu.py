"""CPU time of the processes under test, of the load client, and of everything else.

A phase is metered by a snapshot before and after it. What the machine spent
beyond our own processes ("foreign") is reported too: on a shared machine it
says how far a number can be trusted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import psutil

from bench.processes import Service


@dataclass(frozen=True)
class CpuSnapshot:
    at: float
    by_process: dict[str, float]
    client: float
    machine_busy: float


def snapshot(services: list[Service]) -> CpuSnapshot:
    by_process: dict[str, float] = {}
    for service in services:
        for label, seconds in service.cpu_by_process().items():
            name = service.name if label == "main" else f"{service.name}/{label}"
            by_process[name] = by_process.get(name, 0.0) + seconds
    own = psutil.Process().cpu_times()
    machine = psutil.cpu_times()
    busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
    return CpuSnapshot(time.monotonic(), by_process, own.user + own.system, busy)


@dataclass(frozen=True)
class CpuUse:
    wall_s: float
    by_process: dict[str, float]
    """CPU seconds per process of the services under test."""
    client: float
    foreign: float
    """CPU seconds spent by processes that are neither under test nor the client."""

    @property
    def tested(self) -> float:
        return sum(self.by_process.values())

    def cores(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0


def between(before: CpuSnapshot, after: CpuSnapshot) -> CpuUse:
    by_process = {
        name: after.by_process[name] - before.by_process.get(name, 0.0) for name in after.by_process
    }
    client = after.client - before.client
    busy = after.machine_busy - before.machine_busy
    return CpuUse(
        after.at - before.at, by_process, client, max(0.0, busy - sum(by_process.values()) - client)
    )


QUIET_CORES = 0.3
"""Other processes using less than this are "quiet"."""


async def wait_for_quiet(
    max_wait_s: float, services: list[Service] | None = None, window_s: float = 2.0
) -> float:
    """Wait (at most `max_wait_s`) until processes other than `services` and this one
    use under QUIET_CORES over `window_s`; returns the cores they used in the last window."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = snapshot(services or [])
        await asyncio.sleep(window_s)
        use = between(before, snapshot(services or []))
        foreign = use.cores(use.foreign)
        if foreign < QUIET_CORES or time.monotonic() >= deadline:
            return foreign
