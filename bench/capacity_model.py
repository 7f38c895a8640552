"""`python -m bench capacity_model [--write]`: what the design load needs, with every formula.

    .venv/bin/python -m bench capacity_model           # prints the model
    .venv/bin/python -m bench capacity_model --write   # regenerates docs/CAPACITY.md

Pure computation from `bench/capacity_inputs.py` (the design load's numbers, assumptions,
figures measured in bench/RESULTS.md, a published vLLM result) and event and row sizes
measured by encoding real events (`bench/capacity_sizes.py`), then a Markdown renderer.
`tests/unit/bench/test_capacity_model.py` keeps docs/CAPACITY.md equal to what this renders.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from bench.capacity_inputs import Inputs, mean_prompt_tokens
from bench.capacity_sizes import (
    heartbeat_bytes,
    stored_bytes_per_turn,
    tokens_per_chunk,
    turn_records,
)
from schemas.topics import Tier

DOC = Path(__file__).resolve().parent.parent / "docs" / "CAPACITY.md"


@dataclass(frozen=True)
class Line:
    """One output: its value at average and at peak load, and the formula for both."""

    section: str
    name: str
    formula: str
    average: float
    peak: float
    unit: str = ""


@dataclass(frozen=True)
class TopicLoad:
    """One topic's traffic at average and peak, and the partitions it needs at peak."""

    topic: str
    events_per_turn: float
    bytes_per_event: float
    readers_per_record: int
    consumer_replicas: int
    average_mb_s: float
    peak_mb_s: float
    partitions: int
    """per topic"""
    count: int = 1
    """topics of this kind (one per tier for the request topics)"""


@dataclass(frozen=True)
class Model:
    inputs: Inputs
    lines: tuple[Line, ...]
    topics: tuple[TopicLoad, ...]
    notes: dict[str, str]
    """section -> a reading of its numbers, shown under its table"""

    def line(self, name: str) -> Line:
        return next(line for line in self.lines if line.name == name)


Pair = list[float]  # [average, peak]


class Sheet:
    """The outputs in the order they are computed and shown."""

    def __init__(self) -> None:
        self.lines: list[Line] = []
        self.notes: dict[str, str] = {}

    def add(
        self, section: str, name: str, formula: str, values: Sequence[float], unit: str = ""
    ) -> Pair:
        self.lines.append(Line(section, name, formula, values[0], values[-1], unit))
        return list(values)


def turns_per_s(i: Inputs) -> float:
    return i.conversations_per_day * i.turns_per_conversation / 86400


def prefill_tokens_per_s(i: Inputs, params: float) -> float:
    return i.prefill_mfu * i.gpu_fp8_flops / (2 * params)


def gpus(
    output_tps: float, prompt_tps: float, decode: float, prefill: float, tp: float, i: Inputs
) -> int:
    """GPUs for a load: decode and prefill time at the target load, in whole replicas."""
    busy = (output_tps / decode + prompt_tps / prefill) / i.gpu_target_load
    return _up(busy / tp) * round(tp)


def _up(x: float) -> int:
    """Rounded up, at least 1 (a float's last bit never adds a whole machine)."""
    return max(1, math.ceil(x - 1e-9))


