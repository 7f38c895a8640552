"""The `sim` engine adapter: a deterministic stand-in for load tests.

A reply is a sequence of words from a fixed list, chosen by a hash of the
request id and the last user message, so a redelivered request gets the same
text. One word is one token. Each request first "prefills" for
`prompt_tokens / prompt_tokens_per_s` seconds and emits its first token at once,
then `tokens_per_s` tokens a second. As in a real engine, running requests advance
together on one step clock (one timer for all of them, a step every
1 / `tokens_per_s`): each step releases the tokens that fell due, so tokens that fell
due while the event loop was busy come out together in one output, as vLLM merges
deltas. At most `max_slots` requests run at once;
the rest wait (reported as `waiting`). Without `ignore_eos` a reply stops by
itself after 20–120 words (FINISHED_STOPPED) unless `max_tokens` comes first
(FINISHED_LENGTH). Stop strings end the reply where they first appear.

Scripted mode — directives in the last user message, e.g. `[[sim:reply=Hi there]]`:

- `[[sim:reply=TEXT]]`  the reply is TEXT (split on spaces, one token per word)
- `[[sim:length=N]]`    the reply stops by itself after N words
- `[[sim:fail]]`        `generate` raises `SimEngineFailure` before the first token
- `[[sim:call=NAME {"arg": ...}]]`  offered tools, the reply calls NAME (any name: a
  model may call a tool it was not offered) with those arguments, in the hermes format,
  as long as the last message is the user's (after a tool's result it answers in text)

A required or named tool choice is answered with a call of the first (or the named)
function with the least arguments its schema takes (`workers.tool_calls.example_output`),
a few characters a token; `auto` is answered with text, as a model that calls no tool.
A `response_format` is answered the same way: the least JSON its schema takes. Log
probabilities, when asked for, are 0.0 (certain) for every token.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from schemas.events import (
    GenerationRequest,
    Logprobs,
    Role,
    TokenLogprob,
    TopLogprob,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import FunctionCall, ToolCall, ToolCalls, call_id
from workers.engine import Continuation, EngineOutput, EngineStats
from workers.tool_calls import constrained_calls, example_output, example_value

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "at",
    "by",
    "this",
    "be",
    "from",
    "or",
    "have",
    "an",
    "they",
    "which",
    "one",
    "you",
    "were",
    "all",
    "we",
    "when",
    "there",
    "can",
    "more",
    "if",
    "out",
    "so",
    "what",
    "about",
    "up",
    "time",
    "said",
    "would",
    "into",
    "them",
    "some",
    "could",
    "other",
    "then",
    "two",
    "its",
    "like",
    "now",
    "over",
    "only",
    "new",
    "way",
    "model",
    "token",
    "stream",
    "kafka",
    "batch",
    "queue",
    "cache",
    "prompt",
    "reply",
    "tier",
    "slot",
    "worker",
    "engine",
]

_DIRECTIVE = re.compile(r"\[\[sim:(\w+)(?:=([^\]]*))?\]\]")


class SimEngineFailure(RuntimeError):
    """Raised for `[[sim:fail]]`: lets tests drive a worker's error path."""


@dataclass(frozen=True, slots=True)
class ReplyPlan:
    """The whole reply, decided before the first token: token texts and how it ends."""

    tokens: tuple[str, ...]
    status: RequestStatus
    fail: bool = False
    tool_calls: ToolCalls | None = None


def prompt_token_count(request: GenerationRequest) -> int:
    """One token a word, of every message or of a text completion's prompt."""
    texts = [m.content for m in request.messages]
    return sum(len(text.split()) for text in [*texts, request.prompt or ""])


def plan_reply(request: GenerationRequest) -> ReplyPlan:
    """The deterministic reply for `request` (a pure function of the request)."""
    last_user = request.last_user_message
    directives = {name: value for name, value in _DIRECTIVE.findall(last_user)}
    seed = hashlib.blake2b(f"{request.request_id}\n{last_user}".encode(), digest_size=8)
    rng = random.Random(seed.digest())

    tool_use = request.tool_use
    if tool_use is not None and "call" in directives and request.messages[-1].role is Role.USER:
        return _tool_call_plan(
            request, scripted_call(directives["call"]), _scripted_calls(request, directives["call"])
        )
    if tool_use is not None and tool_use.constrained:
        return _tool_call_plan(request, example_output(tool_use))
    if request.sampling.structured:
        return _json_plan(request)
    if "reply" in directives:
        words = directives["reply"].split()
    else:
        length = int(directives.get("length") or rng.randint(20, 120))
        words = [rng.choice(WORDS) for _ in range(length)]
    tokens = [word if i == 0 else f" {word}" for i, word in enumerate(words)]

    sampling = request.sampling
    if sampling.ignore_eos:
        while len(tokens) < sampling.max_tokens:
            tokens.append(f" {rng.choice(WORDS)}")
    status = RequestStatus.FINISHED_STOPPED
    if len(tokens) > sampling.max_tokens:
        tokens, status = tokens[: sampling.max_tokens], RequestStatus.FINISHED_LENGTH
    tokens, stopped = _cut_at_stop(tokens, sampling.stop)
    if stopped:
        status = RequestStatus.FINISHED_STOPPED
    return ReplyPlan(tuple(tokens), status, fail="fail" in directives)


