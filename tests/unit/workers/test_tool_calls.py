"""Tool calling's pure parts: a completion's tools and messages read
(`gateway.openai.chat_completions.tool_requests`), a constrained answer read back into calls
(`workers.tool_calls`), the answer sent as OpenAI sends it
(`gateway.openai.chat_completions.tool_answers`), the template's inputs (`common.prompt`),
and the worker and sim engine carrying calls."""

from __future__ import annotations

import json

import jsonschema
import pytest

from common.prompt import template_messages, template_tools
from gateway.openai.chat_completions.tool_answers import StreamedAnswer, finish_reason, message
from gateway.openai.chat_completions.tool_requests import chat_messages, tool_use
from gateway.refusals import NotFound, Unacceptable
from schemas.api import ChatCompletionRequest
from schemas.events import (
    ChatMessage,
    DeliveryDone,
    GenerationRequest,
    Role,
    SamplingOptions,
    Usage,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import FunctionCall, ToolCall, ToolCalls, ToolSpec, ToolUse, call_id
from tests.support.limits import small_limits
from workers.core import DEFAULT_PACING, Attempt, PriorOutput, ToolCallInterrupted
from workers.engine import EngineOutput
from workers.failures import client_error
from workers.sim_engine import plan_reply
from workers.tool_calls import constrained_calls, example_output, example_value

WEATHER = {
    "type": "object",
    "required": ["city", "days"],
    "additionalProperties": False,
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1},
        "hourly": {"type": "boolean"},
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time"}},
]
LIMITS = small_limits(max_tools=3)
USER = {"role": "user", "content": "weather?"}


def completion(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "tiny-random", "messages": [USER], "tools": TOOLS, **fields}
    )


def refusal(call) -> tuple[str, str]:
    with pytest.raises(Unacceptable) as refused:
        call()
    return refused.value.code, refused.value.param


def uses(choice: str = "required", function: str | None = None, parallel: bool = True) -> ToolUse:
    return ToolUse(
        tools=tuple(ToolSpec.model_validate(t) for t in TOOLS),
        choice=choice,
        function=function,
        parallel=parallel,
    )


# --- the request: tools and tool choice --------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ("auto", None, True)),
        ({"tool_choice": "auto", "parallel_tool_calls": False}, ("auto", None, False)),
        ({"tool_choice": "required"}, ("required", None, True)),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            ("function", "get_time", True),
        ),
    ],
)
def test_a_tool_choice_becomes_the_tool_use(fields, expected):
    use = tool_use(completion(**fields), LIMITS)
    assert (use.choice, use.function, use.parallel) == expected
    assert [t.function.name for t in use.tools] == ["get_weather", "get_time"]
    assert use.constrained is (expected[0] != "auto")


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_choice": "none"},
        {"tools": None},
        {"tools": [], "tool_choice": "none"},
        {"tools": [], "tool_choice": "auto"},
    ],
)
def test_no_tools_or_tool_choice_none_shows_the_model_no_tools(fields):
    assert tool_use(completion(**fields), LIMITS) is None


def test_a_tool_choice_naming_a_function_not_offered_is_not_found():
    request = completion(tool_choice={"type": "function", "function": {"name": "nowhere"}})
    with pytest.raises(NotFound) as refused:
        tool_use(request, LIMITS)
    assert (refused.value.code, refused.value.param) == (
        "tool_not_found",
        "tool_choice.function.name",
    )


def test_two_tools_of_one_name_are_served_as_vllm_serves_them():
    assert len(tool_use(completion(tools=[TOOLS[0], TOOLS[0]]), LIMITS).tools) == 2


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tools": None, "tool_choice": "required"}, ("invalid_tool_choice", "tool_choice")),
        (
            {"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            ("invalid_tool_choice", "tool_choice"),
        ),
        (
            {
                "tools": [
                    TOOLS[1],
                    {
                        "type": "function",
                        "function": {"name": "bad", "parameters": {"type": "objekt"}},
                    },
                ]
            },
            ("invalid_tools", "tools.1.function.parameters"),
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "bad", "parameters": {"type": "array"}},
                    }
                ]
            },
            ("invalid_tools", "tools.0.function.parameters"),
        ),
        ({"tools": [TOOLS[1]] * 4}, ("too_many_tools", "tools")),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "bad", "parameters": {"$schema": {"not": "a string"}}},
                    }
                ]
            },
            ("invalid_tools", "tools.0.function.parameters"),
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": name,
                            "parameters": {"type": "object", "$defs": {"Place": {"type": kind}}},
                        },
                    }
                    for name, kind in (("a", "string"), ("b", "integer"))
                ]
            },
            ("invalid_tools", "tools.1.function.parameters.$defs.Place"),
        ),
    ],
)
def test_bad_tools_are_refused_naming_the_field(fields, expected):
    assert refusal(lambda: tool_use(completion(**fields), LIMITS)) == expected