def compute(i: Inputs | None = None) -> Model:
    i = i or Inputs()
    sheet = Sheet()
    add = sheet.add
    s = "Load"
    turns = add(
        s,
        "turns/s",
        "conversations/day × turns per conversation ÷ 86,400; peak × 3",
        [turns_per_s(i) * f for f in (1.0, i.peak_to_average)],
    )
    out = add(
        s,
        "output tokens/s",
        "turns/s × output tokens per turn",
        [t * i.output_tokens_per_turn for t in turns],
    )
    prompt = mean_prompt_tokens(i)
    add(
        s,
        "prompt tokens per turn",
        "system + user × (n + 1)/2 + answer × (n − 1)/2: the mean over turns 1..n",
        [prompt, prompt],
        "tokens",
    )
    prompt_tps = add(
        s, "prompt tokens/s", "turns/s × prompt tokens per turn", [t * prompt for t in turns]
    )
    missed = add(
        s,
        "prompt tokens/s past the prefix cache",
        "prompt tokens/s × (1 − cached fraction)",
        [p * (1 - i.prefix_cached_fraction) for p in prompt_tps],
    )
    streams = add(
        s,
        "concurrent streams",
        "output tokens/s ÷ a stream's tokens/s",
        [o / i.stream_tokens_per_s for o in out],
    )
    add(
        s,
        "tokens per chat.tokens event",
        "a stream's tokens/s × coalescing interval",
        [tokens_per_chunk(i)] * 2,
    )
    add(
        s,
        "concurrent streams at the published decode pace",
        "output tokens/s × published ms per token ÷ 1,000",
        [o * i.published_ms_per_token_70b / 1000 for o in out],
    )
    workers = _gpus(
        add,
        "Llama-3.1-70B FP8, TP 4",
        i.decode_tokens_per_s_70b,
        i.params_70b,
        i.gpus_per_replica_70b,
        out,
        prompt_tps,
        missed,
        i,
    )
    _gpus(
        add,
        "Llama-3.1-8B FP8, TP 1",
        i.decode_tokens_per_s_8b,
        i.params_8b,
        1,
        out,
        prompt_tps,
        missed,
        i,
    )
    _prefix_cache(sheet, i, turns, prompt)
    replicas, shards = _stages(add, i, turns, out)
    gateways = _gateways(add, i, streams, out)
    topics = _topics(i, turns, workers, gateways, replicas, shards, streams[-1] / workers[-1])
    _kafka(add, i, topics)
    _cassandra(add, i, turns)
    _redis(add, i, turns)
    return Model(i, tuple(sheet.lines), topics, sheet.notes)


def _gpus(
    add: Callable[..., Pair],
    label: str,
    decode: float,
    params: float,
    tp: float,
    out: Pair,
    prompt_tps: Pair,
    missed: Pair,
    i: Inputs,
) -> Pair:
    """The GPU lines of one model; its engine replicas (one chatpipe worker each)."""
    s = "GPUs"
    prefill = prefill_tokens_per_s(i, params)
    add(
        s,
        f"{label}: prefill tokens/s per GPU",
        "MFU × FP8 FLOP/s ÷ (2 × parameters)",
        [prefill, prefill],
    )
    formula = (
        "⌈(output tokens/s ÷ decode tokens/s per GPU + {} ÷ prefill tokens/s per GPU) "
        "÷ target load ÷ TP⌉ × TP"
    )
    plain = add(
        s,
        f"{label}: GPUs without prefix-cache hits",
        formula.format("prompt tokens/s"),
        [gpus(o, p, decode, prefill, tp, i) for o, p in zip(out, prompt_tps, strict=True)],
    )
    add(
        s,
        f"{label}: GPUs with prefix-cache hits",
        formula.format("prompt tokens/s past the prefix cache"),
        [gpus(o, p, decode, prefill, tp, i) for o, p in zip(out, missed, strict=True)],
    )
    return add(
        s,
        f"{label}: engine replicas = chatpipe workers",
        "GPUs without prefix-cache hits ÷ TP",
        [g / tp for g in plain],
    )


def _prefix_cache(sheet: Sheet, i: Inputs, turns: Pair, prompt: float) -> None:
    """Whether a conversation's KV blocks can still be on its replica at its next turn."""
    s, add = "Prefix cache (Llama-3.1-70B, TP 4)", sheet.add
    tp = i.gpus_per_replica_70b
    kv = tp * i.gpu_memory_bytes * i.gpu_memory_utilization - i.params_70b  # FP8: 1 byte each
    add(
        s,
        "KV cache per replica",
        "TP × GPU memory × memory utilization − parameters × 1 byte (FP8) ÷ 10⁹",
        [kv / 1e9] * 2,
        "GB",
    )
    held = kv / ((prompt + i.output_tokens_per_turn) * i.kv_bytes_per_token_70b)
    add(
        s,
        "conversations whose KV one replica holds",
        "KV cache per replica ÷ ((prompt + output tokens per turn) × KV bytes per token)",
        [held] * 2,
    )
    served = add(
        s,
        "conversations a replica serves between two turns of one",
        "turns/s ÷ replicas with prefix-cache hits × think time",
        [t / r * i.think_time_s for t, r in zip(turns, _replicas(i, turns), strict=True)],
    )
    sheet.notes[s] = (
        "The cached fraction assumed holds only if a conversation's blocks are still on its "
        "replica at its next turn (the scheduler sends the turn there: conversation "
        "affinity). "
        + (
            "Here they are: the replica holds more conversations than it serves in between."
            if held >= served[-1]
            else "Here the replica serves more conversations in between than its KV cache holds: "
            "many conversations' blocks are gone by their next turn, so the cached fraction "
            "needs more room per conversation: an "
            "FP8 KV cache (`kv_cache_dtype=fp8`, half the bytes per token) or KV blocks "
            "offloaded to CPU memory; without either, plan on the GPUs without prefix-cache "
            "hits."
        )
    )


