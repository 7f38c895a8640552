"""RESULTS.md, results.json and the plots of one benchmark run."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bench import plots
from bench.capacity import CapacityRun, idle_cores
from bench.compare import CHATPIPE, VLLM, VLLM_SAME_ARGS, SideRun, Workload
from bench.hops import END_HOPS, FIRST_TOKEN_FETCHES, HOPS, KAFKA_HOPS
from bench.processes import EngineConfig, chatpipe_engine_args, vllm_server_argv

TTFT_MARGIN_MS = 15.0
THROUGHPUT_RATIO = 0.95
ITL_RATIO = 1.1
BASELINES = {VLLM: "vLLM at its defaults", VLLM_SAME_ARGS: "vLLM with chatpipe's engine args"}


@dataclass
class BenchRun:
    command: str
    date: str
    machine: dict[str, str]
    engine: EngineConfig
    workload: Workload
    sides: list[SideRun] = field(default_factory=list)
    capacity: CapacityRun | None = None
    duration_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    chatpipe_engine: str = "vllm"
    """The engine of the chatpipe side: `vllm`, or `sim` (no vLLM anywhere)."""

    def side(self, name: str) -> SideRun | None:
        return next((s for s in self.sides if s.name == name), None)


def machine() -> dict[str, str]:
    """What `date`, `nproc` and `free -g` say, plus the CPU and the load."""

    def sh(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip()

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "date": sh("date"),
        "nproc": sh("nproc"),
        "free_g": sh("free", "-g"),
        "cpu": cpu,
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "commit": sh("git", "rev-parse", "--short", "HEAD"),
    }


def write(run: BenchRun, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    vs_vllm = run.sides
    if vs_vllm:
        plots.throughput(vs_vllm, out_dir / "throughput.png")
        plots.latency(vs_vllm, out_dir / "latency.png")
    if run.capacity is not None and run.capacity.levels:
        plots.capacity(run.capacity, out_dir / "capacity.png")
    (out_dir / "results.json").write_text(json.dumps(_plain(run), indent=1, default=str))
    path = out_dir / "RESULTS.md"
    path.write_text(_merged(path, markdown(run)))
    return path


BEGIN, END = (
    "<!-- written by python -m bench: begin -->",
    "<!-- written by python -m bench: end -->",
)


def _merged(path: Path, report: str) -> str:
    """The run's report in place of the last one; what other benchmarks recorded in the
    same file (after the end marker) stays."""
    block = f"{BEGIN}\n{report.rstrip()}\n{END}\n"
    old = path.read_text() if path.exists() else ""
    if BEGIN not in old or END not in old:
        return block
    head, rest = old.split(BEGIN, 1)
    tail = rest.split(END, 1)[1].lstrip("\n")
    return head + block + ("\n" + tail if tail else "")


def _plain(run: BenchRun) -> dict:
    data = dataclasses.asdict(run)
    for side in data["sides"]:
        for level in side["levels"]:
            level.pop("samples")  # raw samples are in the plots, not the JSON
    return data


def markdown(run: BenchRun) -> str:
    parts = [
        "# Benchmarks: chatpipe side by side with vLLM's OpenAI server\n",
        f"Run on {run.machine['date']} ({run.duration_s / 60:.1f} min), commit "
        f"`{run.machine['commit']}` plus the working tree. Regenerate with:\n",
        f"```sh\n{run.command}\n```\n",
        _machine(run),
        _engine(run),
    ]
    if run.failures:
        parts.append("## Failed phases\n\n" + "".join(f"- {f}\n" for f in run.failures))
    if run.sides:
        parts += [_targets(run), _comparison(run), _hops(run), _cpu(run), _cancel(run)]
    if run.capacity is not None:
        parts.append(_capacity(run.capacity))
    parts.append(METHOD)
    return "\n".join(parts)


def _machine(run: BenchRun) -> str:
    m = run.machine
    return (
        f"## Machine\n\n- CPU: {m['cpu']}, `nproc` = {m['nproc']}, no GPU\n"
        f"- load average at start: {m['loadavg']}\n- `free -g`:\n\n```\n{m['free_g']}\n```\n"
    )


def _engine(run: BenchRun) -> str:
    e, w = run.engine, run.workload
    lines = [
        "## Sides, engine and workload\n",
        f"- model `{e.model.name}`, served as `{e.model_name}`",
    ]
    lines += [
        f"- **{side.name}**: {_described(run, side.name)}"
        for side in run.sides
        if side.name in (VLLM, CHATPIPE, VLLM_SAME_ARGS)
    ]
    lines.append(
        f"- streaming `POST /v1/chat/completions`, {w.max_tokens} tokens per answer "
        "(`ignore_eos`), temperature 1, 8 fixed prompts in turn, "
        f"closed loop at concurrency {', '.join(map(str, w.levels))}, "
        f"{w.rounds} requests per client per level (at least {w.min_requests}); "
        f"first one warm-up round at every level ({w.warmup_tokens}-token answers), then "
        f"each level {w.runs} time(s), the run with the most tokens/s kept (same rule on every "
        "side); rate limits lifted on chatpipe, and a refused request counts as not done"
    )
    lines += [
        f"- {side.name}: launch to ready (`/health`, or the 'chatpipe is up' line) "
        f"{side.ready_s:.0f} s"
        for side in run.sides
    ]
    return "\n".join(lines) + "\n"


def _described(run: BenchRun, side: str) -> str:
    """What a side ran (vLLM's engine args are worked out only where a side runs vLLM:
    that imports vLLM, seconds a sim-only run does without)."""
    e = run.engine
    if side == VLLM:
        return (
            "vLLM's OpenAI server as `vllm serve MODEL` runs it, at its own defaults "
            "(on the CPU with chatpipe's KV cache size: vLLM's default there reserves 92 % "
            "of the memory, which must be free at start): "
            f"`{_server_command(e, same_args=False)}`"
        )
    if side == VLLM_SAME_ARGS:
        return f"vLLM's server with exactly chatpipe's engine args: `{_server_command(e, True)}`"
    up = (
        "`chatpipe up` (gateway, every stage and the engine's front end in one process, "
        "the embedded broker beside it)"
    )
    if run.chatpipe_engine == "sim":
        return f"{up} with the sim engine (no vLLM)"
    chatpipe = (
        f"`CHATPIPE_VLLM_ARGS='{json.dumps(e.vllm_args)}'`"
        if e.vllm_args
        else "its default engine args"
    )
    args = json.dumps(chatpipe_engine_args(e), default=str)
    return (
        f"{up} with {chatpipe}; the engine args its vLLM engine passes beyond the model: `{args}`"
    )


def _server_command(cfg: EngineConfig, same_args: bool) -> str:
    argv = vllm_server_argv(cfg, 0, "KEY", same_args)[1:]
    return "python " + shlex.join(argv).replace("--port 0", "--port PORT")


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{a / b:.2f}"


def _targets(run: BenchRun) -> str:
    cp = run.side(CHATPIPE)
    if cp is None:
        return ""
    rows = ["## Targets\n", "| target | measured | met |", "|---|---|---|"]
    done = sum(lv.stats.completed for lv in cp.levels)
    asked = sum(lv.stats.requests for lv in cp.levels)
    rows.append(
        f"| every chatpipe request completed (a refusal is a failure) | {done}/{asked} | "
        f"{'yes' if done == asked else 'no'} |"
    )
    for name, label in BASELINES.items():
        base = run.side(name)
        if base is None:
            continue
        for lv in cp.levels:
            other = base.level(lv.stats.concurrency)
            if other is None:
                continue
            a, b, c = lv.stats, other.stats, lv.stats.concurrency
            ratio = a.tokens_per_s / b.tokens_per_s if b.tokens_per_s else float("nan")
            rows.append(
                f"| tokens/s at c={c} ≥ {THROUGHPUT_RATIO}× {label} | {ratio:.2f}× | "
                f"{_met(ratio >= THROUGHPUT_RATIO)} |"
            )
            if b.itl_ms[0] > 0:
                itl = a.itl_ms[0] / b.itl_ms[0]
                rows.append(
                    f"| ITL p50 at c={c} ≤ {ITL_RATIO}× {label} | {itl:.2f}× | "
                    f"{_met(itl <= ITL_RATIO)} |"
                )
            else:  # most of its chunks reached the client in one read with the one before
                rows.append(
                    f"| ITL p50 at c={c} ≤ {ITL_RATIO}× {label} | n/a ({label}: "
                    f"{_fmt(b.itl_ms[0], 1)} ms) | n/a |"
                )
        a1, b1 = cp.level(1), base.level(1)
        if a1 and b1:
            delta = a1.stats.ttft_ms[0] - b1.stats.ttft_ms[0]
            rows.append(
                f"| TTFT p50 at c=1 ≤ {label} + {TTFT_MARGIN_MS:g} ms | "
                f"{delta:+.0f} ms | {_met(delta <= TTFT_MARGIN_MS)} |"
            )
    cancel = cp.cancel
    if cancel and cancel.generated_after_median is not None and cancel.interval_tokens is not None:
        met = cancel.generated_after_median <= cancel.interval_tokens
        rows.append(
            f"| cancellation waste (tokens generated after the hang-up, median) ≤ one "
            f"coalescing interval of tokens | {cancel.generated_after_median:.1f} tokens "
            f"(max {cancel.generated_after_max:.0f}) vs {cancel.interval_tokens:.1f} | "
            f"{_met(met)} |"
        )
    return "\n".join(rows) + "\n"


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def _comparison(run: BenchRun) -> str:
    cp = run.side(CHATPIPE)
    lines = [
        "## Latency and throughput\n",
        "Latencies in ms (p50 / p99). ITL is per token (chunk gap ÷ tokens in the chunk, "
        "one sample per token); TPOT is per request (first to last chunk ÷ tokens after "
        "the first chunk); the chunk gap is the pause a reader sees.\n",
        "| c | side | done | tokens/s | TTFT | ITL per token | TPOT | chunk gap | tokens/chunk |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for side in run.sides:
        for lv in side.levels:
            s = lv.stats
            lines.append(
                f"| {s.concurrency} | {side.name} | {s.completed}/{s.requests} | "
                f"{s.tokens_per_s:.0f} | {_fmt(s.ttft_ms[0])} / {_fmt(s.ttft_ms[1])} | "
                f"{_fmt(s.itl_ms[0], 1)} / {_fmt(s.itl_ms[1], 1)} | "
                f"{_fmt(s.tpot_ms[0], 1)} / {_fmt(s.tpot_ms[1], 1)} | "
                f"{_fmt(s.chunk_gap_ms[0], 1)} / {_fmt(s.chunk_gap_ms[1], 1)} | "
                f"{_fmt(s.tokens_per_chunk, 1)} |"
            )
    for name, label in BASELINES.items():
        vllm = run.side(name)
        if vllm is None or cp is None:
            continue
        lines += [
            "",
            f"Ratios chatpipe / {label}:\n",
            "| c | tokens/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | TPOT p50 |",
            "|---|---|---|---|---|---|---|",
        ]
        for lv in cp.levels:
            base = vllm.level(lv.stats.concurrency)
            if base is None:
                continue
            a, b = lv.stats, base.stats
            lines.append(
                f"| {a.concurrency} | {_ratio(a.tokens_per_s, b.tokens_per_s)} | "
                f"{_ratio(a.ttft_ms[0], b.ttft_ms[0])} | "
                f"{_ratio(a.ttft_ms[1], b.ttft_ms[1])} | "
                f"{_ratio(a.itl_ms[0], b.itl_ms[0])} | {_ratio(a.itl_ms[1], b.itl_ms[1])} "
                f"| {_ratio(a.tpot_ms[0], b.tpot_ms[0])} |"
            )
    lines.append("\n![throughput](throughput.png)\n\n![latency](latency.png)\n")
    return "\n".join(lines)


def _hops(run: BenchRun) -> str:
    side = run.side(CHATPIPE)
    if side is None or not any(lv.ttft_hops for lv in side.levels):
        return ""
    lines = [
        "## Where chatpipe's time goes\n",
        "p50 / p90 ms per hop, from the Kafka record timestamps of each request's "
        "first event on `chat.requests.*`, `chat.work`, `chat.tokens` (first chunk) and "
        "`chat.deliver.*` (first delta), and the client's send and first-chunk times. "
        "*worker + engine* holds the engine's own time to first token. The last two "
        "columns are the answer's end: the worker's Done on `chat.tokens` → safety's "
        "Done on `chat.deliver.*` → the client's `[DONE]`.\n",
        "| c | " + " | ".join((*HOPS, *END_HOPS)) + " | TTFT p50 |",
        "|---|" + "---|" * (len(HOPS) + len(END_HOPS) + 1),
    ]
    for lv in side.levels:
        if lv.ttft_hops:
            cells = [
                f"{_fmt(lv.ttft_hops[h][0])} / {_fmt(lv.ttft_hops[h][1])}"
                for h in (*HOPS, *END_HOPS)
            ]
            lines.append(
                f"| {lv.stats.concurrency} | "
                + " | ".join(cells)
                + f" | {_fmt(lv.stats.ttft_ms[0])} |"
            )
    if side.fetch_delay_ms is not None:
        p50, p90 = side.fetch_delay_ms
        lines.append(
            f"\nThe embedded broker's floor: on the same broker, a record waits {p50:.1f} ms "
            f"(p50; p90 {p90:.1f} ms) between a producer's acknowledged send and a consumer's "
            "fetch returning it (`bench/fetch_timer.py` at the stages' fetch wait): Tansu "
            "answers a fetch on its timer, not when data arrives. Four records are fetched "
            "before the first token (the request by the scheduler, the assignment by the "
            "worker, the first chunk by safety, the first delta by the gateway): about "
            f"{FIRST_TOKEN_FETCHES * p50:.0f} ms of chatpipe's time to first token is this "
            "broker's timer, whatever the stages do. Apache Kafka answers a fetch as soon as "
            "a record arrives (`fetch.min.bytes` 1)."
        )
        lines.append(_floor_caps(run, side, p50))
    return "\n".join(lines) + "\n"


def _floor_caps(run: BenchRun, side: SideRun, hop_ms: float) -> str:
    """What the broker's timer alone leaves of vLLM's tokens/s: in a closed loop each client
    waits out a request's every hop before it sends the next, so a request that takes
    `t` on vLLM's server takes at least `t` + KAFKA_HOPS × `hop_ms` through chatpipe."""
    base = run.side(VLLM)
    if base is None:
        return ""
    lines = [
        f"\nWhat that floor alone leaves of vLLM's tokens/s in this closed loop: a "
        f"request waits for {KAFKA_HOPS} fetches on this broker (four before its first "
        "token; two after its last: the worker's Done by safety, safety's by the "
        "gateway), so a client whose request takes *t* on vLLM's server (at its "
        f"defaults) waits *t* + {KAFKA_HOPS} × {hop_ms:.1f} ms through chatpipe before "
        "it sends the next, were the stages and the broker to use no CPU at all. Where "
        "the engine's step time hardly depends on how many sequences it runs (low "
        "concurrency), that caps the ratio; where it does (high concurrency), fewer "
        "sequences in the batch run faster steps and the cap is only an estimate:\n",
        "| c | request on vLLM ms | + broker floor ms | tokens/s ratio it leaves at most "
        "| measured |",
        "|---|---|---|---|---|",
    ]
    floor_ms = KAFKA_HOPS * hop_ms
    for lv in side.levels:
        other = base.level(lv.stats.concurrency)
        if other is None or not other.stats.completed:
            continue
        b = other.stats
        took_ms = b.concurrency * b.wall_s / b.completed * 1000
        measured = lv.stats.tokens_per_s / b.tokens_per_s if b.tokens_per_s else float("nan")
        lines.append(
            f"| {b.concurrency} | {took_ms:.0f} | {floor_ms:.0f} | "
            f"{took_ms / (took_ms + floor_ms):.2f}× | {measured:.2f}× |"
        )
    return "\n".join(lines)