TOOL_CALL_TOKEN_CHARS = 4


def scripted_call(directive: str) -> str:
    """The text of a `[[sim:call=NAME ARGS]]` reply: the call as hermes writes one."""
    name, _, arguments = directive.partition(" ")
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments.strip() or "{}"}}}</tool_call>'


def _scripted_calls(request: GenerationRequest, directive: str) -> ToolCalls:
    name, _, arguments = directive.partition(" ")
    return ToolCalls(
        calls=(
            ToolCall(
                id=call_id(request.request_id, 0),
                function=FunctionCall(name=name, arguments=arguments.strip() or "{}"),
            ),
        )
    )


def _tool_call_plan(
    request: GenerationRequest, text: str, scripted: ToolCalls | None = None
) -> ReplyPlan:
    """A tool-calling answer: `text` a few characters a token, cut at `max_tokens`
    (then it calls nothing: the call is not whole). Its calls are `scripted`, or read
    from the constrained text."""
    tokens = [
        text[i : i + TOOL_CALL_TOKEN_CHARS] for i in range(0, len(text), TOOL_CALL_TOKEN_CHARS)
    ]
    status = RequestStatus.FINISHED_STOPPED
    if len(tokens) > request.sampling.max_tokens:
        tokens, status = tokens[: request.sampling.max_tokens], RequestStatus.FINISHED_LENGTH
    assert request.tool_use is not None
    calls = (
        constrained_calls("".join(tokens), request.tool_use, request.request_id)
        if scripted is None
        else scripted
    )
    if status is RequestStatus.FINISHED_LENGTH:
        calls = None
    return ReplyPlan(tuple(tokens), status, tool_calls=calls)


def _json_plan(request: GenerationRequest) -> ReplyPlan:
    """An answer held to a JSON format: the least value its schema takes ({} for any
    JSON object), a few characters a token."""
    schema = request.sampling.json_schema
    text = json.dumps(example_value(schema) if schema is not None else {}, separators=(",", ":"))
    tokens = [
        text[i : i + TOOL_CALL_TOKEN_CHARS] for i in range(0, len(text), TOOL_CALL_TOKEN_CHARS)
    ]
    status = RequestStatus.FINISHED_STOPPED
    if len(tokens) > request.sampling.max_tokens:
        tokens, status = tokens[: request.sampling.max_tokens], RequestStatus.FINISHED_LENGTH
    return ReplyPlan(tuple(tokens), status)


def sim_logprobs(tokens: tuple[str, ...], top: int | None) -> Logprobs:
    """A deterministic engine's log probabilities: each token certain (0.0), and the
    only one at its place."""
    if top is None:
        return ()
    return tuple(
        TokenLogprob(token=token, logprob=0.0, top=(TopLogprob(token=token, logprob=0.0),)[:top])
        for token in tokens
    )


def _cut_at_stop(tokens: list[str], stop: tuple[str, ...]) -> tuple[list[str], bool]:
    text = "".join(tokens)
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    if cut < 0:
        return tokens, False
    kept, length = [], 0
    for token in tokens:
        if length + len(token) > cut:
            if cut > length:
                kept.append(token[: cut - length])
            break
        kept.append(token)
        length += len(token)
    return kept, True


