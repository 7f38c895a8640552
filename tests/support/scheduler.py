"""A scheduler core under a hand-moved clock, and the requests and heartbeats fed to it."""

from __future__ import annotations

from scheduler.core import Policy, Scheduler
from schemas.events import (
    ChatMessage,
    GenerationRequest,
    Role,
    StreamPosition,
    WorkerHeartbeat,
)
from schemas.topics import Tier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_request(
    request_id: str,
    tier: Tier = Tier.FREE,
    model: str = "big",
    user: str = "u",
    org: str = "o",
    deadline: float | None = None,
    conversation: str | None = None,
    text: str = "hello there",
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        conversation_id=conversation or f"c-{request_id}",
        message_id=f"m-{request_id}",
        user_id=user,
        org_id=org,
        tier=tier,
        model=model,
        messages=(ChatMessage(role=Role.USER, content=text),),
        reply_to="chat.deliver.gw",
        deadline=deadline,
    )


def heartbeat(
    worker_id: str = "w1",
    slots: int = 2,
    active: tuple[str, ...] = (),
    consumed: dict[int, int] | None = None,
    model: str = "big",
    partitions: tuple[int, ...] = (0, 1),
    stopping: bool = False,
    waiting: int = 0,
    free_kv_blocks: int | None = None,
    assignments: dict[str, tuple[int, int]] | None = None,
    handed_back: tuple[str, ...] = (),
    incarnation: str = "",
) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        worker_id=worker_id,
        incarnation=incarnation,
        model=model,
        partitions=partitions,
        max_slots=slots,
        active=active,
        consumed=consumed or {},
        stopping=stopping,
        waiting=waiting,
        free_kv_blocks=free_kv_blocks,
        assignments=assignments or {},
        handed_back=handed_back,
    )


def make_scheduler(clock: Clock | None = None, **policy: object) -> Scheduler:
    clock = clock or Clock()
    return Scheduler(Policy(**policy), clock=clock, wall=clock)


def ids(dispatches) -> list[str]:
    return [d.request.request_id for d in dispatches]


def sent(core: Scheduler, dispatch, offset: int, marker: int = 0) -> GenerationRequest:
    """Acknowledge `dispatch` at `offset` of chat.work, as the stage does after writing
    its attempt's marker at `marker` on chat.tokens; returns the request as sent."""
    request = dispatch.request
    start = request.stream.start_offset if request.stream else marker
    request = request.model_copy(
        update={"stream": StreamPosition(partition=0, start_offset=start, attempt_offset=marker)}
    )
    core.on_dispatched(request, dispatch.worker_id, offset)
    return request


def finish(core: Scheduler, worker: str, dispatches, slots: int = 1, **hb) -> None:
    """Acknowledge `dispatches` at offsets 0.. and report them read and ended."""
    for offset, d in enumerate(dispatches):
        sent(core, d, offset)
    core.on_heartbeat(heartbeat(worker, slots=slots, consumed={0: 1000, 1: 1000}, **hb))