def _cpu(run: BenchRun) -> str:
    lines = [
        "## CPU per 1,000 delivered tokens\n",
        "CPU seconds by process tree member. `chatpipe-up` is one process holding the "
        "gateway, every stage and vLLM's AsyncLLM front end; `VLLM::*` are the engine's "
        "own processes. `foreign` is CPU used on the machine by anything else during the "
        "level (other work on a shared machine), in cores; a level measured while other "
        "processes used more than 0.3 cores is measured once more and the quieter try "
        "kept (`tries`).\n",
        "| c | side | process: CPU s / 1k tokens | all under test | client | "
        "foreign cores | tries |",
        "|---|---|---|---|---|---|---|",
    ]
    for side in run.sides:
        for lv in side.levels:
            per_k = 1000 / lv.stats.tokens if lv.stats.tokens else float("nan")
            procs = ", ".join(
                f"{name} {seconds * per_k:.2f}"
                for name, seconds in sorted(lv.cpu.by_process.items())
            )
            lines.append(
                f"| {lv.stats.concurrency} | {side.name} | {procs} | "
                f"{lv.cpu.tested * per_k:.2f} | {lv.cpu.client * per_k:.2f} | "
                f"{lv.cpu.cores(lv.cpu.foreign):.2f} | "
                f"{lv.tries} |"
            )
    return "\n".join(lines) + "\n"


