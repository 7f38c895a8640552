"""`python -m bench seed`: chatpipe beside vLLM's server in a chat model's regime.

The default benchmark's tiny model answers 128 tokens in a tenth of a second, and
its engine computes on the cores the pipeline uses. This one serves the default
model, SmolLM2-135M-Instruct (`chatpipe make-model`), whose one unbatched stream
decodes at tens of tokens a second on one core of a CPU, as a chat model does on a
GPU. Every answer is 500 tokens (`ignore_eos`), and each client holds a
conversation: its next turn carries the whole conversation so far, the answers it
streamed included, so the history grows turn by turn as a chat's does.

Each side runs twice, pinned and unpinned (`bench.processes.Placement`). Pinned,
vLLM's engine process is on core 0 and everything else — vLLM's API server, or
`chatpipe up`'s stages and the embedded broker, and this load client — on core 1,
as on a GPU host where the engine does not share CPU with what serves it.
Unpinned, the OS places everything.

No two sides run at once. Order: vLLM's server then chatpipe, pinned, then the
same unpinned; each side is started, warmed up at every level (short answers), and
driven through the levels by the same client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import shlex
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import cpu, engine_view, fetch_timer
from bench.hops import FIRST_TOKEN_FETCHES, HOPS, ttft_hops
from bench.load import fixed_prompts
from bench.metrics import LevelStats, level_stats, percentile
from bench.processes import (
    EngineConfig,
    Placement,
    Service,
    broker_ready,
    chatpipe_env,
    chatpipe_up_ready,
    engine_settings,
    free_port,
    start_broker,
    start_chatpipe_up,
    start_vllm_server,
    vllm_ready,
)
from bench.report import machine
from bench.sse_client import StreamRecord, Target, conversation_body, stream_chat
from bench.topic_log import content_chunk_tokens, token_chunks
from chatpipe.settings import SETTINGS
from workers.config import DEFAULT_MODEL_DIR

log = logging.getLogger("bench")

API_KEY = "bench-key"
PINNED = Placement(engine_cpus=frozenset({0}), front_cpus=frozenset({1}))
"""On this 2-core machine: the engine on core 0, the rest on core 1."""
UNPINNED = Placement()
BEGIN, END = (
    "<!-- written by python -m bench seed: begin -->",
    "<!-- written by python -m bench seed: end -->",
)
TARGETS = {"tokens/s": 0.97, "ITL p50": 1.05, "TTFT p50 (ms)": 25.0}
"""chatpipe against vLLM's server: tokens/s at least 0.97×, ITL p50 at most 1.05×, TTFT
p50 at most vLLM's + 25 ms."""


@dataclass(frozen=True)
class Conversations:
    """The workload: `turns[i]` turns per client at `levels[i]` clients, answers of
    `answer_tokens`."""

    levels: tuple[int, ...] = (1, 8, 32, 64)
    turns: tuple[int, ...] = (10, 2, 1, 1)
    answer_tokens: int = 500
    warmup_tokens: int = 16

    def __post_init__(self) -> None:
        if len(self.turns) != len(self.levels):
            raise ValueError("one number of turns per level")


def opening(client: int) -> str:
    """A client's first message (the default benchmark's prompts, in turn)."""
    prompts = fixed_prompts()
    return prompts[client % len(prompts)]


def follow_up(turn: int) -> str:
    return f"Thank you. Now go further: question {turn + 1}, with an example."


def turn_body(model: str, history: Sequence[dict[str, str]], max_tokens: int) -> bytes:
    """One turn: the conversation so far, streamed, of a fixed length."""
    return conversation_body(model, history, max_tokens)


async def conversation(
    target: Target, client: int, turns: int, max_tokens: int
) -> list[StreamRecord]:
    """One client's conversation: each turn sends the history with the answers it got."""
    history = [{"role": "user", "content": opening(client)}]
    records = []
    for turn in range(turns):
        record = await stream_chat(target, turn_body(target.model, history, max_tokens), None, 900)
        records.append(record)
        if not record.completed:
            break
        history += [
            {"role": "assistant", "content": "".join(record.texts)},
            {"role": "user", "content": follow_up(turn)},
        ]
    return records


@dataclass
class Level:
    stats: LevelStats
    prompt_tokens_p50: float
    foreign_cores: float
    """Cores other processes (neither the side nor this client) used during the level."""
    hops: dict[str, tuple[float, float]] | None = None
    ttft_mean_ms: float | None = None
    """The client's time to first token, mean (the engine's figures are means)."""
    engine_ms: dict[str, float] = field(default_factory=dict)
    """The engine's own means (`bench.engine_view`): ttft, queue, prefill."""