def _replicas(i: Inputs, turns: Pair) -> Pair:
    """Engine replicas of the 70B model with prefix-cache hits."""
    prompt = mean_prompt_tokens(i)
    prefill = prefill_tokens_per_s(i, i.params_70b)
    return [
        gpus(
            t * i.output_tokens_per_turn,
            t * prompt * (1 - i.prefix_cached_fraction),
            i.decode_tokens_per_s_70b,
            prefill,
            i.gpus_per_replica_70b,
            i,
        )
        / i.gpus_per_replica_70b
        for t in turns
    ]


def _stages(
    add: Callable[..., Pair], i: Inputs, turns: Pair, out: Pair
) -> tuple[dict[str, Pair], Pair]:
    """Each stage's cores from its CPU per 1,000 tokens; replicas of the scaled ones."""
    s = "Stages"
    per_token = {
        "gateway": i.cpu_gateway,
        "safety": i.cpu_safety,
        "worker": i.cpu_worker,
        "recorder": i.cpu_recorder,
    }
    per_request = {"scheduler": i.cpu_scheduler, "billing": i.cpu_billing}
    cores = {
        stage: add(
            s,
            f"{stage} cores",
            "output tokens/s ÷ 1,000 × CPU s per 1k tokens",
            [o / 1000 * cpu for o in out],
        )
        for stage, cpu in per_token.items()
    }
    cores |= {
        stage: add(
            s,
            f"{stage} cores",
            "turns/s × bench tokens per request ÷ 1,000 × "
            "CPU s per 1k tokens (its work is per request)",
            [t * i.bench_tokens_per_request / 1000 * cpu for t in turns],
        )
        for stage, cpu in per_request.items()
    }
    replicas = {
        stage: add(
            s,
            f"{stage} replicas",
            f"⌈{stage} cores ÷ stage load⌉",
            [_up(c / i.stage_load) for c in cores[stage]],
        )
        for stage in ("safety", "recorder", "billing")
    }
    shards = add(
        s,
        "scheduler shards",
        "⌈turns/s ÷ (decisions/s × stage load)⌉",
        [_up(t / (i.scheduler_decisions_per_s * i.stage_load)) for t in turns],
    )
    return replicas, shards


def _gateways(add: Callable[..., Pair], i: Inputs, streams: Pair, out: Pair) -> Pair:
    s = "Gateways"
    by_streams = add(
        s,
        "gateways for the streams",
        "⌈streams ÷ (streams per process × load)⌉",
        [_up(n / (i.gateway_streams * i.gateway_load)) for n in streams],
    )
    by_tokens = add(
        s,
        "gateways for the tokens",
        "⌈output tokens/s ÷ (tokens/s per process × load)⌉",
        [_up(o / (i.gateway_tokens_per_s * i.gateway_load)) for o in out],
    )
    return add(
        s,
        "gateway replicas",
        "max(the two above)",
        [max(a, b) for a, b in zip(by_streams, by_tokens, strict=True)],
    )


