"""The tools stage's Kafka adapter: `chat.tools` in; each call's result on
`chat.tokens`, then the turn's next round on `chat.requests.<tier>`.
The decisions are `servertools.core`'s, the calls `servertools.toolbox`'s.

Rounds run side by side (a slow tool holds no other turn up). Commit policy: a
round's offset is committed once its results and next round are acknowledged
(`tracker.started` holds it open until then), so a stage killed mid-call runs the
round again on restart: its results land at the same positions (the one answer rule
drops the copies) and its next round has the same request id (the scheduler runs it
once). An event that does not parse, or is no server-tools round, goes to chat.dlq.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.stage_runner import RunnerOptions, Stage, StageRunner
from bus.subscriber import decode_record
from schemas import topics
from schemas.events import ToolRound
from servertools.core import caller_of, next_round, results
from servertools.toolbox import Toolbox

log = logging.getLogger(__name__)

STAGE = "tools"
GROUP = "chatpipe-tools"


class ToolsStage(Stage):
    def __init__(
        self,
        kafka: KafkaConfig,
        toolbox: Toolbox,
        warm_up: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`warm_up`: loads what the tools need (the embedding model of search_documents)
        beside the consumer, so the first round after a start does not wait for it."""
        self.toolbox = toolbox
        self._warm_up = warm_up
        self._rounds: set[asyncio.Task[None]] = set()
        self.runner = StageRunner(
            kafka,
            STAGE,
            GROUP,
            [topics.TOOLS],
            self,
            RunnerOptions(poll_ms=100, commit_on_revoke=True),
        )

    async def run(self) -> None:
        warming = asyncio.create_task(_warmed(self._warm_up)) if self._warm_up else None
        try:
            await self.runner.run()
        finally:
            for task in self._rounds:
                task.cancel()
            if warming is not None:
                warming.cancel()

    def busy(self) -> int:
        return len(self._rounds)

    async def handle(self, record: ConsumerRecord) -> None:
        tool_round = decode_record(ToolRound, record)
        if tool_round.request.server_tools is None:
            raise ValueError("a tool round of a turn without server tools")
        tp = TopicPartition(record.topic, record.partition)
        self.runner.tracker.started(tp, record.offset)
        task = asyncio.create_task(self._run(tool_round, tp, record.offset))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _run(self, tool_round: ToolRound, tp: TopicPartition, offset: int) -> None:
        request = tool_round.request
        log.info(
            "round %s of %s: running %d call(s)",
            request.request_id,
            request.answer_id,
            len(tool_round.calls.calls),
        )
        try:
            caller = caller_of(tool_round)
            outcomes = await asyncio.gather(
                *(self.toolbox.run(call, caller) for call in tool_round.calls.calls)
            )
            answered = results(tool_round, outcomes)
            publisher = self.runner.publisher
            for result in answered:
                await publisher.send(topics.TOKENS, result, key=request.conversation_id)
            await publisher.flush()  # the results are on the stream before the next round
            following = next_round(tool_round, answered)
            await publisher.send_and_wait(
                topics.requests_topic(following.tier), following, key=request.conversation_id
            )
        except asyncio.CancelledError:
            raise  # stopping: not done, the next owner of the partition runs it again
        except Exception:  # one round's failure must not stop the stage
            log.exception("tool round of %s failed", request.request_id)
        self.runner.tracker.done(tp, offset)


async def _warmed(warm_up: Callable[[], Awaitable[None]]) -> None:
    started = time.monotonic()
    try:
        await warm_up()
    except Exception:  # the first round loads it, or reports the failure
        log.warning("warming up failed; the first round that needs it loads it", exc_info=True)
        return
    log.info("warmed up in %.1f s", time.monotonic() - started)
