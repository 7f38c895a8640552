"""Rate limits: the sliding-window math, the headers, and the limiter on limits' own
memory storage under a fake clock (so Retry-After is checked against the library)."""

from __future__ import annotations

from math import inf
from types import SimpleNamespace

import limits.aio.storage.memory as limits_memory
import pytest

from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.store import ApiKey
from gateway.admission.rate_limits import (
    Check,
    Limit,
    RateLimiter,
    WindowCount,
    admission_tokens,
    openai_duration,
    ratelimit_headers,
    refusal,
    storage_from_uri,
)
from gateway.errors import ApiError
from schemas.events import ChatMessage, Role
from schemas.topics import Tier

MINUTE = 60.0
ALICE = ApiKey("alice", "acme", Tier.FREE)
BOB = ApiKey("bob", "acme", Tier.FREE)


def window(
    limit: int = 10, prev: int = 0, prev_ttl: float = 0.0, cur: int = 0, cur_ttl: float = 90.0
) -> WindowCount:
    return WindowCount(limit, MINUTE, prev, prev_ttl, cur, cur_ttl)


def limit(name: str = "user_requests_per_minute", per_minute: int = 10) -> Limit:
    quantity = "requests" if "requests" in name else "tokens"
    return Limit(name, quantity, per_minute, (quantity, "user", "alice"))


# --- window math ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "w", "cost", "used", "wait"),
    [
        ("empty", window(), 1, 0, 0.0),
        ("room left", window(cur=9), 1, 9, 0.0),
        ("exactly full", window(cur=10), 1, 10, 30.0),  # this window ends in 90 - 60 s
        ("previous weighs by overlap", window(prev=10, prev_ttl=30.0, cur=6), 1, 11, 6.0),
        ("full window must roll over, then decay", window(cur=8, cur_ttl=70.0), 5, 8, 25.0),
        ("cost over the whole limit", window(), 11, 0, inf),
    ],
)
def test_window_used_and_wait(case: str, w: WindowCount, cost: int, used: int, wait: float) -> None:
    assert w.used == used, case
    assert w.fits(cost) is (wait == 0.0), case
    assert w.wait_for(cost) == pytest.approx(wait), case


def test_reset_is_when_nothing_counts_any_more() -> None:
    assert window().reset_after == 0.0
    assert window(prev=3, prev_ttl=12.0).reset_after == 12.0
    assert window(prev=3, prev_ttl=12.0, cur=1, cur_ttl=72.0).reset_after == 72.0


def test_a_charge_counts_in_the_current_window() -> None:
    charged = window(cur=0, cur_ttl=0.0).charged(4)  # Redis reports no counter yet
    assert (charged.current_count, charged.current_ttl, charged.remaining) == (4, 120.0, 6)