def _topics(
    i: Inputs,
    turns: Pair,
    workers: Pair,
    gateways: Pair,
    replicas: dict[str, Pair],
    shards: Pair,
    streams_per_worker: float,
) -> tuple[TopicLoad, ...]:
    """Each topic's traffic; partitions = max(its consumer's replicas, MB/s ÷ per partition)."""
    readers = {  # topic -> (readers of each record, replicas of the consumer that scales)
        "chat.requests.<tier>": (1, shards),
        "chat.work": (2, workers),
        "chat.tokens": (1, replicas["safety"]),
        "chat.deliver.<gateway>": (1, gateways),
        "chat.answers": (1, replicas["recorder"]),
        "chat.usage": (2, replicas["billing"]),
    }
    loads = []
    for topic, (events, size) in turn_records(i).items():
        groups, consumers = readers[topic]
        mb = [t * events * size / 1e6 for t in turns]
        loads.append(
            TopicLoad(
                topic,
                events,
                size,
                groups,
                round(consumers[-1]),
                mb[0],
                mb[1],
                max(round(consumers[-1]), _up(mb[1] / i.partition_mb_per_s)),
                len(Tier) if topic == "chat.requests.<tier>" else 1,
            )
        )
    worker_beat, gateway_beat = heartbeat_bytes(streams_per_worker, i)
    for topic, beat, senders, groups in (
        ("chat.workers", worker_beat, workers, 1),
        # every worker reads all of chat.control (workers/stage.py assigns it whole)
        ("chat.control", gateway_beat, gateways, round(workers[-1]) + 1),
    ):
        mb = [n / i.heartbeat_s * beat / 1e6 for n in senders]
        loads.append(
            TopicLoad(topic, 0, beat, groups, 1, mb[0], mb[1], _up(mb[1] / i.partition_mb_per_s))
        )
    return tuple(loads)


def _kafka(add: Callable[..., Pair], i: Inputs, topics: tuple[TopicLoad, ...]) -> None:
    s = "Kafka"
    rf = i.replication_factor
    produced = add(
        s,
        "Kafka MB/s produced",
        "Σ topics' MB/s",
        [sum(t.average_mb_s for t in topics), sum(t.peak_mb_s for t in topics)],
    )
    read = add(
        s,
        "Kafka MB/s consumed",
        "Σ topics' MB/s × readers per record",
        [
            sum(t.average_mb_s * t.readers_per_record for t in topics),
            sum(t.peak_mb_s * t.readers_per_record for t in topics),
        ],
    )
    written = add(
        s, "brokers' MB/s in (and disk writes)", "produced MB/s × RF", [p * rf for p in produced]
    )
    sent = add(
        s,
        "brokers' MB/s out",
        "consumed MB/s + produced MB/s × (RF − 1)",
        [r + p * (rf - 1) for r, p in zip(read, produced, strict=True)],
    )
    partitions = sum(t.partitions * t.count for t in topics)
    add(
        s,
        "Kafka partitions, all topics",
        "Σ topics' partitions (sized for the peak)",
        [partitions] * 2,
    )
    add(
        s,
        "Kafka brokers",
        "max(RF, ⌈max(MB/s in, MB/s out) ÷ MB/s per broker⌉, ⌈partitions × RF ÷ "
        "partition replicas per broker⌉)",
        [
            max(
                rf,
                _up(max(w, o) / i.broker_mb_per_s),
                _up(partitions * rf / i.partitions_per_broker),
            )
            for w, o in zip(written, sent, strict=True)
        ],
    )


def _redis(add: Callable[..., Pair], i: Inputs, turns: Pair) -> None:
    s = "Redis"
    ops = add(
        s,
        "rate-limit commands/s",
        "turns/s × commands per turn",
        [t * i.redis_commands_per_turn for t in turns],
    )
    add(
        s,
        "Redis shards, each with a replica",
        "⌈commands/s ÷ commands/s per shard⌉",
        [_up(o / i.redis_ops_per_shard) for o in ops],
    )
    add(
        s,
        "Redis memory",
        "turns/s × 60 s (at most that many users active in a minute) × "
        "4 limits × 2 windows × bytes per key ÷ 10⁶",
        [t * 60 * 8 * i.redis_bytes_per_key / 1e6 for t in turns],
        "MB",
    )


