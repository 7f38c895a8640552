"""Function tools and structured output on the Responses API (pure): a request read as
the chat completion it runs as, a refusal's field renamed, and an answer that called
tools (or not) as the numbered events and response the official SDK parses."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from gateway.openai.responses.events import HEAD, ResponseEvents
from gateway.openai.responses.protocol import chat_completion, check_fields, responses_param
from gateway.refusals import Unacceptable
from schemas.api import JsonObjectFormat, JsonSchemaResponseFormat, NamedToolChoice
from schemas.events import DeliveryDone, Delta, Retract, Usage
from schemas.lifecycle import RequestStatus
from schemas.responses import ResponseObject, ResponseRequest
from schemas.tools import FunctionCall, ToolCall, ToolCalls
from tests.support.limits import small_limits

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "description": "d", "parameters": WEATHER,
        "strict": True}  # fmt: skip
USAGE = Usage(prompt_tokens=7, completion_tokens=5)


def request(**fields) -> ResponseRequest:
    return ResponseRequest.model_validate({"input": "Weather?", **fields})


def test_function_tools_and_the_tool_choice_become_the_chat_completions():
    completion = chat_completion(
        request(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                parallel_tool_calls=False), [], "tiny-random")  # fmt: skip
    [tool] = completion.tools or []
    assert (tool.function.name, tool.function.parameters, tool.function.strict) == (
        "get_weather", WEATHER, True)  # fmt: skip
    assert completion.tool_choice == NamedToolChoice.model_validate(
        {"function": {"name": "get_weather"}}
    )
    assert completion.parallel_tool_calls is False
    assert chat_completion(request(tools=[TOOL], tool_choice="required"), [], "t").tool_choice == (
        "required"
    )


def test_function_calls_join_their_answer_and_outputs_are_tool_messages():
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather",
         "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "rain"}]},
    ]  # fmt: skip
    body = request(input=items, tools=[TOOL])
    assert body.runs_as_completion
    messages = chat_completion(body, [], "tiny-random").messages
    assert [(m.role, m.content, m.tool_call_id) for m in messages] == [
        ("user", "Weather in Paris and Rome?", None),
        ("assistant", "Looking.", None),
        ("tool", "sunny", "call_1"),
        ("tool", "rain", "call_2"),
    ]
    assert [(c.id, c.function.arguments) for c in messages[1].tool_calls or ()] == [
        ("call_1", '{"city": "Paris"}'),
        ("call_2", '{"city": "Rome"}'),
    ]
    lone = chat_completion(request(input=items[2:3]), [], "tiny-random").messages
    assert [(m.role, m.content, len(m.tool_calls or ())) for m in lone] == [("assistant", None, 1)]


def test_a_json_text_format_is_the_chat_completions_response_format():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    text = {"format": {"type": "json_schema", "name": "count", "schema": schema, "strict": True}}
    body = request(text=text)
    assert body.runs_as_completion
    completion = chat_completion(body, [], "tiny-random")
    assert isinstance(completion.response_format, JsonSchemaResponseFormat)
    assert completion.json_format == {"json_schema": schema}
    as_object = chat_completion(
        request(text={"format": {"type": "json_object"}}), [], "tiny-random"
    )
    assert isinstance(as_object.response_format, JsonObjectFormat)
    assert (
        chat_completion(request(text={"format": {"type": "text"}}), [], "t").response_format is None
    )


@pytest.mark.parametrize(("fields", "runs_as_completion"), [
    ({}, False),
    ({"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}, False),
    ({"tool_choice": "none", "text": {"format": {"type": "text"}}}, False),
    ({"tools": [TOOL]}, True),
    ({"tool_choice": "required"}, True),
    ({"text": {"format": {"type": "json_object"}}}, True),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, True),
])  # fmt: skip
def test_what_runs_as_a_chat_completion(fields, runs_as_completion):
    assert request(**fields).runs_as_completion is runs_as_completion


@pytest.mark.parametrize(("item", "param", "code", "kind"), [
    ({"type": "reasoning", "summary": []}, "input.1.type", "unsupported_input_item", "reasoning"),
    ({"type": "input_image", "image_url": "http://x"}, "input.1.type", "unsupported_input_item",
     "input_image"),
    ({"role": "user", "content": [{"type": "input_text", "text": "see"},
                                  {"type": "input_image", "image_url": "http://x"}]},
     "input.1.content.1.type", "unsupported_content", "input_image"),
    ({"type": "function_call_output", "call_id": "c",
      "output": [{"type": "input_file", "file_id": "f"}]},
     "input.1.output.0.type", "unsupported_content", "input_file"),
])  # fmt: skip
def test_an_input_item_or_part_chatpipe_cannot_read_is_refused_by_its_place(
    item, param, code, kind
):
    body = request(input=[{"role": "user", "content": "Hi"}, item])
    with pytest.raises(Unacceptable) as refused:
        check_fields(body, small_limits())
    assert (refused.value.code, refused.value.param) == (code, param)
    assert repr(kind) in refused.value.message


def test_a_refusal_part_sent_back_is_the_assistant_messages_text():
    body = request(input=[
        {"role": "user", "content": "Do X"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I will not."}]},
        {"role": "user", "content": "Why?"},
    ])  # fmt: skip
    check_fields(body, small_limits())
    assert [(m.role, m.content) for m in chat_completion(body, [], "t").messages] == [
        ("user", "Do X"), ("assistant", "I will not."), ("user", "Why?")]  # fmt: skip


def test_a_refused_field_says_what_to_do_instead():
    with pytest.raises(Unacceptable) as refused:
        check_fields(request(top_logprobs=2), small_limits())
    assert refused.value.param == "top_logprobs"
    assert "POST /v1/chat/completions" in refused.value.message


@pytest.mark.parametrize(("chat", "responses"), [
    ("tools.2.function.parameters", "tools.2.parameters"),
    ("tools.0.function.parameters.$defs.a", "tools.0.parameters.$defs.a"),
    ("tool_choice.function.name", "tool_choice.name"),
    ("response_format.json_schema.schema", "text.format.schema"),
    ("messages.3.tool_call_id", "input"),
    ("tools", "tools"),
    (None, None),
])  # fmt: skip
def test_a_chat_completions_refusal_names_the_responses_field(chat, responses):
    assert responses_param(chat) == responses


def head(**fields) -> ResponseObject:
    return ResponseObject(id="resp_m1", created_at=1.0, status="in_progress", model="tiny-random",
                          tools=[TOOL], **fields)  # fmt: skip


def ended_with(events: ResponseEvents, end: DeliveryDone) -> list:
    out = events.head()
    for event in (Delta(request_id="r", seq=0, text="<tool"), Delta(request_id="r", seq=1,
                  text="_call>"), end):  # fmt: skip
        out += events.add(event)
    return out


def sdk(events) -> list:
    adapter = TypeAdapter(ResponseStreamEvent)
    return [adapter.validate_python(e.model_dump(mode="json")) for e in events]


CALLS = ToolCalls(
    calls=(
        ToolCall(id="call_a", function=FunctionCall(name="get_weather", arguments='{"city":"P"}')),
        ToolCall(id="call_b", function=FunctionCall(name="get_weather", arguments='{"city":"R"}')),
    )
)


def test_an_answer_that_called_tools_streams_each_call_whole_at_its_end():
    end = DeliveryDone(request_id="r", seq=2, status=RequestStatus.FINISHED_STOPPED,
                       usage=USAGE, tool_calls=CALLS)  # fmt: skip
    events = sdk(ended_with(ResponseEvents(head()), end))
    call_events = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", *call_events, *call_events,
        "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == [0, 1, *range(HEAD + 2, HEAD + 2 + 9)]
    assert [(e.output_index, e.delta) for e in events if hasattr(e, "delta")] == [
        (0, '{"city":"P"}'),
        (1, '{"city":"R"}'),
    ]
    assert events[2].item.arguments == "" and events[2].item.status == "in_progress"
    final = Response.model_validate(events[-1].response.model_dump(mode="json"))
    assert [(i.type, i.id, i.call_id, i.name, i.status) for i in final.output] == [
        ("function_call", "fc_a", "call_a", "get_weather", "completed"),
        ("function_call", "fc_b", "call_b", "get_weather", "completed"),
    ]
    assert final.output_text == ""


def test_an_answer_with_tools_that_called_none_sends_its_text_whole():
    end = DeliveryDone(request_id="r", seq=2, status=RequestStatus.FINISHED_STOPPED, usage=USAGE)
    events = sdk(ended_with(ResponseEvents(head()), end))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert events[4].delta == "<tool_call>" and events[-1].response.output_text == "<tool_call>"
    assert [e.sequence_number for e in events][2:] == list(range(HEAD + 2, HEAD + 2 + 7))


def test_text_beside_the_calls_is_a_message_before_them():
    calls = ToolCalls(calls=CALLS.calls[:1], content="Let me look.")
    end = DeliveryDone(request_id="r", seq=2, status=RequestStatus.FINISHED_STOPPED,
                       usage=USAGE, tool_calls=calls)  # fmt: skip
    events = ResponseEvents(head())
    ended_with(events, end)
    final = events.final
    assert final is not None
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output_text == "Let me look."


def test_events_after_starting_after_keep_their_numbers():
    end = DeliveryDone(request_id="r", seq=2, status=RequestStatus.FINISHED_STOPPED,
                       usage=USAGE, tool_calls=CALLS)  # fmt: skip
    whole = ended_with(ResponseEvents(head()), end)
    later = ended_with(ResponseEvents(head(), after=HEAD + 4), end)
    assert later == [e for e in whole if e.sequence_number > HEAD + 4]


def test_tools_the_model_is_not_shown_stream_as_text():
    events = ResponseEvents(head(tool_choice="none"))
    end = DeliveryDone(request_id="r", seq=2, status=RequestStatus.FINISHED_STOPPED, usage=USAGE)
    types = [e.type for e in ended_with(events, end)]
    assert types[2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]


def test_a_retracted_answer_with_calls_is_the_replacement_text_only():
    events = ResponseEvents(head())
    events.head()
    retract = Retract(request_id="r", seq=1, message_id="m1", reason="pii", replacement="[x]")
    end = DeliveryDone(request_id="r", seq=2, status=RequestStatus.FINISHED_STOPPED,
                       usage=USAGE, tool_calls=CALLS)  # fmt: skip
    shown = [e for event in (Delta(request_id="r", seq=0, text="<t"), retract, end)
             for e in events.add(event)]  # fmt: skip
    final = shown[-1].response
    assert (final.status, final.incomplete_details.reason) == ("incomplete", "content_filter")
    assert [item.type for item in final.output] == ["message"]
    assert final.output_text == "[x]"


@pytest.mark.parametrize("item", [
    {"type": {}},
    {"type": ["message"]},
    {"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]},
])  # fmt: skip
def test_an_item_or_part_whose_type_is_not_a_string_fails_validation(item):
    with pytest.raises(ValidationError):
        request(input=[item])
