"""`python -m bench gateway`: how many concurrent streams ONE gateway process holds.

    .venv/bin/python -m bench gateway --levels 250,500,1000,2000,3000,4000

Only the gateway is under test. The embedded broker, one `chatpipe gateway` process
(rate limits, budgets and shedding lifted: policy, not capacity; titles off), a
feeder process in place of scheduler, workers and safety, and reader processes:

* the feeder reads the gateway's requests on `chat.requests.*` and, for each, sends
  what the safety stage would to the request's `reply_to` topic (keyed by
  conversation): `delta` events of `tokens_per_chunk` words every `chunk_ms`, the
  first at once, then `done`. One heap of due streams, one batch per partition and
  tick, so thousands of streams cost the feeder little;
* readers (`--readers` processes) open the streams over a ramp, each one through the
  native API as a user would (create a conversation, post a message, read the SSE
  answer), so the gateway also stores each answer before it shows its end.

A level holds when every stream completes, the slowest stream still reads at least
`MIN_STREAM_RATE` tokens/s and the slowest tenth at least 90 % of the fed rate, and
the p99 gap between deltas stays under `MAX_GAP_P99_MS`. Levels grow until one does
not hold; `--py-spy DIR` records the gateway's stacks during each level's steady part.
The feeder and the readers are in `bench.gateway_load`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import subprocess
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
import psutil

from bench.gateway_load import API_KEY
from bench.processes import (
    CHATPIPE,
    PYTHON,
    Service,
    broker_ready,
    chatpipe_env,
    child_env,
    free_port,
    http_ok,
    start_broker,
    start_stage,
    wait_until,
)

log = logging.getLogger("bench")

MIN_STREAM_RATE = 10.0
MAX_GAP_P99_MS = 500.0
BEGIN = "<!-- written by python -m bench gateway: begin -->"
END = "<!-- written by python -m bench gateway: end -->"


@dataclass(frozen=True)
class GatewayPlan:
    levels: tuple[int, ...] = (250, 500, 1000, 2000, 3000, 4000)
    tokens_per_s: float = 20.0
    """Fed per stream."""
    chunk_ms: float = 100.0
    """One delta per stream this often (the worker's coalescing interval)."""
    ramp_per_s: float = 100.0
    """Streams opened per second."""
    steady_s: float = 20.0
    """How long every stream of a level is open at once."""
    readers: int = 2
    profile_dir: Path | None = None
    settings: dict[str, str] = field(default_factory=dict)
    """chatpipe settings for the gateway (`--set NAME=VALUE`)."""

    @property
    def tokens_per_chunk(self) -> int:
        return max(1, round(self.tokens_per_s * self.chunk_ms / 1000))

    def ramp_s(self, streams: int) -> float:
        return streams / self.ramp_per_s

    def max_tokens(self, streams: int) -> int:
        return math.ceil((self.ramp_s(streams) + self.steady_s) * self.tokens_per_s)


@dataclass
class GatewayLevel:
    streams: int
    completed: int
    tokens_per_s: float
    events_per_s: float
    gap_ms: tuple[float, float]
    rate_p10: float
    rate_min: float
    ttft_ms: tuple[float, float]
    cores: dict[str, float]
    """CPU cores over the level: gateway, feeder, readers, broker, other."""
    steady_cores: dict[str, float]
    """CPU cores while every stream was open (the level's middle): gateway, feeder, broker."""
    gateway_rss_mb: float
    feeder_late_ms: float
    """The feeder's worst lateness against its own schedule (its own load)."""
    holds: bool
    errors: list[str] = field(default_factory=list)


# --- the run --------------------------------------------------------------------------


async def run(plan: GatewayPlan, work: Path) -> list[GatewayLevel]:
    """Each level on a fresh broker and gateway: the embedded broker keeps every record
    (retention is never applied), and a level should not pay for the ones before it."""
    levels: list[GatewayLevel] = []
    for streams in plan.levels:
        level = await _fresh_level(plan, streams, work / f"level-{streams}")
        levels.append(level)
        log.info("gateway %d streams: %s", streams, level)
        if not level.holds:
            break
    return levels


async def _fresh_level(plan: GatewayPlan, streams: int, work: Path) -> GatewayLevel:
    broker, bootstrap = start_broker(work)
    services: list[Service] = [broker]
    try:
        await broker_ready(broker, bootstrap)
        port = free_port()
        env = chatpipe_env(
            API_KEY,
            work,
            bootstrap,
            auto_titles=False,
            max_model_len=1 << 20,
            max_tokens_limit=1 << 20,
            port=port,
            **plan.settings,
        )
        await asyncio.to_thread(
            subprocess.run,
            [CHATPIPE, "topics", "create"],
            env=child_env(env),
            check=True,
            capture_output=True,
            timeout=60,
        )
        feeder = Service(
            "feeder",
            [
                PYTHON,
                "-m",
                "bench.gateway_load",
                "feed",
                bootstrap,
                str(plan.tokens_per_s),
                str(plan.chunk_ms),
            ],
            work / "feeder.log",
        )
        gateway = start_stage("gateway", env, work)
        services += [feeder, gateway]
        await wait_until(lambda: http_ok(port, "/healthz"), gateway, 240, "/healthz")
        warm = await _read(plan, port, 8, 2, work / "warm-up", services)
        if warm["completed"] != 8:
            raise RuntimeError(f"warm-up streams failed: {warm['errors'][:3]}")
        return await _level(plan, port, streams, work, services)
    finally:
        for service in reversed(services):
            service.stop()


async def _level(
    plan: GatewayPlan, port: int, streams: int, work: Path, services: list[Service]
) -> GatewayLevel:
    _, feeder, gateway = services
    before = {s.name: sum(s.cpu_by_process().values()) for s in services}
    busy_before = _machine_busy()
    started = time.time()
    rss = _RssPeak(gateway.pid)
    sampler = asyncio.create_task(rss.sample())
    spy = asyncio.create_task(_py_spy(plan, gateway.pid, streams))
    steady = asyncio.create_task(_steady_cores(plan, streams, services))
    result = await _read(plan, port, streams, plan.max_tokens(streams), work / "streams", services)
    wall = time.time() - started
    sampler.cancel()
    await asyncio.gather(spy, return_exceptions=True)
    steady_cores = steady.result() if steady.done() else {}
    steady.cancel()
    cores = {s.name: (sum(s.cpu_by_process().values()) - before[s.name]) / wall for s in services}
    cores["readers"] = result["reader_cpu_s"] / wall
    cores["other"] = max(0.0, (_machine_busy() - busy_before) / wall - sum(cores.values()))
    return _summary(
        plan,
        streams,
        result,
        cores,
        steady_cores,
        rss.peak_mb,
        _feeder_late_ms(feeder, started, time.time()),
    )


async def _steady_cores(
    plan: GatewayPlan, streams: int, services: list[Service]
) -> dict[str, float]:
    """Cores per service from 2 s after the ramp to 2 s before the first streams end."""
    await asyncio.sleep(1.0 + plan.ramp_s(streams) + 2.0)
    before = {s.name: sum(s.cpu_by_process().values()) for s in services}
    seconds = max(1.0, plan.steady_s - 4.0)
    await asyncio.sleep(seconds)
    return {s.name: (sum(s.cpu_by_process().values()) - before[s.name]) / seconds for s in services}


async def _read(
    plan: GatewayPlan, port: int, streams: int, max_tokens: int, out: Path, services: list[Service]
) -> dict:
    """Open `streams` streams over the ramp in `plan.readers` processes; merged results."""
    readers = max(1, min(plan.readers, streams))
    start_at = time.time() + 1.0
    procs = [
        Service(
            f"reader-{i}",
            [
                PYTHON,
                "-m",
                "bench.gateway_load",
                "read",
                str(port),
                str(streams),
                str(i),
                str(readers),
                str(plan.ramp_s(streams)),
                str(start_at),
                str(max_tokens),
                str(out / f"reader-{i}.json"),
            ],
            out / f"reader-{i}.log",
        )
        for i in range(readers)
    ]
    timeout = start_at - time.time() + plan.ramp_s(streams) + max_tokens / plan.tokens_per_s
    deadline = time.monotonic() + timeout * 2 + 60
    try:
        while any(p.process.poll() is None for p in procs):
            for service in services:
                service.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"readers of {streams} streams did not finish")
            await asyncio.sleep(0.5)
    finally:
        for proc in procs:
            proc.stop()
    parts = []
    for i, proc in enumerate(procs):
        path = out / f"reader-{i}.json"
        if not path.exists():
            raise RuntimeError(f"reader {i} failed:\n{proc.log_text()[-2000:]}")
        parts.append(orjson.loads(path.read_bytes()))
    return _merged(parts)


