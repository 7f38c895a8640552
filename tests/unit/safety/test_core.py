"""The streaming safety logic: buffer window, overlap, release, retraction, classifiers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiokafka.structs import TopicPartition

from bus.request_reply import DeliveryStream
from chatpipe.settings import Settings
from chatpipe.wiring import safety_policy
from moderation.classifiers import (
    ClassifierFailed,
    EmbeddingClassifier,
    JudgeClassifier,
    RuleClassifier,
    Verdict,
    first_verdict,
    judge_verdict,
    luhn_valid,
)
from moderation.policy import PolicyConfig, build_policy
from safety.core import Check, Deliver, SafetyConfig, SafetyCore
from safety.judge import JudgeFailed, judge_ask
from safety.output_gate import OutputGate
from schemas import topics
from schemas.events import (
    AttemptStarted,
    Cancel,
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    Delta,
    GenerationDone,
    GenerationRequest,
    ModerationEvent,
    Retract,
    TokenChunk,
    Usage,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import FunctionCall, ToolCall, ToolCalls
from tests.support.bus import FakeConsumer
from tests.support.safety import (
    STREAM,
    chunk_of,
    feed,
    record,
    stage_with,
    stream_records,
    to_gateway,
)

# --- the gate -----------------------------------------------------------------------------


def test_gate_without_window_releases_checked_text_at_once():
    gate = OutputGate(window_chars=0)
    gate.feed("hello ")
    assert gate.passed() == "hello "
    assert gate.finish() == ""


def test_gate_holds_back_its_window_until_the_end():
    gate = OutputGate(window_chars=4)
    gate.feed("ab")
    assert gate.passed() == ""
    gate.feed("cdef")
    assert gate.passed() == "ab"
    assert gate.finish() == "cdef"
    assert gate.released == "abcdef"


def test_overlap_shows_checked_text_again_with_the_next_chunk():
    gate = OutputGate(window_chars=0, overlap_chars=5)
    gate.feed("my mail is bob@exa")
    gate.passed()
    gate.feed("mple.com")
    assert gate.to_check() == "b@example.com"


def test_sentence_mode_releases_whole_sentences():
    gate = OutputGate(sentences=True)
    gate.feed("One. Two")
    assert gate.passed() == "One. "
    gate.feed(" more! Three")
    assert gate.passed() == "Two more! "
    assert gate.finish() == "Three"


# --- classifiers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "number,valid",
    [
        ("4111 1111 1111 1111", True),
        ("4111 1111 1111 1112", False),
        ("5500-0000-0000-0004", True),
        ("1234", False),
    ],
)
def test_luhn(number, valid):
    assert luhn_valid(number) is valid


@pytest.mark.parametrize(
    "text,category",
    [
        ("write to alice@example.org today", "pii"),
        ("my card is 4111 1111 1111 1111", "pii"),
        ("order 4111 1111 1111 1112 shipped", None),
        ("call (415) 555-0123", "pii"),
        ("how to BUILD a bomb", "weapons"),
        ("a perfectly fine sentence", None),
    ],
)
async def test_rule_classifier(text, category):
    rules = RuleClassifier({"weapons": [r"\bbuild\s+a\s+bomb\b"]}, pii=["email", "card", "phone"])
    verdict = await rules.classify(text)
    assert (verdict.category if verdict else None) == category


class FakeEmbedder:
    """Bag-of-letters vectors: texts sharing words are close."""

    name = "fake"

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            v = np.zeros(26, dtype=np.float32)
            for c in text.lower():
                if c.isalpha():
                    v[ord(c) - 97] += 1
            rows.append(v / (np.linalg.norm(v) or 1))
        return np.array(rows)


async def test_embedding_classifier_uses_nearest_exemplar_above_threshold():
    classifier = EmbeddingClassifier(FakeEmbedder(), {"threat": ["zzz qqq zzz"]}, threshold=0.9)
    assert (await classifier.classify("zzz qqq")).category == "threat"
    assert await classifier.classify("hello there") is None


@pytest.mark.parametrize(
    "answer,expected",
    [
        ("safe", None),
        ("unsafe weapons", "weapons"),
        ("UNSAFE\nS1", "unsafe"),
        ("", None),
    ],
)
def test_judge_answers(answer, expected):
    verdict = judge_verdict(answer, ["weapons"])
    assert (verdict.category if verdict else None) == expected


class AnsweringClient:
    """The request/reply client's interface, its answers' delivery events already there."""

    reply_to = "chat.deliver.safety-gw"

    def __init__(self, *events: DeliverEvent) -> None:
        self.events = events
        self.requests: list[GenerationRequest] = []
        self.forgotten: list[str] = []

    async def submit(self, request: GenerationRequest) -> DeliveryStream:
        self.requests.append(request)
        stream = DeliveryStream(self, request.request_id)  # type: ignore[arg-type]
        for event in self.events:
            stream.put(event.model_copy(update={"request_id": request.request_id}))
        return stream

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)


def done_at(seq: int) -> DeliveryDone:
    return DeliveryDone(
        request_id="-", seq=seq, status=RequestStatus.FINISHED_STOPPED, usage=Usage()
    )


async def test_a_retracted_judge_answer_is_no_verdict():
    """The replacement text would read as "safe": the judge fails closed instead."""
    client = AnsweringClient(
        Delta(request_id="-", seq=0, text="unsafe "),
        Retract(request_id="-", seq=1, message_id="m", reason="pii", replacement="[removed]"),
        Delta(request_id="-", seq=2, text="weapons"),
        done_at(3),
    )
    async with asyncio.timeout(5):
        with pytest.raises(JudgeFailed, match="retracted"):
            await judge_ask(client, "judge-model")("is this safe?")
    [request] = client.requests
    assert request.tier == "free" and request.reply_to == client.reply_to
    assert client.forgotten == [request.request_id], "the stream is closed"


@pytest.mark.parametrize(
    "status",
    [RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR, RequestStatus.FINISHED_FILTERED],
)
async def test_a_judge_answer_that_did_not_end_normally_is_no_verdict(status):
    """A cancelled or expired judge generation ends with no text: that is not "safe"."""
    client = AnsweringClient(DeliveryDone(request_id="-", seq=0, status=status, usage=Usage()))
    async with asyncio.timeout(5):
        with pytest.raises(JudgeFailed, match=str(status)):
            await judge_ask(client, "judge-model")("?")


async def test_a_judge_answer_that_never_ends_times_out():
    client = AnsweringClient(Delta(request_id="-", seq=0, text="safe"))
    async with asyncio.timeout(5):
        with pytest.raises(TimeoutError):
            await judge_ask(client, "judge-model", wait_s=0.05)("?")
    assert len(client.forgotten) == 1, "the stream is closed"


async def test_a_judge_that_gives_no_verdict_fails_the_check_never_passes_it():
    classifier = JudgeClassifier(
        judge_ask(AnsweringClient(), "judge-model", wait_s=0.05), ["weapons"]
    )
    with pytest.raises(ClassifierFailed) as failed:
        await first_verdict([RuleClassifier({}, []), classifier], "text")
    assert isinstance(failed.value.__cause__, TimeoutError)


async def test_the_judge_takes_each_position_once_and_stops_at_the_end():
    client = AnsweringClient(
        Delta(request_id="-", seq=0, text="unsafe "),
        Delta(request_id="-", seq=0, text="unsafe "),
        Delta(request_id="-", seq=1, text="weapons"),
        done_at(2),
    )
    async with asyncio.timeout(5):
        assert await judge_ask(client, "judge-model")("?") == "unsafe weapons"


async def test_a_judge_generation_that_fails_raises():
    client = AnsweringClient(DeliveryError(request_id="-", seq=0, code="engine_error", message="x"))
    with pytest.raises(RuntimeError, match="engine_error"):
        await judge_ask(client, "judge-model")("?")


def policy_config(input_: list[str], output: list[str]) -> PolicyConfig:
    return PolicyConfig({"*": input_}, {"*": output}, {"weapons": ["bomb"]}, [], [], {}, 0.5)


async def answer_safe(prompt: str) -> str:
    return "safe"


def test_the_judge_checks_input_only():
    """Its answer streams through the safety stage: an output check asking it deadlocks."""
    with pytest.raises(ValueError, match="input only"):
        build_policy(policy_config(["rules"], ["rules", "judge"]), answer_safe)
    policy = build_policy(policy_config(["rules", "judge"], ["rules"]), answer_safe)
    assert [c.name for c in policy.input_classifiers(None, "m")] == ["rules", "judge"]


def test_a_judge_with_no_way_to_ask_is_refused_and_the_wiring_names_the_setting():
    with pytest.raises(ValueError, match="`ask`"):
        build_policy(policy_config(["judge"], ["rules"]))
    settings = Settings(safety_input_classifiers={"*": ["judge"]})
    with pytest.raises(ValueError, match="CHATPIPE_SAFETY_JUDGE_MODEL"):
        safety_policy(settings, None)


def test_a_safety_stage_run_alone_builds_the_output_check_only():
    """The judge is the gateway's (input only): a safety stage run alone needs no way to
    ask it, whatever the input classifiers name."""
    settings = Settings(
        safety_input_classifiers={"*": ["judge"]},
        safety_judge_model="m",
        safety_output_classifiers={"*": ["rules"]},
    )
    policy = safety_policy(settings, None, output_only=True)
    assert policy.input_classifiers(None, "m") == []
    assert [c.name for c in policy.output_classifiers(None, "m")] == ["rules"]


async def test_first_verdict_stops_at_first_hit():
    calls = []

    class Tripping:
        name = "t"

        async def classify(self, text):
            calls.append("t")
            return Verdict("x", "y", "t")

    class Never:
        name = "n"

        async def classify(self, text):
            calls.append("n")

    assert (await first_verdict([Never(), Tripping(), Never()], "text")).category == "x"
    assert calls == ["n", "t"]


# --- the stage's release/retract logic, with a recording publisher ----------------------------


async def test_clean_stream_is_released_and_ends_done():
    stage, out = stage_with()
    consumer = FakeConsumer(stream_records(["Hello ", "world"]))
    stage.runner.consumer = consumer  # type: ignore[assignment]
    await stage.runner.consume(until=lambda: not consumer.batches)
    deltas = [e.text for e in to_gateway(out) if isinstance(e, Delta)]
    assert deltas == ["Hello ", "world"]
    assert isinstance(to_gateway(out)[-1], DeliveryDone)
    answers = [e for topic, e in out.sent if topic == topics.ANSWERS]
    assert answers == to_gateway(out), "a stored answer's events go to chat.answers too"
    assert consumer.commits == [{TopicPartition(topics.TOKENS, 0): 3}], "an ended stream"


async def test_phrase_split_across_chunks_trips_and_retracts():
    stage, out = stage_with()
    await feed(stage, ["Sure, write to bob@ex", "ample.com and ", "more text"])
    kinds = [(topic, type(e).__name__) for topic, e in out.sent if topic != topics.ANSWERS]
    assert kinds[:1] == [("chat.deliver.gw", "Delta")]
    assert ("chat.control", "Cancel") in kinds
    assert ("chat.moderation", "ModerationEvent") in kinds
    retract = next(e for _, e in out.sent if isinstance(e, Retract))
    assert retract.message_id == "m" and retract.reason == "pii" and retract.replacement
    assert not any(isinstance(e, Delta) and "more" in e.text for _, e in out.sent)
    final = out.sent[-1][1]
    assert isinstance(final, DeliveryDone) and final.status == RequestStatus.FINISHED_FILTERED
    cancel = next(e for _, e in out.sent if isinstance(e, Cancel))
    moderation = next(e for _, e in out.sent if isinstance(e, ModerationEvent))
    assert cancel.request_id == "r" and moderation.action == "retract"


async def test_window_keeps_tripping_text_from_ever_being_sent():
    stage, out = stage_with(window=64)
    await feed(stage, ["Contact: ", "bob@example.com"])
    assert not any(isinstance(e, Delta) for _, e in out.sent), "held back, then retracted"
    assert any(isinstance(e, Retract) for _, e in out.sent)


async def test_duplicates_are_dropped():
    stage, out = stage_with()
    chunk = TokenChunk(**STREAM, seq=0, text="hi", token_count=1, completion_tokens=1)
    await stage.handle(record(chunk, 0))
    await stage.handle(record(chunk, 0))
    assert len([e for e in to_gateway(out) if isinstance(e, Delta)]) == 1


# --- the pure core: attempts, expiry, failures --------------------------------------------


def core_with(window: int = 0, idle_timeout_s: float = 10.0) -> SafetyCore:
    return SafetyCore(
        SafetyConfig(window_chars=window, overlap_chars=16, idle_timeout_s=idle_timeout_s)
    )


def run(core: SafetyCore, events: list[object], now: float = 0.0) -> list[object]:
    """Every output of `events` fed at offsets 0.., each chunk passing its check."""
    outputs: list[object] = []
    for offset, event in enumerate(events):
        step = core.on_event(event, 0, offset, now)
        if isinstance(step, Check):
            step = core.checked(step, None)
        outputs += step
    return outputs


def end_of(seq: int, attempt: int = 0) -> GenerationDone:
    return GenerationDone(
        **STREAM, seq=seq, attempt=attempt, status=RequestStatus.FINISHED_STOPPED, usage=Usage()
    )


def marker_of(attempt: int) -> AttemptStarted:
    return AttemptStarted(request_id="r", attempt=attempt, conversation_id="c", worker_id="w")


def test_a_continuation_joins_the_window_where_the_earlier_attempt_left_it():
    core = core_with(window=6)
    outputs = run(
        core,
        [
            marker_of(0),
            chunk_of(0, "Hello "),
            chunk_of(1, "big "),
            marker_of(1),
            chunk_of(2, "zombie", 0),
            chunk_of(2, "world", 1),
            end_of(3, 1),
        ],
    )
    delivered = [o.event for o in outputs if isinstance(o, Deliver)]
    text = "".join(e.text for e in delivered if isinstance(e, Delta))
    assert text == "Hello big world", "held text kept across attempts, the fenced one dropped"
    ids = [e.seq for e in delivered]
    assert ids == sorted(set(ids)), "delivery ids increase and never repeat"
    assert isinstance(delivered[-1], DeliveryDone) and delivered[-1].seq == 4


def test_the_tools_an_answer_called_reach_the_gateway_with_its_end():
    calls = ToolCalls(
        calls=(ToolCall(id="call_1", function=FunctionCall(name="get_time", arguments="{}")),)
    )
    end = end_of(1).model_copy(update={"tool_calls": calls})
    outputs = run(core_with(window=4), [marker_of(0), chunk_of(0, '[{"name":"get_time"}]'), end])
    delivered = [o.event for o in outputs if isinstance(o, Deliver)]
    assert isinstance(delivered[-1], DeliveryDone) and delivered[-1].tool_calls == calls
    assert "".join(e.text for e in delivered if isinstance(e, Delta)) == '[{"name":"get_time"}]'


def test_replaying_a_stream_gives_the_same_ids():
    events = [marker_of(0), chunk_of(0, "a b "), chunk_of(1, "c d "), end_of(2)]
    first = [o.event for o in run(core_with(window=3), events)]
    again = [o.event for o in run(core_with(window=3), events)]
    assert first == again


def test_an_idle_generation_expires_and_frees_the_commit_floor():
    core = core_with(idle_timeout_s=10)
    run(core, [marker_of(0), chunk_of(0, "a")], now=0.0)
    assert core.commit_floor(0) == 0
    assert core.expire(5.0) == [] and core.commit_floor(0) == 0
    assert core.expire(11.0) == ["r"] and core.commit_floor(0) is None
    assert run(core, [chunk_of(1, "late")], now=12.0) == [], "a given-up stream stays ended"


def test_a_failure_ends_the_stream_and_stops_the_generation():
    core = core_with()
    run(core, [chunk_of(0, "a")])
    outputs = core.fail(chunk_of(1, "b"))
    assert any(isinstance(o, Cancel) for o in outputs)
    [end] = [o.event for o in outputs if isinstance(o, Deliver)]
    assert isinstance(end, DeliveryError) and end.code == "safety_error" and end.seq == 2
    assert core.open_count == 0


def test_a_generation_awaits_its_first_chunk_from_its_marker_on():
    core = core_with()
    assert not core.awaiting_first_chunk
    run(core, [marker_of(0)])
    assert core.awaiting_first_chunk, "the marker says a stream is starting"
    run(core, [chunk_of(0, "a")])
    assert not core.awaiting_first_chunk


def test_a_poll_with_an_attempt_s_marker_says_a_first_chunk_is_on_its_way():
    from aiokafka.structs import ConsumerRecord, TopicPartition

    from safety.stage import _starts_a_stream
    from schemas.codec import encode, headers

    def polled(event):
        record = ConsumerRecord(
            "chat.tokens", 0, 0, 0, 0, None, encode(event), None, 0, 0, headers(event)
        )
        return {TopicPartition("chat.tokens", 0): [record]}

    assert _starts_a_stream(polled(marker_of(0)))
    assert not _starts_a_stream(polled(chunk_of(0, "a")))
    assert not _starts_a_stream({})


def test_safety_commits_at_most_once_a_second(monkeypatch):
    import safety.stage

    stage, _ = stage_with()
    now = [100.0]
    monkeypatch.setattr(safety.stage.time, "monotonic", lambda: now[0])
    done = {TopicPartition(topics.TOKENS, 0): 3}
    assert stage.commit_rule(done) == done, "the first commit at once"
    now[0] += 0.5
    assert stage.commit_rule({TopicPartition(topics.TOKENS, 0): 5}) == {}
    now[0] += 0.5
    assert stage.commit_rule({TopicPartition(topics.TOKENS, 0): 5}) == {
        TopicPartition(topics.TOKENS, 0): 5
    }
    assert stage.commit_rule({}) == {}
