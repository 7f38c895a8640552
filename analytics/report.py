"""The questions analytics answers for a period, as DuckDB queries over the views.

Each count lands in the period by its own event's time: tokens by the usage event's
`created_at` (when the attempt ended), requests and time to first token by the
request's `created_at`, cancellations by the time of the request's last end, retractions
and blocked inputs by the moderation event's `created_at`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

CANCELLED = "finished_aborted"

TOKENS = """
SELECT tier, model, org_id,
       count(DISTINCT request_id) AS requests, count(*) AS attempts,
       sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
       sum(cached_tokens) AS cached_tokens, round(sum(gpu_ms), 1) AS gpu_ms
FROM usage WHERE created_at >= $since AND created_at < $until
GROUP BY tier, model, org_id ORDER BY tier, model, org_id
"""
"""Tokens and GPU time by tier, model and org (each attempt's usage once)."""

TOTALS = """
SELECT count(DISTINCT request_id) AS requests_served, count(*) AS usage_events,
       coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
       coalesce(sum(completion_tokens), 0) AS completion_tokens,
       coalesce(sum(cached_tokens), 0) AS cached_tokens,
       round(coalesce(sum(gpu_ms), 0), 1) AS gpu_ms
FROM usage WHERE created_at >= $since AND created_at < $until
"""

REQUESTS = f"""
WITH tiers AS (SELECT request_id, any_value(tier) AS tier FROM requests GROUP BY request_id),
made AS (SELECT request_id, any_value(tier) AS tier FROM requests
         WHERE created_at >= $since AND created_at < $until GROUP BY request_id),
last_end AS (SELECT * FROM ends QUALIFY row_number() OVER (
                 PARTITION BY request_id ORDER BY attempt DESC, seq DESC) = 1),
cancelled AS (SELECT request_id, coalesce(last_end.tier, tiers.tier) AS tier
              FROM last_end LEFT JOIN tiers USING (request_id)
              WHERE status = '{CANCELLED}' AND sent_at >= $since AND sent_at < $until),
moderated AS (SELECT action, tiers.tier FROM moderation LEFT JOIN tiers USING (request_id)
              WHERE created_at >= $since AND created_at < $until),
counted AS (
    SELECT tier, 1 AS requests, 0 AS cancellations, 0 AS retractions, 0 AS blocked FROM made
    UNION ALL SELECT tier, 0, 1, 0, 0 FROM cancelled
    UNION ALL SELECT tier, 0, 0, 1, 0 FROM moderated WHERE action = 'retract'
    UNION ALL SELECT tier, 0, 0, 0, 1 FROM moderated WHERE action = 'block_input')
SELECT coalesce(tier, 'unknown') AS tier, sum(requests)::BIGINT AS requests,
       sum(cancellations)::BIGINT AS cancellations, sum(retractions)::BIGINT AS retractions,
       sum(blocked)::BIGINT AS blocked_inputs
FROM counted GROUP BY ALL ORDER BY tier
"""
"""Requests made, cancelled (their last end is `finished_aborted`: stopped, disconnected,
or cancelled while queued), retracted and blocked, by tier."""

TTFT = """
WITH made AS (SELECT request_id, any_value(tier) AS tier, min(created_at) AS created_at
              FROM requests WHERE created_at >= $since AND created_at < $until
              GROUP BY request_id),
first AS (SELECT request_id, min(sent_at) AS first_at FROM first_chunks GROUP BY request_id),
ttft AS (SELECT tier, (first_at - created_at) * 1000 AS ms FROM made JOIN first USING (request_id))
SELECT coalesce(tier, 'all') AS tier, count(*) AS requests,
       round(quantile_cont(ms, 0.5), 1) AS p50_ms, round(quantile_cont(ms, 0.9), 1) AS p90_ms,
       round(quantile_cont(ms, 0.99), 1) AS p99_ms, round(max(ms), 1) AS max_ms
FROM ttft GROUP BY GROUPING SETS ((tier), ()) HAVING count(*) > 0
ORDER BY tier IS NULL, tier
"""
"""Time to first token: from the request's `created_at` (gateway) to its first chunk's
record timestamp (worker), over requests that streamed a chunk."""

TOKENS_PER_MINUTE = """
SELECT floor(created_at / 60) * 60 AS minute, tier,
       sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens
FROM usage WHERE created_at >= $since AND created_at < $until
GROUP BY ALL ORDER BY minute, tier
"""


@dataclass(frozen=True)
class Period:
    since: float
    until: float
    """Epoch seconds; `until` excluded."""

    def params(self) -> dict[str, float]:
        return {"since": self.since, "until": self.until}


def _rows(con: duckdb.DuckDBPyConnection, sql: str, period: Period) -> list[dict[str, Any]]:
    cursor = con.execute(sql, period.params())
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def report(con: duckdb.DuckDBPyConnection, period: Period) -> dict[str, Any]:
    """Every answer for `period`, JSON-ready."""
    [totals] = _rows(con, TOTALS, period)
    by_tier = _rows(con, REQUESTS, period)
    totals.update(
        {
            name: sum(row[name] for row in by_tier)
            for name in ("requests", "cancellations", "retractions", "blocked_inputs")
        }
    )
    per_minute = [
        {**row, "minute": iso_time(row["minute"])} for row in _rows(con, TOKENS_PER_MINUTE, period)
    ]
    return {
        "since": iso_time(period.since),
        "until": iso_time(period.until),
        "totals": totals,
        "tokens": _rows(con, TOKENS, period),
        "requests": by_tier,
        "ttft_ms": _rows(con, TTFT, period),
        "tokens_per_minute": per_minute,
    }


def iso_time(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")


def render(answer: dict[str, Any]) -> str:
    """The report as plain-text tables."""
    totals = answer["totals"]
    lines = [
        f"chatpipe analytics {answer['since']} .. {answer['until']}",
        "totals: " + ", ".join(f"{name} {value}" for name, value in totals.items()),
        "",
    ]
    for title, key in (
        ("tokens by tier, model and org", "tokens"),
        ("requests by tier", "requests"),
        ("time to first token", "ttft_ms"),
    ):
        lines += [title, *text_table(answer[key]), ""]
    return "\n".join(lines).rstrip() + "\n"


def text_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    header = list(rows[0])
    cells = [
        header,
        *[["" if row[name] is None else str(row[name]) for name in header] for row in rows],
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in cells
    ]


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _every_minute(minutes: Iterable[str]) -> list[str]:
    """Every minute from the first to the last of `minutes` (ISO), none missing."""
    moments = sorted({datetime.fromisoformat(minute) for minute in minutes})
    if not moments:
        return []
    count = int((moments[-1] - moments[0]).total_seconds() // 60) + 1
    return [iso_time(moments[0].timestamp() + 60 * n) for n in range(count)]


def plot_tokens_per_minute(answer: dict[str, Any], path: Path) -> None:
    """A PNG of generated tokens per minute, one line per tier."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'chatpipe[plot]'") from exc
    tokens: dict[str, dict[str, int]] = {}
    for row in answer["tokens_per_minute"]:
        tokens.setdefault(row["tier"], {})[row["minute"]] = row["completion_tokens"]
    minutes = _every_minute(row["minute"] for row in answer["tokens_per_minute"])
    figure, axes = plt.subplots(figsize=(9, 4.5))
    for tier, per_minute in sorted(tokens.items()):
        axes.plot(
            matplotlib.dates.date2num([datetime.fromisoformat(m) for m in minutes]),
            [per_minute.get(m, 0) for m in minutes],
            marker="o",
            label=tier,
        )
    if tokens:
        axes.legend(title="tier")
    else:
        axes.text(0.5, 0.5, "no usage in this period", ha="center", transform=axes.transAxes)
    axes.set_title(f"Generated tokens per minute, {answer['since']} .. {answer['until']}")
    axes.set_xlabel("minute (UTC)")
    axes.set_ylim(bottom=0)
    if minutes:  # a single point would otherwise span years of minute ticks
        axes.set_xlim(
            matplotlib.dates.date2num(datetime.fromisoformat(minutes[0]) - timedelta(seconds=30)),
            matplotlib.dates.date2num(datetime.fromisoformat(minutes[-1]) + timedelta(seconds=30)),
        )
    axes.xaxis.set_major_locator(
        matplotlib.dates.MinuteLocator(interval=max(1, -(-len(minutes) // 10)), tz=UTC)
    )
    axes.xaxis.set_major_formatter(
        matplotlib.dates.DateFormatter(
            "%H:%M" if len(minutes) <= 24 * 60 else "%m-%d %H:%M", tz=UTC
        )
    )
    axes.set_ylabel("completion tokens")
    figure.autofmt_xdate()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    plt.close(figure)