def _merged(parts: list[dict]) -> dict:
    merged: dict = {
        "streams": [],
        "gaps_ms": Counter(),
        "tokens_at": Counter(),
        "events_at": Counter(),
        "errors": [],
        "reader_cpu_s": 0.0,
    }
    for part in parts:
        merged["streams"] += part["streams"]
        merged["errors"] += part["errors"]
        merged["reader_cpu_s"] += part["cpu_s"]
        for name in ("gaps_ms", "tokens_at", "events_at"):
            merged[name].update({int(k): v for k, v in part[name].items()})
    merged["completed"] = sum(1 for s in merged["streams"] if s["completed"])
    return merged


def _summary(
    plan: GatewayPlan,
    streams: int,
    result: dict,
    cores: dict[str, float],
    steady_cores: dict[str, float],
    rss_mb: float,
    feeder_late_ms: float,
) -> GatewayLevel:
    done = [s for s in result["streams"] if s["completed"]]
    rates = sorted(s["rate"] for s in done if s["rate"] is not None)
    ttfts = sorted(s["ttft"] * 1000 for s in done if s["ttft"] is not None)
    gaps = result["gaps_ms"]
    tokens_per_s = events_per_s = float("nan")
    if done:  # the steady part: every stream open, in whole seconds
        first = math.ceil(max(s["first"] for s in done))
        last = math.floor(min(s["last"] for s in done))
        if last > first:
            seconds = range(first, last)
            tokens_per_s = sum(result["tokens_at"][t] for t in seconds) / len(seconds)
            events_per_s = sum(result["events_at"][t] for t in seconds) / len(seconds)
    gap = (_hist_percentile(gaps, 50), _hist_percentile(gaps, 99))
    rate_p10 = _percentile(rates, 10)
    rate_min = rates[0] if rates else float("nan")
    holds = (
        len(done) == streams
        and rate_min >= MIN_STREAM_RATE
        and rate_p10 >= 0.9 * plan.tokens_per_s
        and gap[1] <= MAX_GAP_P99_MS
    )
    return GatewayLevel(
        streams=streams,
        completed=len(done),
        tokens_per_s=tokens_per_s,
        events_per_s=events_per_s,
        gap_ms=gap,
        rate_p10=rate_p10,
        rate_min=rate_min,
        ttft_ms=(_percentile(ttfts, 50), _percentile(ttfts, 99)),
        cores=cores,
        steady_cores=steady_cores,
        gateway_rss_mb=rss_mb,
        feeder_late_ms=feeder_late_ms,
        holds=holds,
        errors=sorted(Counter(result["errors"]))[:5],
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * q / 100))]


