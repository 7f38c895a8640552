"""The response cache's rules (`gateway.cache.rules`): which requests it may answer,
under which key, what it keeps, and how a kept answer is paced."""

from __future__ import annotations

import pytest

from conversations.store import CachedResponse
from gateway.cache.rules import (
    cache_key,
    entry_to_keep,
    marked_miss,
    paced_chunks,
    refusal,
    replay,
)
from schemas.answer import AnswerText
from schemas.events import (
    ChatMessage,
    DeliveryDone,
    DeliveryError,
    Delta,
    GenerationRequest,
    Retract,
    Role,
    SamplingOptions,
    StreamPosition,
    Usage,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import FunctionSpec, ServerToolTurn, ToolSpec, ToolUse
from schemas.topics import Tier

SYSTEM = ChatMessage(role=Role.SYSTEM, content="You are terse.")
QUESTION = ChatMessage(role=Role.USER, content="2+2?")
ANSWER = ChatMessage(role=Role.ASSISTANT, content="4")
POLICY = "rules(email)"
"""An output policy: its digest, as `SafetyPolicy.output_policy` gives it."""


def key(made: GenerationRequest, system_prompt: str = "", policy: str = POLICY) -> str | None:
    return cache_key(made, system_prompt, output_policy=policy)


def request(*messages: ChatMessage, temperature: float = 0.0, **fields) -> GenerationRequest:
    defaults = dict(
        request_id="r1",
        conversation_id="c1",
        message_id="m1",
        user_id="alice",
        org_id="acme",
        tier=Tier.PRO,
        model="tiny-random",
        reply_to="chat.deliver.gw-1",
    )
    return GenerationRequest(
        **{**defaults, **fields},
        messages=messages or (QUESTION,),
        sampling=SamplingOptions(temperature=temperature, max_tokens=16),
    )


class WithTools(GenerationRequest):
    """A request as the tool-calling change may shape it: a field this rule never saw."""

    tools: tuple[str, ...] = ()


class ToolMessage(ChatMessage):
    tool_call_id: str | None = None


CLOCK = ToolUse(tools=(ToolSpec(function=FunctionSpec(name="clock")),))


def with_tools(**fields) -> GenerationRequest:
    base = request().model_dump()
    return WithTools(**{**base, **fields})


@pytest.mark.parametrize(("made", "why"), [
    (request(), None),
    (request(SYSTEM, QUESTION, store=False), None),
    (request(temperature=0.7), "temperature"),
    (request(temperature=0.01), "temperature"),
    (request(QUESTION, ANSWER, QUESTION), "history"),
    (request(SYSTEM, QUESTION, ANSWER, QUESTION), "history"),
    (request(SYSTEM, SYSTEM, QUESTION), "history"),  # a summary, retrieved turns or files
    (request(QUESTION, SYSTEM), "history"),
    (request(ANSWER), "history"),
    (request(SYSTEM), "history"),
    (with_tools(tools=("calculator",)), "other_input"),
    (with_tools(), None),  # the field exists but is unset: nothing else goes in
    (request(tool_use=CLOCK), "other_input"),  # tools shown to the model, server or not
    (request(tool_use=CLOCK, server_tools=ServerToolTurn(answer_id="r1", max_rounds=4)),
     "other_input"),
    # a native turn naming files: refused whatever their search found (here nothing: no
    # excerpts in the prompt, which is otherwise a plain first turn)
    (request(file_ids=("file-1",)), "other_input"),
    (request(SYSTEM, QUESTION, file_ids=("file-1", "file-2")), "other_input"),
    (request(ToolMessage(role=Role.USER, content="2+2?", tool_call_id="t1")), "other_input"),
    (request(attempt=1), "not_a_new_request"),
    (request(requested_model="big"), "not_a_new_request"),
    (request(stream=StreamPosition(partition=0, start_offset=0, attempt_offset=0)),
     "not_a_new_request"),
])  # fmt: skip
def test_which_requests_the_cache_may_answer(made: GenerationRequest, why: str | None) -> None:
    assert refusal(made) == why
    assert (key(made) is None) == (why is not None)


EXCERPTS = ChatMessage(role=Role.SYSTEM, content="From notes.md: the answer is 4.")


@pytest.mark.parametrize(("made", "system_prompt", "why"), [
    (request(SYSTEM, QUESTION), SYSTEM.content, None),  # native: the deployment's prompt
    (request(QUESTION), "", None),
    (request(QUESTION), SYSTEM.content, None),
    # the gateway added a system message: retrieved excerpts (with no system prompt of
    # the deployment's, or beside it), a summary
    (request(EXCERPTS, QUESTION), "", "other_input"),
    (request(EXCERPTS, QUESTION), SYSTEM.content, "other_input"),
    (request(SYSTEM, EXCERPTS, QUESTION), SYSTEM.content, "history"),
    # OpenAI-compatible (not stored): the client wrote its own system prompt
    (request(EXCERPTS, QUESTION, store=False), "", None),
])  # fmt: skip
def test_a_native_prompt_may_hold_only_the_deployments_system_prompt(
    made: GenerationRequest, system_prompt: str, why: str | None
) -> None:
    assert refusal(made, system_prompt) == why
    assert (key(made, system_prompt) is None) == (why is not None)


def test_the_key_covers_org_output_policy_model_prompt_and_sampling_not_who_or_where() -> None:
    first = key(request())
    assert first is not None and len(first) == 64
    same = request(request_id="r2", conversation_id="c2", message_id="m2", user_id="bob",
                   reply_to="chat.deliver.gw-2", store=False, alias="chat")  # fmt: skip
    assert key(same) == first
    # the tier changes the answer only through its output policy: under the same one
    # two tiers share the entry, under another they never do
    assert key(request(tier=Tier.FREE)) == first
    assert key(request(tier=Tier.FREE), policy="none") != first
    assert key(request(), policy="none") != first
    others = [
        request(org_id="globex"),
        request(SYSTEM, QUESTION),
        request(ChatMessage(role=Role.USER, content="2+2? ")),
        request().model_copy(update={"model": "big"}),
        request().model_copy(update={"sampling": SamplingOptions(temperature=0, max_tokens=17)}),
        request().model_copy(
            update={"sampling": SamplingOptions(temperature=0, max_tokens=16, stop=("\n",))}
        ),
        request().model_copy(
            update={"sampling": SamplingOptions(temperature=0, max_tokens=16, seed=7)}
        ),
    ]
    keys = {key(other) for other in others}
    assert first not in keys and len(keys) == len(others)


def ended(*events) -> AnswerText:
    text = AnswerText()
    for event in events:
        text.add(event)
    return text


def done(seq: int, status=RequestStatus.FINISHED_STOPPED, cache=None, model="tiny-random"):
    usage = Usage(prompt_tokens=9, completion_tokens=3, cached_tokens=4, cache=cache)
    return DeliveryDone(request_id="r1", seq=seq, status=status, usage=usage, model=model)


def delta(seq: int, text: str) -> Delta:
    return Delta(request_id="r1", seq=seq, text=text)


@pytest.mark.parametrize(("events", "kept"), [
    ((delta(0, "fo"), delta(1, "ur"), done(2)), True),
    ((delta(0, "four"), done(1, RequestStatus.FINISHED_LENGTH)), True),
    ((delta(0, "fo"), done(1, RequestStatus.FINISHED_ABORTED)), False),  # cancelled
    ((delta(0, "fo"), done(1, RequestStatus.FINISHED_ERROR)), False),
    ((delta(0, "fo"), DeliveryError(request_id="r1", seq=1, code="x", message="y")), False),
    ((delta(0, "fo"), Retract(request_id="r1", seq=1, message_id="m1", reason="pii"),
      done(2)), False),
    ((delta(0, "fo"),), False),  # not ended
    ((delta(0, "four"), done(1, cache="hit")), False),  # a replay is not kept again
])  # fmt: skip
def test_what_the_cache_keeps_of_an_answer(events, kept: bool) -> None:
    entry = entry_to_keep(request(), "k", ended(*events), "tiny-random", now=100.0, ttl_s=60.0)
    assert (entry is not None) == kept
    if entry is not None:
        assert (entry.cache_key, entry.org_id, entry.model, entry.content) == (
            "k",
            "acme",
            "tiny-random",
            "four",
        )
        assert (entry.prompt_tokens, entry.completion_tokens) == (9, 3)
        assert (entry.created_at, entry.expires_at) == (100.0, 160.0)


def test_an_answer_by_another_model_than_asked_is_not_kept() -> None:
    text = ended(delta(0, "four"), done(1, model="small"))
    assert entry_to_keep(request(), "k", text, "small", now=0.0, ttl_s=60.0) is None


@pytest.mark.parametrize(("content", "tokens", "tokens_per_s", "chunk_s", "expected"), [
    ("", 0, 50.0, 0.05, []),
    ("four", 1, 50.0, 0.05, [(0.0, "four")]),
    ("abcdefgh", 8, 40.0, 0.05, [(0.0, "ab"), (0.05, "cd"), (0.1, "ef"), (0.15, "gh")]),
    ("abcdefgh", 4, 40.0, 0.05, [(0.0, "abcd"), (0.05, "efgh")]),  # 2 chars a token
    ("abc", 30, 40.0, 0.05, [(0.0, "a"), (0.05, "b"), (0.1, "c")]),  # never an empty chunk
    ("abcdef", 6, 10.0, 0.05, [(i * 0.1, c) for i, c in enumerate("abcdef")]),  # >= 1 token
])  # fmt: skip
def test_a_kept_answer_is_paced_at_tokens_per_second(content, tokens, tokens_per_s, chunk_s,
                                                      expected) -> None:  # fmt: skip
    chunks = paced_chunks(content, tokens, tokens_per_s, chunk_s)
    assert [text for _, text in chunks] == [text for _, text in expected]
    assert [at for at, _ in chunks] == pytest.approx([at for at, _ in expected])
    assert "".join(text for _, text in chunks) == content


def test_a_long_answer_takes_its_tokens_over_the_rate() -> None:
    chunks = paced_chunks("word " * 200, 200, 50.0, 0.05)
    assert len(chunks) == 80 and chunks[-1][0] == pytest.approx(79 * 0.05)  # ~4 s for 200


def test_a_replay_is_paced_deltas_then_the_end_marked_hit() -> None:
    entry = CachedResponse("k", "acme", "tiny-random", "abcdefgh", prompt_tokens=12,
                           completion_tokens=8, status=RequestStatus.FINISHED_LENGTH,
                           created_at=0.0, expires_at=60.0)  # fmt: skip
    timed = replay(request(request_id="r9"), entry, tokens_per_s=40.0, chunk_s=0.05)

    *deltas, (end_at, end) = timed
    assert [(e.seq, e.text) for _, e in deltas] == [(0, "ab"), (1, "cd"), (2, "ef"), (3, "gh")]
    assert all(e.request_id == "r9" for _, e in timed)
    assert isinstance(end, DeliveryDone) and end.seq == 4 and end_at == deltas[-1][0]
    assert (end.status, end.model) == (RequestStatus.FINISHED_LENGTH, "tiny-random")
    assert end.usage == Usage(prompt_tokens=12, completion_tokens=8, cached_tokens=12,
                              cache="hit")  # fmt: skip
    assert ended(*(e for _, e in timed)).answered


def test_a_generated_end_is_marked_miss() -> None:
    marked = marked_miss(done(3))
    assert marked.usage.cache == "miss" and marked.usage.completion_tokens == 3
    assert marked.seq == 3 and marked.status == RequestStatus.FINISHED_STOPPED
