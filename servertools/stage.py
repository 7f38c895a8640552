"""The tools stage's Kafka adapter: `chat.tools` in; each call's result on
`chat.tokens`, then the turn's next round on `chat.requests.<tier>`.
The decisions are `servertools.core`'s, the calls `servertools.toolbox`'s.

Rounds run side by side (a slow tool holds no other turn up); within a round each
result is acknowledged before the next is sent, so they land in order and one the bus
refuses is seen. Commit policy: a round's offset is committed once its results and
next round are acknowledged (`tracker.started` holds it open until then), so a stage
killed mid-call runs the round again on restart: its results land at the same
positions (the one answer rule drops the copies) and its next round has the same
request id (the scheduler runs it once). An event that does not parse, or is no
server-tools round, goes to chat.dlq.

Every round ends: a call that fails is the model's error result (`Toolbox.run` never
raises), and a round whose results or next round cannot be built or sent (the bus
refusing a next round too large for it, say) goes to chat.dlq by the runner's own path
(`StageRunner.failed`) and its answer ends with an error on its stream (`on_failure`,
`servertools.failures`): `pipeline_rejected` when the bus refused a record,
`tool_round_failed` otherwise. The round is committed past then, never run again.
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
from schemas.codec import EventDecodeError
from schemas.events import ToolRound
from servertools.core import caller_of, next_round, results, round_failed
from servertools.failures import round_error
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
        self.runner.tracker.started(TopicPartition(record.topic, record.partition), record.offset)
        task = asyncio.create_task(self._run(tool_round, record))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _run(self, tool_round: ToolRound, record: ConsumerRecord) -> None:
        try:
            await self._round(tool_round)
        except asyncio.CancelledError:
            raise  # stopping: not done, the next owner of the partition runs it again
        except Exception as exc:  # noqa: BLE001 - a round's failure ends its answer, not the stage
            await self.runner.failed(record, exc)  # logged, dead-lettered, answer ended
        self.runner.tracker.done(TopicPartition(record.topic, record.partition), record.offset)

    async def _round(self, tool_round: ToolRound) -> None:
        """Run the calls, send their results, then queue the next round."""
        request = tool_round.request
        log.info(
            "round %s of %s: running %d call(s)",
            request.request_id,
            request.answer_id,
            len(tool_round.calls.calls),
        )
        caller = caller_of(tool_round)
        outcomes = await asyncio.gather(
            *(self.toolbox.run(call, caller) for call in tool_round.calls.calls)
        )
        answered = results(tool_round, outcomes)
        publisher = self.runner.publisher
        for result in answered:
            await publisher.send_and_wait(topics.TOKENS, result, key=request.conversation_id)
        following = next_round(tool_round, answered)
        await publisher.send_and_wait(
            topics.requests_topic(following.tier), following, key=request.conversation_id
        )

    async def on_failure(self, record: ConsumerRecord, exc: Exception) -> None:
        """A round that could not be handed on ends its answer with an error."""
        try:
            tool_round = decode_record(ToolRound, record)
        except EventDecodeError:
            return  # nothing says which answer it belonged to
        if tool_round.request.server_tools is None:
            return  # not a server-tools round: no answer of this stage's to end
        end = round_failed(tool_round, *round_error(exc))
        await self.runner.publisher.send_and_wait(
            topics.TOKENS, end, key=tool_round.request.conversation_id
        )


async def _warmed(warm_up: Callable[[], Awaitable[None]]) -> None:
    started = time.monotonic()
    try:
        await warm_up()
    except Exception:  # the first round loads it, or reports the failure
        log.warning("warming up failed; the first round that needs it loads it", exc_info=True)
        return
    log.info("warmed up in %.1f s", time.monotonic() - started)