class SimEngine:
    """Engine protocol implementation that needs no model."""

    def __init__(
        self, model_name: str, max_slots: int, tokens_per_s: float, prompt_tokens_per_s: float
    ) -> None:
        self.model = model_name
        self.max_slots = max_slots
        self.tokens_per_s = tokens_per_s
        self.prompt_tokens_per_s = prompt_tokens_per_s
        self.peak_running = 0
        self._running = 0
        self._waiting = 0
        self._slot_freed = asyncio.Condition()
        self._aborts: dict[str, set[asyncio.Event]] = {}
        self._steps = StepClock(1.0 / tokens_per_s)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        for events in list(self._aborts.values()):
            for event in events:
                event.set()
        self._steps.wake()
        async with self._slot_freed:
            self._slot_freed.notify_all()

    async def generate(
        self, request: GenerationRequest, continuation: Continuation | None = None
    ) -> AsyncIterator[EngineOutput]:
        plan = plan_reply(request)
        prompt_tokens = prompt_token_count(request)
        aborted = asyncio.Event()
        self._aborts.setdefault(request.request_id, set()).add(aborted)
        # The plan is a pure function of the request: a continuation resumes it exactly.
        sent = min(continuation.tokens, len(plan.tokens)) if continuation else 0

        def output(text: str, new: int, status: RequestStatus | None = None) -> EngineOutput:
            calls = plan.tool_calls if status is not None and sent == len(plan.tokens) else None
            logprobs = sim_logprobs(plan.tokens[sent - new : sent], request.sampling.logprobs)
            return EngineOutput(
                text, new, sent, prompt_tokens, 0, status, tool_calls=calls, logprobs=logprobs
            )

        try:
            if not await self._take_slot(aborted):
                yield output("", 0, RequestStatus.FINISHED_ABORTED)
                return
            try:
                if plan.fail:
                    raise SimEngineFailure(f"scripted failure of {request.request_id}")
                loop = asyncio.get_running_loop()
                start = (
                    loop.time()
                    + prompt_tokens / self.prompt_tokens_per_s
                    - sent / self.tokens_per_s
                )
                ended = False
                self._steps.join()
                try:
                    while sent < len(plan.tokens):
                        if aborted.is_set():
                            yield output("", 0, RequestStatus.FINISHED_ABORTED)
                            return
                        due = min(len(plan.tokens), self._tokens_due(start, loop.time()))
                        if due == sent:
                            if sent == 0:  # the first token: as soon as the prompt is read
                                await _wait(aborted, start)
                            else:
                                await self._steps.next()
                            continue
                        text, new, sent = "".join(plan.tokens[sent:due]), due - sent, due
                        ended = sent == len(plan.tokens)
                        yield output(text, new, plan.status if ended else None)
                finally:
                    self._steps.leave()
                if not ended:  # nothing (left) to say
                    yield output("", 0, plan.status)
            finally:
                await self._free_slot()
        finally:
            events = self._aborts.get(request.request_id, set())
            events.discard(aborted)
            if not events:
                self._aborts.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        events = self._aborts.get(request_id, ())
        for event in events:
            event.set()
        if events:
            self._steps.wake()  # a step now: the aborted stream ends, the others wait on
            async with self._slot_freed:
                self._slot_freed.notify_all()

    def stats(self) -> EngineStats:
        return EngineStats(running=self._running, waiting=self._waiting)

    def _tokens_due(self, start: float, now: float) -> int:
        """Tokens whose time has come: token i is due at `start + i / tokens_per_s`."""
        return int((now - start) * self.tokens_per_s) + 1 if now >= start else 0

    async def _take_slot(self, aborted: asyncio.Event) -> bool:
        async with self._slot_freed:
            self._waiting += 1
            try:
                await self._slot_freed.wait_for(
                    lambda: aborted.is_set() or self._running < self.max_slots
                )
            finally:
                self._waiting -= 1
            if aborted.is_set():
                return False
            self._running += 1
            self.peak_running = max(self.peak_running, self._running)
            return True

    async def _free_slot(self) -> None:
        async with self._slot_freed:
            self._running -= 1
            self._slot_freed.notify_all()


class StepClock:
    """One timer for every running request: `next()` returns at the next step, every
    `period_s` while any request has joined. A step wakes all of them in one pass of
    the event loop, so their outputs reach the bus together."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._members = 0
        self._step: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._next_at = 0.0

    def join(self) -> None:
        self._members += 1

    def leave(self) -> None:
        self._members -= 1
        if self._members == 0 and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def next(self) -> None:
        if self._step is None or self._step.done():
            self._step = asyncio.get_running_loop().create_future()
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._next_at = max(self._next_at + self.period_s, loop.time())
            self._timer = loop.call_at(self._next_at, self._tick)
        # Shielded: a cancelled waiter (a request stopped, or handed back) must not
        # cancel the step every other running request waits on.
        await asyncio.shield(self._step)

    def wake(self) -> None:
        """A step now, between the timer's steps (an abort)."""
        if self._step is not None and not self._step.done():
            self._step.set_result(None)

    def _tick(self) -> None:
        self._timer = None
        self.wake()
        if self._members > 0:
            loop = asyncio.get_running_loop()
            self._next_at = max(self._next_at + self.period_s, loop.time())
            self._timer = loop.call_at(self._next_at, self._tick)


async def _wait(aborted: asyncio.Event, deadline: float) -> None:
    """Sleep until `deadline` (event-loop time) or until the request is aborted."""
    try:
        async with asyncio.timeout_at(deadline):
            await aborted.wait()
    except TimeoutError:
        pass