def _cancel(run: BenchRun) -> str:
    lines = [
        "## Cancellation waste\n",
        "Clients hang up after 2, 4, 8 or 16 content chunks "
        f"({run.workload.disconnect_concurrency} at a time, answers of "
        f"{run.workload.disconnect_max_tokens} tokens). *Generated after* = tokens the "
        "engine made after the hang-up (usage − tokens published by then − what the "
        "stream's rate made since its last publish, at most one interval): the waste "
        "the target is about. *Not received* = usage − tokens the client received, "
        "split into *in flight* (already on `chat.tokens` at the hang-up: delivery "
        "latency, generated before it) and *after* (published after the hang-up or "
        "never: an upper bound of *generated after*).\n",
        "| side | disconnects | measured | generated after: median | max | "
        "not received: median | max | mean | in flight | after | "
        "one coalescing interval (tokens) | Cancel published | hang-up → Cancel ms | "
        "usage says aborted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in run.sides:
        c = side.cancel
        if c is None:
            continue
        lines.append(
            f"| {side.name} | {c.disconnects} | {c.measured} | "
            f"{_fmt(c.generated_after_median, 1)} | {_fmt(c.generated_after_max, 1)} | "
            f"{_fmt(c.waste_median, 1)} "
            f"| {_fmt(c.waste_max)} | {_fmt(c.waste_mean, 1)} | "
            f"{_fmt(c.in_flight_median, 1)} | {_fmt(c.after_median, 1)} | "
            f"{_fmt(c.interval_tokens, 1)} | {c.cancels_sent} | "
            f"{_fmt(c.cancel_ms_median, 1)} | {c.aborted} |"
        )
    return "\n".join(lines) + "\n"


def _capacity(cap: CapacityRun) -> str:
    plan = cap.plan
    lines = [
        "## Pipeline capacity (sim engine, one process per stage)\n",
        f"Each stream gets {plan.tokens_per_s:g} tokens/s for {plan.hold_s:g} s "
        f"({plan.max_tokens} tokens), streams opened over {plan.ramp_s:g} s; coalescing "
        f"{plan.coalesce_ms:g} ms. A level holds when all streams complete, the slowest tenth "
        "still get ≥ 90% of the set rate and TTFT p99 < 1 s. "
        f"**The whole pipeline held {cap.max_held} concurrent streams.**\n",
        "Tokens/s and SSE events/s are counted while every stream of the level was "
        "streaming (steady state); offered = streams × rate.\n",
        _capacity_targets(cap),
        "| streams | done | offered tokens/s | delivered tokens/s | SSE events/s | "
        "TTFT p50 / p99 ms | chunk gap p99 ms | slowest-10% stream tok/s | holds | "
        "foreign cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in cap.levels:
        lines.append(
            f"| {lv.streams} | {lv.completed} | {lv.streams * plan.tokens_per_s:.0f} | "
            f"{_fmt(lv.tokens_per_s)} | {_fmt(lv.events_per_s)} | "
            f"{_fmt(lv.ttft_ms[0])} / {_fmt(lv.ttft_ms[1])} | "
            f"{_fmt(lv.chunk_gap_p99_ms)} | {_fmt(lv.stream_rate_p10, 1)} | "
            f"{'yes' if lv.holds else 'no'} | {lv.cpu.cores(lv.cpu.foreign):.2f} |"
        )
    names = sorted({n for lv in cap.levels for n in lv.cpu.by_process})
    lines += [
        "",
        "CPU seconds per 1,000 delivered tokens, per stage:\n",
        "| streams | " + " | ".join(names) + " | all stages + broker | client |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for lv in cap.levels:
        cells = [f"{lv.cpu_per_1k_tokens(lv.cpu.by_process.get(n, 0.0)):.3f}" for n in names]
        lines.append(
            f"| {lv.streams} | "
            + " | ".join(cells)
            + f" | {lv.cpu_per_1k_tokens(lv.cpu.tested):.3f} | "
            f"{lv.cpu_per_1k_tokens(lv.cpu.client):.3f} |"
        )
    if cap.idle is not None:
        idle = cap.idle
        lines += [
            "",
            f"The stack with no traffic ({idle.wall_s:.0f} s, once its consumers "
            f"backed off), cores per process: {idle_cores(idle)} (other processes "
            f"meanwhile: {idle.cores(idle.foreign):.2f}).",
        ]
    if cap.ttft_c1_ms is not None:
        lines.append(
            f"\nThe first request after that idle spell: TTFT "
            f"{_fmt(cap.ttft_after_idle_ms)} ms; then one at a time p50 / p90 "
            f"{cap.ttft_c1_ms[0]:.0f} / {cap.ttft_c1_ms[1]:.0f} ms (each idle "
            "consumer's in-flight fetch waits out its long wait once per hop)."
        )
    lines.append("\n![capacity](capacity.png)\n")
    return "\n".join(lines)


PIPELINE_CPU_AT_100 = 0.35
IDLE_CORES = 0.05
STREAMS_HELD = 300


def _capacity_targets(cap: CapacityRun) -> str:
    rows = ["| target | measured | met |", "|---|---|---|"]
    at_100 = next((lv for lv in cap.levels if lv.streams == 100), None)
    if at_100 is not None:
        per_1k = at_100.cpu_per_1k_tokens(at_100.cpu.tested)
        rows.append(
            f"| CPU per 1,000 delivered tokens, all stages + broker, 100 streams ≤ "
            f"{PIPELINE_CPU_AT_100} s | {per_1k:.3f} s | "
            f"{_met(per_1k <= PIPELINE_CPU_AT_100)} |"
        )
    if cap.idle is not None:
        cores = cap.idle.cores(cap.idle.tested)
        rows.append(
            f"| idle stack ≤ {IDLE_CORES} cores | {cores:.3f} | {_met(cores <= IDLE_CORES)} |"
        )
    rows.append(
        f"| concurrent streams held ≥ {STREAMS_HELD} | {cap.max_held} | "
        f"{_met(cap.max_held >= STREAMS_HELD)} |"
    )
    return "\n".join(rows) + "\n"


METHOD = """## How it is measured

- One command starts vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`,
  what `vllm serve` runs) at its own defaults, drives it, stops it; then starts `chatpipe up`
  (on a Tansu broker the harness starts, so it can read `chat.tokens` and `chat.usage`) with
  the same model and drives it the same way; then vLLM's server again with exactly the engine
  args chatpipe's engine ran with. Never two at once.
- One client for both (`bench/sse_client.py`): a small asyncio HTTP/1.0 SSE reader, cheap per
  event, stamping each event with the time its read returned. Rate limits and load shedding
  are lifted on the chatpipe side (policy, not capacity).
- TTFT: request sent → first chunk with content. Delivered tokens/s: completion tokens of
  completed requests ÷ wall time of the level.
- ITL per token: for each content chunk after the first, chunk gap ÷ tokens in the chunk,
  counted once per token. Tokens per chunk are exact: vLLM reports cumulative completion
  tokens on every chunk (`stream_options.continuous_usage_stats`, which chatpipe ignores);
  for chatpipe they are the `token_count`s of the request's chunks on `chat.tokens`
  (a chunk whose text is empty reaches no client; its tokens count with the next one).
- Cancellation waste (chatpipe): completion tokens of the request's usage event on
  `chat.usage` − tokens of the chunks the client had received. One coalescing interval of
  tokens = the median stream's received token rate × the coalescing interval.
- Capacity: broker + every stage (`chatpipe gateway|scheduler|worker|safety|recorder|billing`)
  as separate processes; per-process CPU from /proc (psutil) before and after each level.
- The machine may be shared: `foreign cores` is CPU used by other processes meanwhile.
"""