@dataclass
class Side:
    name: str
    pinned: bool
    ready_s: float
    levels: list[Level] = field(default_factory=list)
    fetch_floor_ms: float | None = None
    engine_threads_pinned: int = 0

    def level(self, concurrency: int) -> Level | None:
        return next((lv for lv in self.levels if lv.stats.concurrency == concurrency), None)


async def drive(
    side: Side,
    target: Target,
    services: list[Service],
    work: Conversations,
    placement: Placement,
    bootstrap: str | None = None,
) -> None:
    """Warm up, then every level; chatpipe's per-chunk token counts come from chat.tokens."""
    for concurrency in work.levels:
        await asyncio.gather(
            *(conversation(target, c, 1, work.warmup_tokens) for c in range(concurrency))
        )
    for service in services:  # threads the warm-up started
        side.engine_threads_pinned += placement.pin_engines(service)
    for concurrency, turns in zip(work.levels, work.turns, strict=True):
        before = cpu.snapshot(services)
        engine_before = await engine_view.read_totals(target.port)
        started = time.perf_counter()
        runs = await asyncio.gather(
            *(conversation(target, c, turns, work.answer_tokens) for c in range(concurrency))
        )
        wall_s = time.perf_counter() - started
        use = cpu.between(before, cpu.snapshot(services))
        engine_ms = engine_view.means_ms(engine_before, await engine_view.read_totals(target.port))
        records = [r for run in runs for r in run]
        counts = hops = None
        if bootstrap is not None:
            ids = [r.request_id for r in records if r.request_id]
            logged = await token_chunks(bootstrap, ids)
            counts = {rid: content_chunk_tokens(chunks) for rid, chunks in logged.items()}
            hops = await ttft_hops(bootstrap, records)
        stats, samples = level_stats(side.name, concurrency, records, wall_s, counts)
        prompts = [r.usage["prompt_tokens"] for r in records if r.completed and r.usage]
        ttfts = samples["ttft"]
        side.levels.append(
            Level(
                stats,
                percentile(prompts, 50),
                use.cores(use.foreign),
                hops,
                sum(ttfts) / len(ttfts) * 1000 if ttfts else None,
                engine_ms,
            )
        )
        log.info(
            "%s c=%d: %d/%d done, %.0f tok/s, ttft p50 %.0f ms, itl p50 %.1f ms",
            side.name,
            concurrency,
            stats.completed,
            stats.requests,
            stats.tokens_per_s,
            stats.ttft_ms[0],
            stats.itl_ms[0],
        )


async def vllm_side(
    cfg: EngineConfig, work: Conversations, placement: Placement, log_dir: Path
) -> Side:
    """vLLM's OpenAI server as `vllm serve MODEL` runs it."""
    port = free_port()
    server = start_vllm_server(cfg, port, API_KEY, log_dir, placement=placement)
    try:
        side = Side("vllm", placement.pinned, await vllm_ready(server, port))
        side.engine_threads_pinned = placement.pin_engines(server)
        await drive(side, Target("vllm", port, API_KEY, cfg.model_name), [server], work, placement)
        return side
    finally:
        server.stop()


async def chatpipe_side(
    cfg: EngineConfig, work: Conversations, placement: Placement, log_dir: Path
) -> Side:
    """`chatpipe up` (every stage in one process) on a broker of our own."""
    broker, bootstrap = start_broker(log_dir, placement)
    up: Service | None = None
    try:
        await broker_ready(broker, bootstrap)
        port = free_port()
        env = chatpipe_env(API_KEY, log_dir, bootstrap, **engine_settings(cfg))
        up = start_chatpipe_up(env, port, log_dir, "vllm", placement)
        side = Side("chatpipe", placement.pinned, await chatpipe_up_ready(up))
        side.engine_threads_pinned = placement.pin_engines(up)
        target = Target("chatpipe", port, API_KEY, cfg.model_name)
        await drive(side, target, [up, broker], work, placement, bootstrap)
        wait_ms = int(SETTINGS["kafka_fetch_max_wait_ms"].default)
        side.fetch_floor_ms = percentile(await fetch_timer.measure(bootstrap, wait_ms), 50)
        return side
    finally:
        if up is not None:
            up.stop()
        broker.stop()