def _cassandra(add: Callable[..., Pair], i: Inputs, turns: Pair) -> None:
    s = "Cassandra"
    rf = i.replication_factor
    writes = add(
        s,
        "replica writes/s",
        "turns/s × (conditional writes × their cost + plain writes) × RF",
        [t * (i.lwt_per_turn * i.lwt_cost + i.plain_writes_per_turn) * rf for t in turns],
    )
    reads = add(
        s,
        "replica reads/s",
        "turns/s × reads per turn × QUORUM replicas",
        [t * i.reads_per_turn * i.read_replicas for t in turns],
    )
    per_turn = stored_bytes_per_turn(i)
    add(
        s,
        "raw bytes stored per turn",
        "the rows' bound values + row overhead, per row",
        [per_turn] * 2,
        "bytes",
    )
    day = add(
        s,
        "Cassandra storage per day",
        "turns/day × raw bytes per turn × compression × RF ÷ 10¹²",
        [turns_per_s(i) * 86400 * per_turn * i.cassandra_compression * rf / 1e12] * 2,
        "TB",
    )
    kept = day[0] * i.retention_days
    add(s, "Cassandra storage kept", "storage per day × retention days", [kept] * 2, "TB")
    by_load = add(
        s,
        "nodes for the load",
        "max(⌈replica writes/s ÷ per node⌉, ⌈replica reads/s ÷ per node⌉)",
        [
            max(_up(w / i.cassandra_writes_per_node), _up(r / i.cassandra_reads_per_node))
            for w, r in zip(writes, reads, strict=True)
        ],
    )
    add(
        s,
        "Cassandra nodes",
        "max(RF, nodes for the load, ⌈storage kept ÷ TB per node⌉)",
        [max(rf, n, _up(kept / i.cassandra_tb_per_node)) for n in by_load],
    )


# --- docs/CAPACITY.md ------------------------------------------------------------------------

HEADLINE = (
    "turns/s",
    "output tokens/s",
    "concurrent streams",
    "Llama-3.1-70B FP8, TP 4: GPUs without prefix-cache hits",
    "Llama-3.1-70B FP8, TP 4: GPUs with prefix-cache hits",
    "Llama-3.1-70B FP8, TP 4: engine replicas = chatpipe workers",
    "gateway replicas",
    "safety replicas",
    "scheduler shards",
    "Kafka MB/s produced",
    "Kafka partitions, all topics",
    "Kafka brokers",
    "Cassandra storage per day",
    "Cassandra nodes",
    "Redis shards, each with a replica",
)

INTRO = """\
# Capacity: what the design load needs

Written by `bench/capacity_model.py`; regenerate with

```sh
.venv/bin/python -m bench capacity_model --write
```

`tests/unit/bench/test_capacity_model.py` fails when this file and the script disagree. Every
output below is computed from the inputs table, with its formula beside it, at the
average and at the peak (three times the average). Four kinds of input: the design
load's numbers (the load chatpipe is sized for: 100M weekly users, 10M conversations a
day), assumptions (each with its reason: change one in
`bench/capacity_inputs.py` and regenerate), figures measured on this project's 2-core
machine (a section of `bench/RESULTS.md` and the text quoted from it), and a published
vLLM result for the GPUs. Event and row sizes are measured here: `bench/capacity_sizes.py`
encodes real `schemas` events with the project's codec and binds real Cassandra rows.
"""

CAVEATS = """\
## What the model leaves out

- **Decode at long contexts.** The published decode figure is for ShareGPT prompts of
  ≈205 tokens; here a prompt averages 3,300, and decode slows as each sequence's KV
  cache grows (fewer sequences fit in a batch): the decode share of the GPU count may be
  low until a GPU run with this prompt mix measures it (`python -m bench` on a GPU machine).
- **vLLM's version.** The published run is vLLM 0.5.4; the same report measured 0.6.0
  with multi-step scheduling at 3,543 output tokens/s for Llama 3.1 70B at TP 4 (5,000
  prompts; 1.6× this figure), so a current vLLM likely needs fewer GPUs than counted here.
- **Decode pace.** The published figure runs at 38 ms per output token (≈26 tokens/s per
  stream); the stream count and the gateways assume 50 tokens/s. Holding 20 ms per token
  takes smaller batches, so more GPUs; at the published pace streams last longer and
  twice as many are open at once (the line *at the published decode pace*).
- **Prefill** is the FLOP bound at an assumed 40 % of peak, not a measurement; the
  published figure already includes its short prompts' prefill, which is counted again.
- **CPU figures** come from the sim-engine pipeline on 2 cores, with the embedded Tansu
  broker (`bench/RESULTS.md`): the broker's own CPU there (0.034 s per 1k tokens) says
  little of Apache Kafka's, so brokers are sized by MB/s and partitions only. The
  recorder stored into SQLite there; on Cassandra its work is the database's, counted
  under Cassandra.
- **The scheduler's** decisions per second are its core's, measured in the sim on one core of
  the development machine, per shard (`CHATPIPE_SCHEDULER_SHARDS`; k8s/sharded), with the
  heap frozen (`CHATPIPE_SCHEDULER_GC_FREEZE_S`): without it the p99 is CPython's
  full-collection pause (bench/RESULTS.md).
- **Cassandra's** per-node rates are assumptions: no Cassandra server runs on the
  development machine; the statements per turn are counted from the two stores' code
  (`conversations/cassandra_store.py`, `ledger/cassandra.py`).
- **Bytes** are uncompressed: lz4 with linger 0 compresses batches of a record or two
  little; a linger of a few ms on `chat.tokens` would shrink its MB/s.
- Rare events (cancels, moderation, dead letters, queue positions, the scheduler's
  status) are left out; heartbeats are in.
"""


