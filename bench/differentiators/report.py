"""The differentiators' block of bench/RESULTS.md: one table of figure, value, target
and whether it is met, resume's rows among them, and the answers not resumed byte-exact."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench import fault_scenarios
from bench.differentiators import cancel_latency, eta, retraction
from bench.differentiators.cancel_latency import CancelLatencyStats
from bench.differentiators.eta import EtaStats
from bench.differentiators.resume import TABLE_HEAD, ResumeStats
from bench.differentiators.retraction import RetractionStats

BEGIN = "<!-- written by python -m bench differentiators: begin -->"
END = "<!-- written by python -m bench differentiators: end -->"


@dataclass
class DifferentiatorsRun:
    command: str
    host: dict[str, str]
    eta: EtaStats
    retraction: RetractionStats
    cancel: CancelLatencyStats
    resume: ResumeStats
    duration_s: float = 0.0


Row = tuple[str, str, str, str]


def _value(x: float, unit: str = "", scale: float = 1.0) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x * scale:.0f} {unit}".rstrip()


def _pair(a: float, b: float, unit: str = "") -> str:
    return f"{_value(a, unit)} / {_value(b, unit)}"


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def eta_rows(stats: EtaStats) -> list[Row]:
    head = _value(stats.error_at(50, head=True), "%", 100)
    behind = _value(stats.error_at(50, head=False), "%", 100)
    p50 = (
        f"queue ETA error p50 ({len(stats.errors)} queued requests, positions up to "
        f"{stats.max_position()}; p50 at positions 1–{stats.slots}: {head}, behind: {behind})"
    )
    target = f"≤ {eta.TARGET * 100:.0f} %"
    return [
        (p50, _value(stats.error_at(50), "%", 100), target, _met(stats.met)),
        ("queue ETA error p90", _value(stats.error_at(90), "%", 100), "", ""),
    ]


def retraction_rows(stats: RetractionStats) -> list[Row]:
    p50 = f"retraction latency p50 ({len(stats.retractions)} of {stats.offered} retracted)"
    target = f"≤ {retraction.TARGET_P99_MS:.0f} ms"
    return [
        (p50, _value(stats.latency_ms(50), "ms"), "", ""),
        ("retraction latency p99", _value(stats.latency_ms(99), "ms"), target, _met(stats.met)),
        (
            "tokens shown before the retract, p50 / max",
            _pair(stats.shown(50), stats.shown(100)),
            "",
            "",
        ),
    ]


def cancel_rows(stats: CancelLatencyStats) -> list[Row]:
    p50 = (
        f"cancel latency p50, hang-up to the worker's abort ({len(stats.timings)} of "
        f"{stats.hang_ups} hang-ups)"
    )
    target = f"≤ {cancel_latency.TARGET_P99_MS:.0f} ms"
    after = _pair(stats.generated_after(50), stats.generated_after(100))
    return [
        (p50, _value(stats.latency_ms(50), "ms"), "", ""),
        ("cancel latency p99", _value(stats.latency_ms(99), "ms"), target, _met(stats.met)),
        (
            "hang-up to the aborted end on chat.tokens, p50 / p99",
            _pair(stats.end_ms(50), stats.end_ms(99), "ms"),
            "",
            "",
        ),
        ("tokens generated after the hang-up (at most), p50 / max", after, "", ""),
        (
            "tokens generated that the client never got, p50 / max",
            _pair(stats.waste(50), stats.waste(100)),
            "",
            "",
        ),
    ]


def markdown(run: DifferentiatorsRun) -> str:
    host, b = run.host, run.eta.backlog
    notes = [f"Not resumed byte-exact: {line}\n" for line in run.resume.mismatches]
    notes += [f"Ended before its gateway died: {line}\n" for line in run.resume.not_cut]
    low, high = b.tokens
    rows = [*eta_rows(run.eta), *retraction_rows(run.retraction), *cancel_rows(run.cancel)]
    lines = [
        BEGIN,
        "## Differentiators: queue ETA, retraction, cancel, resume",
        "",
        "```sh",
        run.command,
        "```",
        "",
        f"Run {host['date']}, {host['nproc']} cores ({host['cpu']}), commit {host['commit']}, "
        f"{run.duration_s / 60:.1f} min in all. Every stage its own process on the embedded "
        f"broker (bench/fault_scenarios.py), sim engine at "
        f"{fault_scenarios.TOKENS_PER_S:g} tokens/s per answer, two workers of "
        f"{run.eta.slots // len(fault_scenarios.WORKERS)} slots each, two gateways (three "
        "for resume).",
        "",
        f"- Queue ETA: native streams of answers of {low}–{high} tokens arriving at random, "
        f"{b.warm_rate_per_s:g} a second for {b.warm_s:g} s, then {b.rate_per_s:g} a second "
        f"for {b.offer_s:g} s (more than the slots serve): the {run.eta.offered} streams of "
        "the second spell are counted; error = |eta_ms of the first `queued` event − time "
        "from that event to the first token| / that time, both on the client. "
        f"{run.eta.without_eta} first `queued` events had no ETA; {run.eta.refused} streams "
        "got no answer.",
        "- Retraction: scripted sim answers with an e-mail address (PII, retracted by "
        "default) after 4 to 27 words; from the offending chunk's record timestamp on "
        "`chat.tokens` (the retract names its seq) to the client's `retract` event.",
        "- Cancel: OpenAI-API streams hung up after 2 to 16 chunks (a hang-up there cancels "
        "at once; a native stream is held for a resume first); from the client's close to "
        "the worker's `cancel` log line, written as it calls the engine's abort. Tokens "
        "after the hang-up: usage less what `chat.tokens` had by the hang-up.",
        "- Resume: the gateways SIGKILLed in turn, each with streams mid-answer; every client "
        "resumes on another gateway with `Last-Event-ID`, and its joined answer must equal "
        "the stored answer and the sim engine's plan.",
        "",
        *TABLE_HEAD,
        *(f"| {figure} | {value} | {target} | {met} |" for figure, value, target, met in rows),
        *run.resume.lines(),
        "",
        *notes,
        END,
    ]
    return "\n".join(lines)