@dataclass
class SeedRun:
    command: str
    machine: dict[str, str]
    work: Conversations
    model: str
    model_name: str
    sides: list[Side] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    engine_cpus: frozenset[int] | None = None
    front_cpus: frozenset[int] | None = None

    def side(self, name: str, pinned: bool) -> Side | None:
        return next((s for s in self.sides if s.name == name and s.pinned == pinned), None)


async def run(
    cfg: EngineConfig,
    work: Conversations,
    command: str,
    quiet_wait_s: float,
    placements: Sequence[Placement] = (PINNED, UNPINNED),
    lock: Path | None = None,
) -> SeedRun:
    started = time.monotonic()
    shown = str(cfg.model).replace(str(Path.home()), "~", 1)
    result = SeedRun(command, machine(), work, shown, cfg.model_name)
    logs = Path(tempfile.mkdtemp(prefix="chatpipe-seed-"))
    log.info("logs in %s", logs)
    for placement in placements:
        label = "pinned" if placement.pinned else "unpinned"
        if placement.pinned:
            result.engine_cpus, result.front_cpus = placement.engine_cpus, placement.front_cpus
        placement.pin_client()
        for name, start in (("vllm", vllm_side), ("chatpipe", chatpipe_side)):
            with _held(lock):
                if quiet_wait_s > 0:
                    await cpu.wait_for_quiet(quiet_wait_s)
                try:
                    side = await start(cfg, work, placement, logs / f"{name}-{label}")
                    result.sides.append(side)
                except Exception as exc:
                    log.exception("%s %s failed", name, label)
                    result.failures.append(f"{name} {label}: {type(exc).__name__}: {exc}")
    UNPINNED.pin_client()
    result.duration_s = time.monotonic() - started
    return result


@contextlib.contextmanager
def _held(lock: Path | None) -> Iterator[None]:
    """With `lock`, one side at a time holds it (flock): other heavy work on a shared
    machine runs between the sides, not during one."""
    if lock is None:
        yield
        return
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- the report ----------------------------------------------------------------------


def markdown(result: SeedRun) -> str:
    m, work = result.machine, result.work
    turns = ", ".join(f"{t} at c={c}" for c, t in zip(work.levels, work.turns, strict=True))
    parts = [
        "## In a chat model's regime: the default model, engine on its own core\n",
        f"Run on {m['date']} ({result.duration_s / 60:.1f} min), commit `{m['commit']}` plus "
        f"the working tree, load average at start {m['loadavg']}. Regenerate with:\n",
        f"```sh\n{result.command}\n```\n",
        f"- model: `{result.model}`, served as `{result.model_name}`; vLLM's server as "
        "`vllm serve MODEL` runs it (chatpipe's KV cache size, as in the default "
        "benchmark) against `chatpipe up` at its defaults; both take the model's own "
        "context length, and apply the sampling defaults of its `generation_config.json` "
        "a request leaves unset (the client sets temperature 1 and top_p 1)",
        f"- workload: streaming `POST /v1/chat/completions`, {work.answer_tokens}-token "
        "answers (`ignore_eos`), one conversation per client, each turn carrying the whole "
        f"history (its answers included); turns per client: {turns}; every level warmed "
        f"up first ({work.warmup_tokens}-token answers)",
        "- pinned: vLLM's engine processes (engine core and worker, every thread; OpenMP "
        f"bound by `VLLM_CPU_OMP_THREADS_BIND`) on {_cpu_text(result, 'engine')}; "
        "vLLM's API server, or chatpipe's stages and the broker, and the load client on "
        f"{_cpu_text(result, 'front')}. Unpinned: the OS places everything",
        "",
    ]
    if result.failures:
        parts.append("Failed sides:\n\n" + "".join(f"- {f}\n" for f in result.failures))
    parts += [_levels(result), _ratios(result), _engine_view(result), _hops(result)]
    parts.append(_ready(result))
    return "\n".join(parts)


def _ready(result: SeedRun) -> str:
    """How long each side took from its command to serving (the model loaded and
    compiled, the engine warmed, every stage up)."""
    cells = [
        f"{side.name} {'pinned' if side.pinned else 'unpinned'} {side.ready_s:.0f} s"
        for side in result.sides
    ]
    return "Started, from the command to serving: " + ", ".join(cells) + ".\n"