def test_a_function_name_openai_would_refuse_fails_validation():
    with pytest.raises(ValueError, match=r"function\.name"):
        completion(tools=[{"type": "function", "function": {"name": "has space"}}])


# --- the request: messages ---------------------------------------------------------------


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
}


def test_calls_and_results_reach_the_model():
    request = completion(
        messages=[
            USER,
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        ]
    )
    assistant, tool = chat_messages(request.messages)[1:]
    assert (assistant.role, assistant.content, assistant.tool_calls[0].id) == (
        Role.ASSISTANT,
        "",
        "call_1",
    )
    assert (tool.role, tool.content, tool.tool_call_id) == (Role.TOOL, "21 C", "call_1")
    rendered = template_messages(chat_messages(request.messages))
    assert rendered[1]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
        }
    ]
    assert rendered[2] == {"role": "tool", "content": "21 C", "tool_call_id": "call_1"}
    assert rendered[0] == {"role": "user", "content": "weather?"}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([USER, {"role": "tool", "content": "21"}], "messages.1.tool_call_id"),
        ([USER, {"role": "tool", "tool_call_id": "", "content": "21"}], "messages.1.tool_call_id"),
        ([{**USER, "tool_calls": [CALL]}], "messages.0.tool_calls"),
    ],
)
def test_bad_messages_are_refused_naming_the_field(messages, param):
    request = completion(messages=messages)
    assert refusal(lambda: chat_messages(request.messages)) == ("invalid_message", param)


@pytest.mark.parametrize("arguments", ["[1]", "{not json", "[" * 100_000, ""])
def test_arguments_that_are_no_json_object_reach_the_template_as_an_empty_one(arguments):
    """As vLLM does: a malformed call in the history must not fail every later turn."""
    request = completion(
        messages=[
            USER,
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": arguments}}],
            },
            {"role": "tool", "tool_call_id": "call_elsewhere", "content": "21"},
        ]
    )
    rendered = template_messages(chat_messages(request.messages))
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {}
    assert rendered[2]["tool_call_id"] == "call_elsewhere"


def test_the_template_gets_the_tools_as_openai_sends_them():
    assert template_tools(None) is None
    assert template_tools(uses()) == [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "get_time"}},
    ]


# --- the answer read back into calls ------------------------------------------------------


def test_a_named_answer_is_one_call_its_text_the_arguments():
    calls = constrained_calls(' {"city":"Rome","days":3}', uses("function", "get_weather"), "r")
    [call] = calls.calls
    assert (call.id, call.function.name, call.function.arguments) == (
        call_id("r", 0),
        "get_weather",
        '{"city":"Rome","days":3}',
    )
    assert calls.content is None


def test_a_required_answer_is_its_list_of_calls():
    text = json.dumps(
        [
            {"name": "get_weather", "parameters": {"city": "Paris", "days": 1}},
            {"name": "get_time", "parameters": {}},
        ]
    )
    calls = constrained_calls(text, uses(), "r").calls
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (call_id("r", 0), "get_weather", {"city": "Paris", "days": 1}),
        (call_id("r", 1), "get_time", {}),
    ]


@pytest.mark.parametrize(
    ("text", "use"),
    [
        ('[{"name":"get_weather","parameters":{"ci', uses()),  # cut at max_tokens
        ('{"city":', uses("function", "get_weather")),
        ("[1, 2]", uses("function", "get_weather")),
        ('[{"name": "nowhere", "parameters": {}}]', uses()),
        ('[{"name": "get_time"}]', uses()),
        ('{"name": "get_time", "parameters": {}}', uses()),
        ("[]", uses()),
    ],
)
def test_text_the_constraint_does_not_make_calls_nothing(text, use):
    assert constrained_calls(text, use, "r") is None


