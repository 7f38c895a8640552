"""Server-side tools, their pure parts: the calculator, the clock,
the tools core (results, next round, the rounds bound, a round's end when it cannot be
handed on), the toolbox's error results (a raise, a result the bus cannot carry),
the worker pausing a round on its calls, the safety stage showing the steps, and the
stored answer keeping them."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pytest

from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE, RecordRejected
from conversations.answers import AnswerBuilder, answer_started
from safety.core import Deliver, SafetyCore
from schemas.answer import AnswerLog
from schemas.events import (
    Cancel,
    ChatMessage,
    DeliveredToolCall,
    DeliveredToolResult,
    Delta,
    GenerationRequest,
    Role,
    TokenChunk,
    ToolCallsMade,
    ToolRound,
    WorkAssignment,
    stream_fields,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import (
    FunctionCall,
    ServerToolTurn,
    ToolCall,
    ToolCalls,
    ToolStep,
    ToolUse,
    round_request_id,
)
from servertools.calculator import CalculationError, Calculator, calculate
from servertools.catalog import SPECS
from servertools.clock import Clock, now_in
from servertools.core import (
    ERROR_CHARS,
    Caller,
    Outcome,
    error_outcome,
    next_round,
    results,
    round_failed,
)
from servertools.failures import TOOL_ROUND_FAILED, TOOL_ROUND_FAILED_MESSAGE, round_error
from servertools.toolbox import Toolbox
from workers.core import DEFAULT_PACING, NOTHING, Attempt, WorkerBook
from workers.engine import EngineOutput
from workers.sim_engine import plan_reply

# --- the calculator --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(2 + 3) * 4 ** 2", 80),
        ("7 % 3 - -1", 2),
        ("1 / 4", 0.25),
        ("7 // 2", 3),
        ("+2.5 * 2", 5.0),
        ("10 ** -2", 0.01),
        (" 42 ", 42),
    ],
)
def test_the_calculator_does_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('true')", "not allowed"),
        ("x + 1", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("True + 1", "only numbers"),
        ("[1][0]", "not allowed"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("2 ** 1000", "at most 100"),
        ("10 ** 99 * 10 ** 99", "too large"),
        ("1e308 * 10", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not an arithmetic"),
        ("1" * 201, "longer than"),
        ("", "not an arithmetic"),
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, why):
    with pytest.raises(CalculationError, match=why):
        calculate(expression)


async def test_the_calculator_tool_answers_with_the_expression_and_result():
    assert await Calculator()({"expression": "6*7"}, None) == {"expression": "6*7", "result": 42}
    with pytest.raises(CalculationError):
        await Calculator()({"expression": 42}, None)


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("2 ** 53", 2**53),
        ("-(2 ** 53)", -(2**53)),
        ("2 ** 53 + 1", "9007199254740993"),
        ("2 ** 64", "18446744073709551616"),
        ("-(2 ** 64)", "-18446744073709551616"),
        ("10 ** 100", "1" + "0" * 100),
        ("2.0 ** 64", 2.0**64),
    ],
)
async def test_the_calculator_gives_an_integer_no_json_reader_holds_exactly_as_digits(
    expression, result
):
    """Every result is a value the bus carries and a reader parses without a digit lost:
    an integer over 2**53 is its decimal digits."""
    box = Toolbox([Calculator()], timeout_s=1.0)
    outcome = await box.run(call("calculator", json.dumps({"expression": expression})), CALLER)
    assert not outcome.error and json.loads(outcome.content)["result"] == result


# --- the clock -------------------------------------------------------------------------

NOON = dt.datetime(2026, 7, 1, 12, 0, 5, tzinfo=dt.UTC)


def test_the_clock_tells_utc_and_a_time_zone():
    assert now_in(None, NOON) == {"utc": "2026-07-01T12:00:05+00:00", "unix": 1782907205}
    paris = now_in("Europe/Paris", NOON)
    assert (paris["timezone"], paris["local"]) == ("Europe/Paris", "2026-07-01T14:00:05+02:00")
    for bad in ("Mars/Olympus", "../etc/passwd"):
        with pytest.raises(ValueError, match="unknown time zone"):
            now_in(bad, NOON)


async def test_the_clock_tool_reads_its_clock():
    assert (await Clock(lambda: NOON)({}, None))["utc"] == "2026-07-01T12:00:05+00:00"


# --- the toolbox: every failure is the model's error result ------------------------------


class Slow:
    spec = SPECS["clock"]

    async def __call__(self, arguments, caller):
        await asyncio.Event().wait()


class Raises:
    spec = SPECS["search_documents"]

    async def __call__(self, arguments, caller):
        raise RuntimeError("the index is down")


def call(name: str, arguments: str, index: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{index}", function=FunctionCall(name=name, arguments=arguments))


CALLER = Caller("o", "u")


class Gives:
    """A tool that returns `value`, whatever it is."""

    spec = SPECS["clock"]

    def __init__(self, value: object) -> None:
        self.value = value

    async def __call__(self, arguments, caller):
        return self.value


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text either")


class RaisesUnprintably:
    spec = SPECS["clock"]

    async def __call__(self, arguments, caller):
        raise Unprintable()


async def test_the_toolbox_turns_every_failure_into_an_error_result():
    box = Toolbox([Calculator(), Slow(), Raises()], timeout_s=0.01)
    caller = Caller("o", "u")
    assert await box.run(call("calculator", '{"expression": "1+1"}'), caller) == Outcome(
        '{"expression":"1+1","result":2}'
    )
    cases = {
        call("weather", "{}"): "unknown tool 'weather'",
        call("calculator", "{not json"): "the arguments are not JSON",
        call("calculator", "[1]"): "the arguments are not a JSON object",
        call("calculator", '{"expression": "1/0"}'): "division by zero",
        call("clock", "{}"): "clock took longer than 0.01 s",
        call("search_documents", '{"query": "x"}'): "the index is down",
    }
    for made, error in cases.items():
        outcome = await box.run(made, caller)
        assert outcome.error and json.loads(outcome.content) == {"error": error}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"n": 2**64}, "Integer exceeds 64-bit range"),
        ([-(2**63) - 1], "Integer exceeds 64-bit range"),
        ({"x": float("nan")}, "a number is not finite"),
        ({"deep": [[1.0, {"y": float("-inf")}]]}, "a number is not finite"),
        ({"s": {1, 2}}, "not JSON serializable: set"),
        ({"o": object()}, "not JSON serializable: object"),
        ({1: "one"}, "Dict key must be str"),
        ({"text": "x" * 8000}, "longer than 8000 characters"),
    ],
)
async def test_a_result_the_bus_cannot_carry_is_the_models_error(value, why):
    outcome = await Toolbox([Gives(value)], timeout_s=1.0).run(call("clock", "{}"), CALLER)
    assert outcome.error and why in json.loads(outcome.content)["error"]


async def test_json_results_pass_whole_none_and_large_64_bit_integers_included():
    for value in ({"n": None, "big": 2**64 - 1, "small": -(2**63)}, [1.5, "null", None], 7):
        outcome = await Toolbox([Gives(value)], timeout_s=1.0).run(call("clock", "{}"), CALLER)
        assert not outcome.error and json.loads(outcome.content) == value


async def test_the_toolbox_never_raises_a_tools_failure():
    """Even a failure that cannot be described is an error result, never a raise."""
    box = Toolbox([RaisesUnprintably()], timeout_s=1.0)
    outcome = await box.run(call("clock", "{}"), CALLER)
    assert outcome.error and json.loads(outcome.content) == {"error": "clock failed"}
    long = error_outcome("x" * 5000)
    assert len(json.loads(long.content)["error"]) == ERROR_CHARS


# --- the tools core: results and the next round ------------------------------------------

TOOLS = tuple(SPECS.values())


def first_round(max_rounds: int = 2, choice: str = "function") -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        attempt=1,
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="pro",
        model="tiny-random",
        reply_to="chat.deliver.gw",
        messages=(ChatMessage(role=Role.USER, content="what is 6*7?"),),
        tool_use=ToolUse(
            tools=TOOLS, choice=choice, function="calculator" if choice == "function" else None
        ),
        server_tools=ServerToolTurn(answer_id="r", max_rounds=max_rounds),
    )


def a_round(request: GenerationRequest, calls: int = 2, seq: int = 5) -> ToolRound:
    made = ToolCalls(
        content="Let me see.",
        calls=tuple(call("calculator", '{"expression": "6*7"}', i) for i in range(calls)),
    )
    return ToolRound(request=request, calls=made, seq=seq)


def test_results_follow_the_calls_positions_under_the_answers_id():
    tool_round = a_round(first_round())
    answered = results(tool_round, [Outcome('{"result": 42}'), error_outcome("no")])
    # ToolCallsMade at 5 holds 5 (text) and 6, 7 (the calls): the results are 8 and 9
    assert [(r.seq, r.call_id, r.error) for r in answered] == [
        (8, "call_0", False),
        (9, "call_1", True),
    ]
    assert {(r.request_id, r.attempt) for r in answered} == {("r", 1)}


def test_the_next_round_appends_the_calls_and_results_and_is_its_own_request():
    tool_round = a_round(first_round())
    answered = results(tool_round, [Outcome('{"result": 42}'), Outcome('{"result": 42}')])
    following = next_round(tool_round, answered)
    assert following.request_id == round_request_id("r", 1) == "r.tool1"
    assert following.answer_id == "r" and following.attempt == 2 and following.stream is None
    assert following.server_tools == ServerToolTurn(
        answer_id="r", round=1, max_rounds=2, first_seq=10
    )
    assistant, *tools = following.messages[1:]
    assert (assistant.role, assistant.content, assistant.tool_calls) == (
        Role.ASSISTANT,
        "Let me see.",
        tool_round.calls.calls,
    )
    assert [(m.role, m.tool_call_id) for m in tools] == [
        (Role.TOOL, "call_0"),
        (Role.TOOL, "call_1"),
    ]
    # a forced choice holds the first round only
    assert following.tool_use.choice == "auto" and following.tool_use.function is None
    # the stream events of the next round carry the answer's id
    assert stream_fields(following, 10)["request_id"] == "r"


def test_a_round_that_cannot_be_handed_on_ends_after_its_results():
    tool_round = a_round(first_round(), calls=2, seq=5)
    answered = results(tool_round, [Outcome("1"), Outcome("2")])
    end = round_failed(tool_round, "tool_round_failed", "could not")
    # ToolCallsMade at 5 (text 5, calls 6 and 7), results 8 and 9: the end is at 10
    assert (end.request_id, end.attempt, end.seq) == ("r", 1, 10)
    assert end.seq == next_round(tool_round, answered).server_tools.first_seq
    assert (end.code, end.message, end.conversation_id) == ("tool_round_failed", "could not", "c")
    log = AnswerLog()
    for event in answered:
        assert log.take(event)
    assert log.take(end) and log.ended  # it follows the results on the stream


def test_a_round_that_cannot_be_handed_on_tells_a_code_never_the_exception():
    refused = RecordRejected("chat.requests.free", ValueError("8388700 bytes is too large"))
    assert round_error(refused) == (PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE)
    code, message = round_error(KeyError("/srv/secret/path"))
    assert code == TOOL_ROUND_FAILED == "tool_round_failed"
    assert "secret" not in message and message == TOOL_ROUND_FAILED_MESSAGE


def test_after_the_last_round_the_model_is_shown_no_tools():
    second = next_round(a_round(first_round(max_rounds=2)), [])
    third = next_round(a_round(second), [])
    assert second.tool_use is not None and third.tool_use is None
    assert third.request_id == "r.tool2" and third.server_tools.round == 2
    with pytest.raises(ValueError):
        next_round(a_round(first_round().model_copy(update={"server_tools": None})), [])


# --- the worker pauses a round that called tools ----------------------------------------


def attempt_of(request: GenerationRequest) -> Attempt:
    attempt = Attempt(request, "w1", DEFAULT_PACING, lambda: 100.0, lambda: 5000.0)
    attempt.resume(NOTHING)
    return attempt


def engine_output(text: str, completion: int, calls: ToolCalls | None = None) -> EngineOutput:
    return EngineOutput(
        text=text,
        new_tokens=1,
        completion_tokens=completion,
        prompt_tokens=9,
        status=None if calls is None else RequestStatus.FINISHED_STOPPED,
        tool_calls=calls,
    )


def test_a_server_tools_round_holds_its_text_and_pauses_on_its_calls():
    calls = ToolCalls(content="Let me see.", calls=(call("calculator", "{}"),))
    attempt = attempt_of(
        first_round(choice="auto").model_copy(
            update={"server_tools": ServerToolTurn(answer_id="r", max_rounds=2, first_seq=4)}
        )
    )
    assert attempt.holds_output and attempt.seq == 4
    assert attempt.output(engine_output("<tool_call>", 1), 1) is None  # never the call's text
    assert attempt.output(engine_output("{...}</tool_call>", 2, calls), 1) is None
    assert attempt.pause() == calls
    content = attempt.content(calls)
    assert isinstance(content, TokenChunk) and (content.text, content.seq) == ("Let me see.", 4)
    attempt.sent()
    made = attempt.calls_made(calls)
    assert isinstance(made, ToolCallsMade) and made.seq == 5 and made.completion_tokens == 2
    tool_round = attempt.tool_round(calls, made)
    assert (tool_round.seq, tool_round.calls, tool_round.request) == (5, calls, attempt.request)
    assert attempt.usage().completion_tokens == 2
    # a round that cannot be handed on ends past its calls' positions (5: text, 6: call)
    assert attempt.error("pipeline_rejected", "x").seq == 7


def test_a_round_without_calls_or_without_server_tools_ends_as_any_answer():
    text_round = attempt_of(first_round(choice="auto"))
    text_round.output(engine_output("Forty-two.", 3), 1)
    assert text_round.pause() is None
    assert text_round.tail().text == "Forty-two."  # held to the end, then shown whole
    plain = attempt_of(first_round(choice="auto").model_copy(update={"server_tools": None}))
    assert not plain.holds_output
    assert plain.output(engine_output("Hi", 1, None), 1).text == "Hi"  # streams at once
    last = attempt_of(first_round().model_copy(update={"tool_use": None}))
    assert not last.holds_output  # the last round: shown no tools, it streams


def test_a_cancel_of_the_answer_aborts_the_round_running_here():
    worker = WorkerBook("w1", "inc", lambda: 0.0)
    second = next_round(a_round(first_round()), [])
    worker.take(WorkAssignment(worker_id="w1", request=second), 0, 3)
    assert worker.cancel(Cancel(request_id="r")) == "r.tool1"
    assert worker.cancelled(second.answer_id)
    assert worker.cancel(Cancel(request_id="r.tool1")) == "r.tool1"
    worker.ended(second)
    assert worker.cancel(Cancel(request_id="r")) is None


# --- the safety stage shows the steps; the stored answer keeps them ----------------------


def test_the_safety_stage_shows_the_calls_after_the_held_text_then_the_results():
    core = SafetyCore()
    request = first_round()
    tool_round = a_round(request, calls=1, seq=0)
    made = ToolCallsMade(**stream_fields(request, 0), calls=tool_round.calls.calls)
    [result] = results(tool_round, [Outcome('{"result": 42}')])
    shown = core.on_event(made, 0, 0, 0.0) + core.on_event(result, 0, 1, 0.0)
    events = [out.event for out in shown if isinstance(out, Deliver)]
    assert [(type(e), e.seq) for e in events] == [(DeliveredToolCall, 1), (DeliveredToolResult, 2)]
    assert events[0].call == tool_round.calls.calls[0]
    assert events[1].content == '{"result": 42}' and core.open_count == 1  # not ended


def test_the_stored_answer_keeps_its_tool_steps_in_order():
    request = first_round()
    builder = AnswerBuilder(answer_started(request))
    the_call = call("clock", "{}")
    for event in (
        DeliveredToolCall(request_id="r", seq=1, call=the_call),
        DeliveredToolResult(
            request_id="r",
            seq=2,
            call_id="call_0",
            name="clock",
            content='{"error": "x"}',
            error=True,
        ),
        Delta(request_id="r", attempt=1, seq=3, text="It is noon."),
    ):
        assert builder.add(event)
    message = builder.message()
    assert message.content == "It is noon."
    assert message.tool_steps == (
        ToolStep(type="tool_call", id="call_0", name="clock", arguments="{}"),
        ToolStep(
            type="tool_result", id="call_0", name="clock", content='{"error": "x"}', error=True
        ),
    )


def test_tool_steps_are_positions_of_the_answer():
    log = AnswerLog()
    assert log.take(DeliveredToolCall(request_id="r", seq=3, call=call("clock", "{}")))
    assert not log.take(DeliveredToolCall(request_id="r", seq=3, call=call("clock", "{}")))
    assert log.next_seq == 4


# --- the sim calls a tool when told ------------------------------------------------------


def test_the_sim_calls_the_tool_its_directive_names_until_a_result_comes():
    asked = first_round(choice="auto").model_copy(
        update={
            "messages": (
                ChatMessage(
                    role=Role.USER, content='hi [[sim:call=calculator {"expression": "6*7"}]]'
                ),
            )
        }
    )
    plan = plan_reply(asked)
    assert "".join(plan.tokens).startswith("<tool_call>")
    [made] = plan.tool_calls.calls
    assert (made.function.name, json.loads(made.function.arguments)) == (
        "calculator",
        {"expression": "6*7"},
    )
    answered = next_round(ToolRound(request=asked, calls=plan.tool_calls, seq=0), [])
    assert plan_reply(answered).tool_calls is None