def _cpu_text(result: SeedRun, which: str) -> str:
    """`core 0`, `cores 0,1`: the cores a placement gave the engine or the front end."""
    cpus = sorted((result.engine_cpus if which == "engine" else result.front_cpus) or ())
    return f"core{'s' if len(cpus) > 1 else ''} {','.join(map(str, cpus)) or '–'}"


def _fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def _levels(result: SeedRun) -> str:
    lines = [
        "Latencies in ms (p50 / p99); ITL per token, as in the default benchmark; *foreign "
        "cores*: what processes other than the side and the client used meanwhile.\n",
        "| placement | c | side | done | prompt tokens p50 | tokens/s | TTFT | ITL | TPOT "
        "| foreign cores |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for side in result.sides:
        for lv in side.levels:
            s = lv.stats
            lines.append(
                f"| {'pinned' if side.pinned else 'unpinned'} | {s.concurrency} | {side.name} "
                f"| {s.completed}/{s.requests} | {_fmt(lv.prompt_tokens_p50)} "
                f"| {_fmt(s.tokens_per_s, 1)} | {_fmt(s.ttft_ms[0])} / {_fmt(s.ttft_ms[1])} "
                f"| {_fmt(s.itl_ms[0], 1)} / {_fmt(s.itl_ms[1], 1)} "
                f"| {_fmt(s.tpot_ms[0], 1)} / {_fmt(s.tpot_ms[1], 1)} "
                f"| {lv.foreign_cores:.2f} |"
            )
    return "\n".join(lines) + "\n"


def ratios(ours: LevelStats, theirs: LevelStats) -> dict[str, float]:
    """chatpipe against vLLM at one level: the figures the targets are on."""
    return {
        "tokens/s": ours.tokens_per_s / theirs.tokens_per_s if theirs.tokens_per_s else 0.0,
        "ITL p50": ours.itl_ms[0] / theirs.itl_ms[0] if theirs.itl_ms[0] else float("nan"),
        "TTFT p50 (ms)": ours.ttft_ms[0] - theirs.ttft_ms[0],
    }


def met(figure: str, value: float) -> bool:
    if figure == "tokens/s":
        return value >= TARGETS[figure]
    return value <= TARGETS[figure]


def _ratios(result: SeedRun) -> str:
    lines = [
        "chatpipe against vLLM's server, each placement in the same run (targets: tokens/s "
        f"≥ {TARGETS['tokens/s']}×, ITL p50 ≤ {TARGETS['ITL p50']}×, TTFT p50 ≤ vLLM + "
        f"{TARGETS['TTFT p50 (ms)']:.0f} ms; the broker's floor beside it: "
        f"{FIRST_TOKEN_FETCHES} fetches before a first token, each waiting the measured "
        "p50 below):\n",
        "| placement | c | tokens/s | ITL p50 | TTFT p50 | broker floor in TTFT | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for pinned in (True, False):
        ours, theirs = result.side("chatpipe", pinned), result.side("vllm", pinned)
        if ours is None or theirs is None:
            continue
        floor = (
            FIRST_TOKEN_FETCHES * ours.fetch_floor_ms if ours.fetch_floor_ms is not None else None
        )
        for lv in ours.levels:
            other = theirs.level(lv.stats.concurrency)
            if other is None:
                continue
            r = ratios(lv.stats, other.stats)
            ok = all(met(k, v) for k, v in r.items())
            lines.append(
                f"| {'pinned' if pinned else 'unpinned'} | {lv.stats.concurrency} "
                f"| {r['tokens/s']:.2f}× | {r['ITL p50']:.2f}× | {r['TTFT p50 (ms)']:+.0f} ms "
                f"| {_fmt(floor)} ms | {'yes' if ok else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def _engine_view(result: SeedRun) -> str:
    lines = [
        "The first token as the engine saw it (means in ms over each level's requests; "
        "*engine*: from the request's arrival at vLLM's engine client to its first token, "
        "*queued*: the part of it waiting for the engine's scheduler, both from vLLM's "
        "own histograms, `bench/engine_view.py`; *before and after*: the client's time to "
        "first token less the engine's):\n",
        "| placement | c | side | TTFT | engine | queued | before and after |",
        "|---|---|---|---|---|---|---|",
    ]
    for pinned in (True, False):
        for name in ("vllm", "chatpipe"):
            side = result.side(name, pinned)
            for lv in side.levels if side else ():
                engine, queued = lv.engine_ms.get("ttft"), lv.engine_ms.get("queue")
                outside = (
                    lv.ttft_mean_ms - engine
                    if lv.ttft_mean_ms is not None and engine is not None
                    else None
                )
                lines.append(
                    f"| {'pinned' if pinned else 'unpinned'} | {lv.stats.concurrency} | {name} "
                    f"| {_fmt(lv.ttft_mean_ms)} | {_fmt(engine)} | {_fmt(queued)} "
                    f"| {_fmt(outside)} |"
                )
    return "\n".join(lines) + "\n"


def _hops(result: SeedRun) -> str:
    lines = [
        "chatpipe's time to first token, hop by hop (p50 / p90 ms, from Kafka record "
        "timestamps, as `bench/hops.py` defines them; *worker + engine* holds the wait "
        "for the engine and its prefill):\n",
        "| placement | c | " + " | ".join(HOPS) + " |",
        "|---|---|" + "---|" * len(HOPS),
    ]
    for pinned in (True, False):
        side = result.side("chatpipe", pinned)
        for lv in side.levels if side else ():
            if not lv.hops:
                continue
            cells = [f"{_fmt(lv.hops[h][0])} / {_fmt(lv.hops[h][1])}" for h in HOPS]
            placement = "pinned" if pinned else "unpinned"
            lines.append(f"| {placement} | {lv.stats.concurrency} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def merged(old: str, report: str) -> str:
    """`report` in place of the last seed block of `old`; the rest stays (the block goes at
    the end the first time)."""
    block = f"{BEGIN}\n{report.rstrip()}\n{END}\n"
    if BEGIN not in old or END not in old:
        return old.rstrip("\n") + "\n\n" + block if old else block
    head, rest = old.split(BEGIN, 1)
    return head + block + rest.split(END, 1)[1]


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def _cpus(text: str) -> frozenset[int]:
    """`0`, `1,3` or `2-15`."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def cli(argv: list[str], bench_dir: Path) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench seed", description=__doc__)
    parser.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL_DIR,
        help="a local HF model directory, served under its name; the default model is built"
        " if missing",
    )
    parser.add_argument("--levels", type=_ints, default=Conversations.levels)
    parser.add_argument(
        "--turns", type=_ints, default=Conversations.turns, help="turns per client, per level"
    )
    parser.add_argument("--answer-tokens", type=int, default=Conversations.answer_tokens)
    parser.add_argument(
        "--engine-cpus",
        type=_cpus,
        default=PINNED.engine_cpus,
        help="pinned: the engine's cores, e.g. 0 or 0-1",
    )
    parser.add_argument(
        "--front-cpus",
        type=_cpus,
        default=PINNED.front_cpus,
        help="pinned: the cores of everything else, e.g. 1 or 2-15",
    )
    parser.add_argument(
        "--placements",
        type=lambda text: tuple(text.split(",")),
        default=("pinned", "unpinned"),
        help="which placements to run, in order",
    )
    parser.add_argument("--quiet-wait", type=float, default=30.0)
    parser.add_argument(
        "--lock",
        type=Path,
        help="a file each side holds an flock on while it runs (shared machines)",
    )
    parser.add_argument("--out", type=Path, default=bench_dir / "RESULTS.md")
    args = parser.parse_args(argv)
    from chatpipe.default_model import build_default_model

    if args.model == DEFAULT_MODEL_DIR:  # never over a model of the user's
        build_default_model(args.model)
    work = Conversations(args.levels, args.turns, args.answer_tokens)
    command = shlex.join([".venv/bin/python", "-m", "bench", "seed", *argv])
    pinned = Placement(engine_cpus=args.engine_cpus, front_cpus=args.front_cpus)
    known = {"pinned": pinned, "unpinned": UNPINNED}
    if unknown := [p for p in args.placements if p not in known]:
        parser.error(f"--placements: not pinned or unpinned: {', '.join(unknown)}")
    placements = [known[p] for p in args.placements]
    cfg = EngineConfig(model=args.model)
    result = asyncio.run(run(cfg, work, command, args.quiet_wait, placements, args.lock))
    old = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(merged(old, markdown(result)))
    (args.out.parent / "seed.json").write_text(
        json.dumps([dataclasses.asdict(s) for s in result.sides], indent=1, default=str)
    )
    print(f"results in {args.out} ({result.duration_s / 60:.1f} min)")
    if result.failures:
        raise SystemExit("failed: " + "; ".join(result.failures))