def test_call_ids_are_a_function_of_the_request_and_place():
    assert call_id("r", 0) == call_id("r", 0) != call_id("r", 1) != call_id("s", 1)
    assert call_id("r", 0).startswith("call_")


@pytest.mark.parametrize(
    "schema",
    [
        WEATHER,
        {},
        {"type": "object", "properties": {}},
        {
            "type": "object",
            "required": ["tags", "size", "mode", "note", "x"],
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                "size": {"type": "number", "minimum": 2.5},
                "mode": {"const": "fast"},
                "note": {"type": ["string", "null"], "minLength": 2},
                "x": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
            },
        },
    ],
)
def test_the_sims_example_arguments_hold_to_their_schema(schema):
    jsonschema.validate(example_value(schema), schema)


@pytest.mark.parametrize(
    "use", [uses(), uses("function", "get_weather"), uses("function", "get_time")]
)
def test_the_sims_example_output_reads_back_into_valid_calls(use):
    calls = constrained_calls(example_output(use), use, "r").calls
    for call in calls:
        schema = use.spec(call.function.name).parameters or {"type": "object"}
        jsonschema.validate(json.loads(call.function.arguments), schema)


# --- the sim engine and the worker ---------------------------------------------------


def request(use: ToolUse | None, max_tokens: int = 256) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="pro",
        model="sim",
        messages=(ChatMessage(role=Role.USER, content="hi"),),
        sampling=SamplingOptions(max_tokens=max_tokens),
        reply_to="chat.deliver.gw",
        tool_use=use,
    )


def test_the_sim_answers_a_constrained_choice_with_a_call_and_auto_with_text():
    plan = plan_reply(request(uses("function", "get_weather")))
    assert json.loads("".join(plan.tokens)) == {"city": "Paris", "days": 1}
    assert plan.tool_calls.calls[0].function.name == "get_weather"
    assert plan_reply(request(uses("auto"))).tool_calls is None
    cut = plan_reply(request(uses("function", "get_weather"), max_tokens=2))
    assert (cut.status, cut.tool_calls) == (RequestStatus.FINISHED_LENGTH, None)


class Clock:
    def __call__(self) -> float:
        return 0.0


CALLS = ToolCalls(
    calls=(ToolCall(id="call_1", function=FunctionCall(name="get_time", arguments="{}")),)
)


def test_the_done_event_carries_the_calls_of_the_last_output():
    run = Attempt(request(uses()), "w1", DEFAULT_PACING, Clock(), Clock())
    run.output(
        EngineOutput("[]", 1, 1, 5, status=RequestStatus.FINISHED_STOPPED, tool_calls=CALLS),
        streams=1,
    )
    assert run.done().tool_calls == CALLS


def test_a_constrained_answer_an_earlier_attempt_started_ends_in_an_error():
    run = Attempt(request(uses()), "w1", DEFAULT_PACING, Clock(), Clock())
    with pytest.raises(ToolCallInterrupted) as interrupted:
        run.resume(PriorOutput('[{"na', 2, 1, False))
    assert client_error(interrupted.value).code == "tool_call_interrupted"
    auto = Attempt(request(uses("auto")), "w1", DEFAULT_PACING, Clock(), Clock())
    assert auto.resume(PriorOutput("Hel", 1, 1, False)) is not None  # text continues


# --- the answer sent ---------------------------------------------------------------------


def done(calls: ToolCalls | None, status=RequestStatus.FINISHED_STOPPED) -> DeliveryDone:
    return DeliveryDone(request_id="r", seq=3, status=status, usage=Usage(), tool_calls=calls)


@pytest.mark.parametrize(
    ("use", "calls", "retracted", "reason"),
    [
        (None, None, False, "stop"),
        (uses("auto"), None, False, "stop"),
        (uses("auto"), CALLS, False, "tool_calls"),
        (uses(), CALLS, False, "tool_calls"),
        (uses("function", "get_time"), CALLS, False, "stop"),  # as OpenAI ends a named call
        (uses(), CALLS, True, "content_filter"),
    ],
)
def test_finish_reasons(use, calls, retracted, reason):
    assert finish_reason(use, done(calls), retracted) == reason
    assert finish_reason(use, done(None, RequestStatus.FINISHED_LENGTH), False) == "length"


