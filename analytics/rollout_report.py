"""The versions of each model alias side by side (`chatpipe rollout report`), as DuckDB
queries over the analytics views (`analytics.warehouse`).

A request counts for the version the gateway picked (its `model`, with its `alias`)
when its `created_at` is in the period; its first chunk, usage and retraction count
with it. A regeneration is a request for a message (`parent_id`) that an earlier
request already answered. Feedback counts by its own `created_at`, for the version that
wrote the rated answer.
"""

from __future__ import annotations

from typing import Any

import duckdb

from analytics.report import Period, iso_time, text_table

BY_VERSION = """
WITH made AS (
    SELECT request_id, any_value(alias) AS alias, any_value(model) AS version,
           any_value(conversation_id) AS conversation_id, any_value(parent_id) AS parent_id,
           min(created_at) AS created_at
    FROM requests
    WHERE alias IS NOT NULL AND ($alias IS NULL OR alias = $alias)
      AND created_at >= $since AND created_at < $until
    GROUP BY request_id),
answered_first AS (SELECT conversation_id, parent_id, min(created_at) AS first_at
                   FROM requests WHERE parent_id IS NOT NULL GROUP BY ALL),
first AS (SELECT request_id, min(sent_at) AS first_at FROM first_chunks GROUP BY request_id),
used AS (SELECT request_id, sum(completion_tokens) AS tokens, sum(gpu_ms) AS gpu_ms
         FROM usage GROUP BY request_id),
retracted AS (SELECT DISTINCT request_id FROM moderation WHERE action = 'retract')
SELECT made.alias, made.version, count(*) AS requests,
       round(quantile_cont((first.first_at - made.created_at) * 1000, 0.5), 1) AS ttft_p50_ms,
       round(quantile_cont((first.first_at - made.created_at) * 1000, 0.9), 1) AS ttft_p90_ms,
       round(sum(used.tokens) / nullif(sum(used.gpu_ms), 0) * 1000, 1) AS tokens_per_s,
       count(retracted.request_id) AS retractions,
       count(*) FILTER (WHERE made.created_at > answered_first.first_at) AS regenerations
FROM made
LEFT JOIN first USING (request_id)
LEFT JOIN used USING (request_id)
LEFT JOIN retracted USING (request_id)
LEFT JOIN answered_first ON answered_first.conversation_id = made.conversation_id
                        AND answered_first.parent_id = made.parent_id
GROUP BY ALL ORDER BY ALL
"""
"""Per (alias, version): requests, time to first token (from the request's `created_at`
at the gateway to its first chunk's record time), completion tokens per second of
engine time (usage's `gpu_ms`), retracted answers and regenerations."""

FEEDBACK = """
SELECT alias, model AS version, count(*) FILTER (WHERE rating = 'up') AS feedback_up,
       count(*) FILTER (WHERE rating = 'down') AS feedback_down
FROM feedback
WHERE alias IS NOT NULL AND ($alias IS NULL OR alias = $alias)
  AND created_at >= $since AND created_at < $until
GROUP BY ALL
"""

_EMPTY = {
    "requests": 0,
    "ttft_p50_ms": None,
    "ttft_p90_ms": None,
    "tokens_per_s": None,
    "retractions": 0,
    "regenerations": 0,
}


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]
          ) -> list[dict[str, Any]]:  # fmt: skip
    cursor = con.execute(sql, params)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def versions(con: duckdb.DuckDBPyConnection, period: Period, alias: str | None = None
             ) -> list[dict[str, Any]]:  # fmt: skip
    """One row per (alias, version) seen in `period` (of `alias` only, if given)."""
    params = {**period.params(), "alias": alias}
    rows = {
        (row["alias"], row["version"]): {**row, "feedback_up": 0, "feedback_down": 0}
        for row in _rows(con, BY_VERSION, params)
    }
    for rated in _rows(con, FEEDBACK, params):
        key = (rated["alias"], rated["version"])
        row = rows.setdefault(key, {"alias": key[0], "version": key[1], **_EMPTY})
        row.update(feedback_up=rated["feedback_up"], feedback_down=rated["feedback_down"])
    return [rows[key] for key in sorted(rows)]


def rollout_report(con: duckdb.DuckDBPyConnection, period: Period, alias: str | None = None
                   ) -> dict[str, Any]:  # fmt: skip
    """The comparison for `period`, JSON-ready."""
    return {
        "since": iso_time(period.since),
        "until": iso_time(period.until),
        "alias": alias,
        "versions": versions(con, period, alias),
    }


def render(answer: dict[str, Any]) -> str:
    """The comparison as a plain-text table."""
    title = (
        f"chatpipe rollout {answer['alias'] or 'every alias'} "
        f"{answer['since']} .. {answer['until']}"
    )
    return "\n".join([title, *text_table(answer["versions"])]) + "\n"
