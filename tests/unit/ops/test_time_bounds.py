"""TIME arguments, and when a broker's offsets_for_times answer is believed."""

from __future__ import annotations

import pytest

from ops.time_bounds import TimeAnswer, parse_time, time_offsets_believable

NOW = 1_800_000_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", NOW - 600_000),
        ("2h", NOW - 7_200_000),
        (" 90s ", NOW - 90_000),
        ("1d", NOW - 86_400_000),
        ("1w", NOW - 604_800_000),
        ("1.5h", NOW - 5_400_000),
        ("500ms", NOW - 500),
        ("2026-11-30T16:00:00Z", 1_796_054_400_000),
        ("2026-11-30T16:00:00", 1_796_054_400_000),  # no offset: UTC
        ("2026-11-30T17:00:00+01:00", 1_796_054_400_000),
        ("2026-11-30T16:00:00.250Z", 1_796_054_400_250),
        ("1796054400000", 1_796_054_400_000),
    ],
)
def test_times(text, expected):
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "10 minutes", "-5m", "12", "2026-13-01"])
def test_not_times(text):
    with pytest.raises(ValueError, match="not a time"):
        parse_time(text, NOW)


def test_an_answer_is_believed_only_when_the_records_read_there_bear_it_out():
    assert time_offsets_believable(
        [
            TimeAnswer(5, 1000, found_ms=1000, before_ms=999),
            None,
            TimeAnswer(0, 1200, found_ms=1200, before_ms=None),
        ],
        1000,
    )
    assert time_offsets_believable([], 1000)
    assert time_offsets_believable([(5, 1000, 1000, 10)], 1000)  # plain tuples too


@pytest.mark.parametrize(
    "answer",
    [
        TimeAnswer(0, -1, found_ms=500, before_ms=None),  # Tansu, for a time past the end
        TimeAnswer(0, 1_500, found_ms=500, before_ms=None),  # Tansu: its clock, not the record's
        TimeAnswer(3, 999, found_ms=999, before_ms=10),  # earlier than asked
        TimeAnswer(5, 1000, found_ms=1000, before_ms=1000),  # not the first at that time
        TimeAnswer(5, 1000, found_ms=None, before_ms=900),  # no record there
        TimeAnswer(-1, 2000, found_ms=2000, before_ms=None),
    ],
)
def test_answers_the_records_contradict_are_not_believed(answer):
    assert not time_offsets_believable([TimeAnswer(1, 1000, 1000, 5), answer], 1000)