def test_the_whole_answer_is_its_calls_else_its_text():
    with_text = CALLS.model_copy(update={"content": "Let me look."})
    assert message("ignored", done(with_text), False).model_dump() == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [c.model_dump() for c in CALLS.calls],
    }
    assert message("just text", done(None), False).content == "just text"
    assert message("[{", done(CALLS), True).tool_calls is None


def test_without_tools_text_streams_as_content():
    stream = StreamedAnswer(None, "r")
    assert stream.delta("Hello") is None
    assert stream.end(done(None), False) == []


def test_a_named_call_streams_its_arguments_as_they_come():
    stream = StreamedAnswer(uses("function", "get_time"), "r")
    first, second = stream.delta('{"utc"'), stream.delta(":true}")
    [head], [rest] = first[0].tool_calls, second[0].tool_calls
    assert (head.index, head.id, head.type, head.function.name, head.function.arguments) == (
        0,
        call_id("r", 0),
        "function",
        "get_time",
        '{"utc"',
    )
    assert (rest.index, rest.id, rest.function.name, rest.function.arguments) == (
        0,
        None,
        None,
        ":true}",
    )
    assert stream.end(done(CALLS), False) == []


@pytest.mark.parametrize("use", [uses(), uses("auto")])
def test_auto_and_required_hold_the_text_back_then_send_calls_or_text(use):
    stream = StreamedAnswer(use, "r")
    assert stream.delta('[{"name"') == [] and stream.delta(":") == []
    two = ToolCalls(
        content="Sure.",
        calls=(
            *CALLS.calls,
            ToolCall(
                id="call_2", function=FunctionCall(name="get_weather", arguments='{"days":1}')
            ),
        ),
    )
    text, first, second = stream.end(done(two), False)
    assert text.content == "Sure." and text.tool_calls is None
    assert [
        (c.tool_calls[0].index, c.tool_calls[0].id, c.tool_calls[0].function.arguments)
        for c in (first, second)
    ] == [(0, "call_1", "{}"), (1, "call_2", '{"days":1}')]
    assert [c.content for c in stream.end(done(None), False)] == ['[{"name":']
    assert stream.end(done(two), True) == []


# --- the prompt ----------------------------------------------------------------------------

TOOL_TEMPLATE = (
    "{% if tools %}<|system|>\ntools: {{ tools | tojson }}<|end|>\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}{% endfor %}<|end|>\n{% endfor %}<|assistant|>\n"
)


def test_the_prompt_shows_the_tools_and_the_calls_as_the_template_writes_them(tiny_model_dir):
    from transformers import AutoTokenizer

    from common.prompt import prompt_token_ids
    from gateway.context.tokens import TokenCounter

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_TEMPLATE
    messages = chat_messages(
        completion(
            messages=[
                USER,
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
            ]
        ).messages
    )
    ids = prompt_token_ids(tokenizer, template_messages(messages), template_tools(uses()))
    text = tokenizer.decode(ids)
    assert 'tools: [{"type": "function", "function": {"name": "get_weather"' in text
    assert 'call get_weather {"city": "Paris", "days": 2}' in text
    assert "<|tool|>\n21 C" in text
    counter = TokenCounter(tokenizer)
    assert counter.count_prompt(list(messages), template_tools(uses())) == len(ids)
    assert counter.count_prompt(list(messages)) < len(ids)


def test_the_tools_and_the_calls_count_against_the_token_limits():
    from gateway.openai.chat_completions.tool_requests import tool_texts

    request_ = request(uses()).model_copy(
        update={
            "messages": chat_messages(
                completion(messages=[USER, {"role": "assistant", "tool_calls": [CALL]}]).messages
            )
        }
    )
    texts = tool_texts(request_)
    assert texts[0] == CALL["function"]["arguments"]
    assert [json.loads(t)["function"]["name"] for t in texts[1:]] == ["get_weather", "get_time"]
    assert tool_texts(request(None)) == []


def test_the_sims_examples_stay_small_whatever_the_schema_asks():
    schema = {
        "type": "object",
        "required": ["a", "s"],
        "properties": {
            "a": {"type": "array", "minItems": 10**9},
            "s": {"type": "string", "minLength": 10**9},
        },
    }
    value = example_value(schema)
    assert len(value["a"]) <= 64 and len(value["s"]) <= 64