def test_admission_tokens_are_prompt_chars_over_four_plus_max_tokens() -> None:
    messages = [
        ChatMessage(role=Role.SYSTEM, content="x" * 10),
        ChatMessage(role=Role.USER, content="y" * 7),
    ]
    assert admission_tokens(messages, 100) == 5 + 100


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.02, "20ms"),
        (1, "1s"),
        (8.64, "8.64s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (3723.5, "1h2m3.5s"),
    ],
)
def test_openai_duration(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text


def test_refusal_names_the_limit_that_holds_back_longest() -> None:
    checks = [
        Check(limit("user_requests_per_minute"), window(cur=3), 1),
        Check(limit("org_requests_per_minute"), window(cur=10, cur_ttl=65.0), 1),
        Check(limit("user_tokens_per_minute"), window(cur=10, cur_ttl=100.0), 1),
    ]
    assert refusal(checks).limit.name == "user_tokens_per_minute"
    assert refusal(checks[:1]) is None


def test_headers_report_the_tighter_of_user_and_org() -> None:
    checks = [
        Check(limit("user_requests_per_minute", 5), window(5, cur=1, cur_ttl=75.0), 1),
        Check(limit("org_requests_per_minute", 100), window(100, cur=98, cur_ttl=61.0), 1),
        Check(limit("user_tokens_per_minute", 1000), window(1000, cur=10), 50),
        Check(limit("org_tokens_per_minute", 9000), window(9000, cur=10), 50),
    ]
    assert ratelimit_headers(checks) == {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "1m1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "990",
        "x-ratelimit-reset-tokens": "1m30s",
    }


# --- the limiter on limits' memory storage ---------------------------------------------------


A_MINUTE_START = 1_699_999_980.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock(A_MINUTE_START + 40.0)  # limits aligns memory windows on the minute
    monkeypatch.setattr(limits_memory, "time", SimpleNamespace(time=clock))
    return clock


async def memory_limiter(**limits: int):
    """A limiter on these limits over memory storage, reset (its expiry task stopped)
    after the test."""
    limiter = RateLimiter(
        gateway_config(Settings(**limits)).rate_limits, storage_from_uri("memory://")
    )
    yield limiter
    await limiter.storage.reset()


@pytest.fixture
async def limiter(clock: Clock):
    async for limiter in memory_limiter(
        user_requests_per_minute=3,
        org_requests_per_minute=5,
        user_tokens_per_minute=1000,
        org_tokens_per_minute=100_000,
    ):
        yield limiter


async def refused(limiter: RateLimiter, owner: ApiKey, tokens: int = 10) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await limiter.acquire(owner, tokens)
    return caught.value


async def test_admitted_requests_get_headers_and_the_one_over_gets_429(
    limiter: RateLimiter,
) -> None:
    first = await limiter.acquire(ALICE, 10)
    assert first["x-ratelimit-limit-requests"] == "3"
    assert first["x-ratelimit-remaining-requests"] == "2"
    assert first["x-ratelimit-remaining-tokens"] == "990"
    await limiter.acquire(ALICE, 10)
    await limiter.acquire(ALICE, 10)
    error = await refused(limiter, ALICE)
    assert (error.status_code, error.code) == (429, "rate_limited")
    assert "user_requests_per_minute" in error.detail
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(error.headers["Retry-After"]) in (20, 21)  # the window ends in 20 s


async def test_a_refused_request_is_not_charged(limiter: RateLimiter) -> None:
    await limiter.acquire(ALICE, 990)
    error = await refused(limiter, ALICE, tokens=20)
    assert "user_tokens_per_minute" in error.detail
    headers = await limiter.acquire(ALICE, 10)  # the refused 20 tokens were not taken
    assert headers["x-ratelimit-remaining-tokens"] == "0"
    assert headers["x-ratelimit-remaining-requests"] == "1"


async def test_the_org_limit_binds_across_its_users(limiter: RateLimiter) -> None:
    for owner in (ALICE, ALICE, ALICE, BOB, BOB):
        await limiter.acquire(owner, 1)
    error = await refused(limiter, BOB, tokens=1)
    assert "org_requests_per_minute" in error.detail


async def test_a_request_larger_than_a_limit_is_told_waiting_cannot_help(
    limiter: RateLimiter,
) -> None:
    error = await refused(limiter, ALICE, tokens=1001)
    assert "Retry-After" not in error.headers
    assert "max_tokens" in error.detail


@pytest.mark.parametrize(
    ("into_minute", "spacing", "tokens"),
    [(40.25, 0.0, 10), (50.25, 5.0, 10), (59.5, 0.2, 10), (10.75, 0.0, 400)],
)
async def test_retry_after_is_when_the_request_fits_again(
    limiter: RateLimiter, clock: Clock, into_minute: float, spacing: float, tokens: int
) -> None:
    clock.now = A_MINUTE_START + into_minute
    while True:
        try:
            await limiter.acquire(ALICE, tokens)
        except ApiError as error:
            retry_after = int(error.headers["Retry-After"])
            break
        clock.now += spacing
    clock.now += retry_after - 1
    await refused(limiter, ALICE, tokens)
    clock.now += 1
    await limiter.acquire(ALICE, tokens)


async def test_the_same_user_id_in_another_org_has_limits_of_its_own(
    limiter: RateLimiter,
) -> None:
    """A user is one of an org's: another tenant's `alice` cannot use up this one's."""
    other_alice = ApiKey("alice", "globex", Tier.FREE)
    for _ in range(3):
        await limiter.acquire(other_alice, 1)
    assert "user_requests_per_minute" in (await refused(limiter, other_alice, 1)).detail
    headers = await limiter.acquire(ALICE, 1)
    assert headers["x-ratelimit-remaining-requests"] == "2"


@pytest.fixture
async def upload_limiter(clock: Clock):
    async for limiter in memory_limiter(
        user_requests_per_minute=100,
        org_requests_per_minute=100,
        user_files_per_minute=2,
        org_files_per_minute=3,
    ):
        yield limiter


async def test_uploads_count_against_the_files_limits_and_turns_do_not(
    upload_limiter: RateLimiter,
) -> None:
    turn = await upload_limiter.acquire(ALICE, 10)
    assert not [name for name in turn if name.endswith("-files")]
    first = await upload_limiter.acquire(ALICE, 0, files=1)
    assert (first["x-ratelimit-limit-files"], first["x-ratelimit-remaining-files"]) == ("2", "1")
    assert first["x-ratelimit-remaining-requests"] == "98"  # an upload is a request too
    await upload_limiter.acquire(ALICE, 0, files=1)

    with pytest.raises(ApiError) as caught:
        await upload_limiter.acquire(ALICE, 0, files=1)
    error = caught.value
    assert (error.status_code, error.code) == (429, "rate_limited")
    assert error.detail.startswith("user_files_per_minute reached: 2 of 2")
    assert int(error.headers["Retry-After"]) in (20, 21)  # the window ends in 20 s
    assert error.headers["x-ratelimit-remaining-files"] == "0"
    assert error.headers["x-ratelimit-remaining-requests"] == "97"  # the refusal cost nothing

    await upload_limiter.acquire(ALICE, 10)  # turns go on
    await upload_limiter.acquire(BOB, 0, files=1)
    with pytest.raises(ApiError) as caught:
        await upload_limiter.acquire(BOB, 0, files=1)
    assert caught.value.detail.startswith("org_files_per_minute reached: 3 of 3")