def _number(x: float) -> str:
    if x >= 1e12:
        return f"{x / 1e12:,.4g} × 10¹²"
    if x >= 1e9:
        return f"{x / 1e9:,.4g} × 10⁹"
    if x == int(x) or x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def render(m: Model) -> str:
    out = [INTRO, "## Headline", ""]
    out += _table(
        ("quantity", "average", "peak"),
        [
            (
                f"{line.name}{f' ({line.unit})' if line.unit else ''}",
                _number(line.average),
                _number(line.peak),
            )
            for line in map(m.line, HEADLINE)
        ],
    )
    out += ["", "## Inputs", ""]
    out += _table(
        ("input", "value", "unit", "source"),
        [
            (f.name, _number(getattr(m.inputs, f.name)), f.metadata["unit"], f.metadata["source"])
            for f in fields(m.inputs)
        ],
    )
    sections = dict.fromkeys(line.section for line in m.lines)
    for section in sections:
        out += ["", f"## {section}", ""]
        out += _table(
            ("quantity", "formula", "average", "peak"),
            [
                (
                    f"{line.name}{f' ({line.unit})' if line.unit else ''}",
                    line.formula,
                    _number(line.average),
                    _number(line.peak),
                )
                for line in m.lines
                if line.section == section
            ],
        )
        if section in m.notes:
            out += ["", m.notes[section]]
        if section == "Kafka":
            out += ["", *TOPICS_TEXT.splitlines(), ""]
            out += _table(
                (
                    "topic",
                    "events per turn",
                    "bytes per event",
                    "events/s peak",
                    "MB/s average",
                    "MB/s peak",
                    "readers per record",
                    "partitions",
                ),
                [
                    (
                        f"`{t.topic}`",
                        _number(t.events_per_turn) if t.events_per_turn else "1 per sender per s",
                        _number(t.bytes_per_event),
                        _number(t.peak_mb_s * 1e6 / t.bytes_per_event),
                        _number(t.average_mb_s),
                        _number(t.peak_mb_s),
                        _number(t.readers_per_record),
                        _number(t.partitions) + (f" × {t.count} topics" if t.count > 1 else ""),
                    )
                    for t in m.topics
                ],
            )
    return "\n".join([*out, "", CAVEATS])


TOPICS_TEXT = """\
Per topic: MB/s = turns/s × events per turn × bytes per event ÷ 10⁶ (heartbeats: senders
÷ period × bytes). Bytes per event = the encoded event + key + headers + record
overhead, the mean over a conversation's turns (requests carry the whole history) and
over a stream's events. Partitions = max(replicas of the consumer that scales with the
topic, ⌈peak MB/s ÷ MB/s per partition⌉): `chat.work` one per worker (a worker owns a
partition), `chat.tokens` the safety replicas, `chat.answers` the recorders,
`chat.requests.<tier>` the scheduler shards (each of the 3 tier topics sized as if it
carried all requests), delivery one per gateway (one topic each). Every worker reads all of
`chat.control` (`workers/stage.py` assigns it whole)."""


def main(argv: list[str], doc: Path = DOC) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench capacity_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--write", action="store_true", help=f"regenerate {doc}")
    args = parser.parse_args(argv)
    text = render(compute())
    print(text)
    if args.write:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text)
        print(f"written to {doc}")