def _hist_percentile(hist: Counter[int], q: float) -> float:
    total = sum(hist.values())
    if not total:
        return float("nan")
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= total * q / 100:
            return float(value)
    return float(max(hist))


def _machine_busy() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class _RssPeak:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_mb = 0.0

    async def sample(self) -> None:
        while True:
            self.peak_mb = max(self.peak_mb, self.process.memory_info().rss / 2**20)
            await asyncio.sleep(1.0)


async def _py_spy(plan: GatewayPlan, pid: int, streams: int) -> None:
    """The gateway's stacks (raw, GIL holders) during the level's steady part."""
    if plan.profile_dir is None:
        return
    plan.profile_dir.mkdir(parents=True, exist_ok=True)
    await asyncio.sleep(1.0 + plan.ramp_s(streams))
    spy = await asyncio.create_subprocess_exec(
        str(Path(PYTHON).with_name("py-spy")),
        "record",
        "--gil",
        "--nonblocking",
        "--format",
        "raw",
        "-d",
        str(int(plan.steady_s * 0.8)),
        "-p",
        str(pid),
        "-o",
        str(plan.profile_dir / f"gateway-{streams}.txt"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await spy.wait()


def _feeder_late_ms(feeder: Service, since: float, until: float) -> float:
    late = 0.0
    for line in feeder.log_text().splitlines():
        if line.startswith("feeder "):
            stats = json.loads(line[7:])
            if since <= stats["at"] <= until:
                late = max(late, stats["late_ms"])
    return late


# --- the report ----------------------------------------------------------------------


def markdown(
    plan: GatewayPlan, levels: list[GatewayLevel], command: str, host: dict[str, str]
) -> str:
    lines = [
        BEGIN,
        "## How many streams one gateway process holds",
        "",
        "```sh",
        command,
        "```",
        "",
        (
            f"Run on {host['date']}, commit `{host['commit']}` plus the working tree; "
            f"{host['cpu']}, `nproc` = {host['nproc']}, load average at start {host['loadavg']}. "
            "Only the gateway is under test: the embedded broker, one `chatpipe gateway` "
            "process (limits lifted, titles off), a feeder process standing in for scheduler, "
            "workers and safety (it answers each request on the gateway's delivery topic: "
            f"a delta of {plan.tokens_per_chunk} tokens every {plan.chunk_ms:g} ms, "
            f"{plan.tokens_per_s:g} tokens/s per stream, the first at once, then done), and "
            f"{plan.readers} reader processes that open the streams through the native API "
            f"({plan.ramp_per_s:g} new streams/s: create a conversation, post, read the SSE "
            f"answer; the gateway stores each answer before it shows its end). Every stream "
            f"lasts the ramp plus {plan.steady_s:g} s, so all are open together for that long; "
            "each level runs on a fresh broker and gateway. "
            f"A level holds when every stream completes, the slowest reads ≥ "
            f"{MIN_STREAM_RATE:g} tokens/s and the slowest tenth ≥ 90 % of the fed rate, and "
            f"the p99 gap between deltas is ≤ {MAX_GAP_P99_MS:g} ms. Tokens/s and events/s "
            "are delivered while every stream was open; gateway cores while every stream was "
            "open / over the whole level (ramp included); the other CPU over the whole level, "
            "*other* = the rest of the machine (other work on a shared "
            "machine); RSS the gateway's peak."
        ),
        "",
        (
            "| streams | completed | tokens/s | SSE events/s | gap p50 / p99 ms "
            "| slowest 10% tokens/s (min) | TTFT p50 / p99 ms "
            "| gateway cores (all open / level) | gateway RSS MB "
            "| feeder, readers, broker, other cores | holds |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        c = lv.cores
        lines.append(
            f"| {lv.streams} | {lv.completed} | {_f(lv.tokens_per_s)} | {_f(lv.events_per_s)} "
            f"| {_f(lv.gap_ms[0])} / {_f(lv.gap_ms[1])} | {_f(lv.rate_p10, 1)} "
            f"({_f(lv.rate_min, 1)}) | {_f(lv.ttft_ms[0])} / {_f(lv.ttft_ms[1])} "
            f"| {lv.steady_cores.get('gateway', math.nan):.2f} / {c.get('gateway', 0):.2f} "
            f"| {lv.gateway_rss_mb:.0f} | {c.get('feeder', 0):.2f}, "
            f"{c.get('readers', 0):.2f}, {c.get('broker', 0):.2f}, {c.get('other', 0):.2f} "
            f"| {'yes' if lv.holds else '**no**'} |"
        )
    lines += ["", _what_breaks(plan, levels), "", END]
    return "\n".join(lines)


def _f(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def _what_breaks(plan: GatewayPlan, levels: list[GatewayLevel]) -> str:
    held = [lv.streams for lv in levels if lv.holds]
    text = f"Held: {max(held) if held else 0} streams. "
    broken = next((lv for lv in levels if not lv.holds), None)
    if broken is None:
        return text + "No level broke; the curve stops at the largest level run."
    failed = []
    if broken.completed < broken.streams:
        failed.append(
            f"{broken.streams - broken.completed} streams did not complete "
            f"({'; '.join(broken.errors[:2])})"
        )
    if broken.gap_ms[1] > MAX_GAP_P99_MS:
        failed.append(f"p99 gap {broken.gap_ms[1]:.0f} ms")
    if broken.rate_p10 < 0.9 * plan.tokens_per_s or broken.rate_min < MIN_STREAM_RATE:
        failed.append(
            f"slowest streams at {broken.rate_p10:.1f} (p10) / {broken.rate_min:.1f} (min) tokens/s"
        )
    text += (
        f"At {broken.streams} streams: {', '.join(failed)}, with the gateway at "
        f"{broken.steady_cores.get('gateway', math.nan):.2f} cores while all streams "
        "were open (one event loop: ~1 core is all it can use) and the feeder at most "
        f"{broken.feeder_late_ms:.0f} ms behind its schedule."
    )
    profile = (
        plan.profile_dir / f"gateway-{broken.streams}.txt" if plan.profile_dir is not None else None
    )
    if profile is not None and profile.exists():
        text += (
            f" Where the gateway's time goes at that level (py-spy, GIL held, share "
            f"of samples by innermost chatpipe/library frame): {_top_frames(profile)}."
        )
    return text


def _top_frames(profile: Path, count: int = 8) -> str:
    """Self time by function from py-spy's raw (collapsed) output."""
    by_frame: Counter[str] = Counter()
    for line in profile.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit():
            continue
        frame = stack.rsplit(";", 1)[-1]
        by_frame[frame.split(" (")[0]] += int(samples)
    total = sum(by_frame.values()) or 1
    return ", ".join(f"`{name}` {n / total:.0%}" for name, n in by_frame.most_common(count))


def cli(argv: list[str], out: Path) -> None:
    """`python -m bench gateway [options]`: run the levels, write RESULTS.md's section."""
    import shlex
    import tempfile

    from bench.faults import write
    from bench.report import machine

    parser = argparse.ArgumentParser(prog="python -m bench gateway")
    parser.add_argument("--levels", default="250,500,1000,2000,3000,4000")
    parser.add_argument("--rate", type=float, default=GatewayPlan.tokens_per_s)
    parser.add_argument("--chunk-ms", type=float, default=GatewayPlan.chunk_ms)
    parser.add_argument("--ramp-per-s", type=float, default=GatewayPlan.ramp_per_s)
    parser.add_argument("--steady", type=float, default=GatewayPlan.steady_s)
    parser.add_argument("--readers", type=int, default=GatewayPlan.readers)
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="record the gateway's stacks at each level into DIR",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a chatpipe setting for the gateway",
    )
    parser.add_argument("--out", type=Path, default=out, help="where RESULTS.md is")
    parser.add_argument("--no-write", action="store_true", help="print the section only")
    args = parser.parse_args(argv)
    plan = GatewayPlan(
        tuple(int(n) for n in args.levels.split(",") if n),
        args.rate,
        args.chunk_ms,
        args.ramp_per_s,
        args.steady,
        args.readers,
        args.py_spy,
        dict(setting.split("=", 1) for setting in args.settings),
    )
    host = machine()
    work = Path(tempfile.mkdtemp(prefix="chatpipe-gateway-bench-"))
    log.info("logs in %s", work)
    levels = asyncio.run(run(plan, work))
    (work / "levels.json").write_text(json.dumps([asdict(lv) for lv in levels], indent=1))
    report = markdown(
        plan, levels, shlex.join([".venv/bin/python", "-m", "bench", "gateway", *argv]), host
    )
    if not args.no_write:
        write(report, args.out / "RESULTS.md", BEGIN, END)
    print(report)
