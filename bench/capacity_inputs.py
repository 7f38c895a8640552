"""The capacity model's inputs (`bench/capacity_model.py`): every number it starts from,
each with its unit and where it comes from — the design load, an assumption and its reason, a
section of bench/RESULTS.md and the text it quotes there, or a published vLLM result."""

from __future__ import annotations

from dataclasses import dataclass, field

RESULTS = "bench/RESULTS.md"
LAMBDA = (
    "https://github.com/LambdaLabsML/vllm-benchmark/blob/main/benchmark_v0.md"
    " (table *Tensor Parallel v.s. Data Parallel*)"
)
SIZED_FOR = "the design load"


PREFIX = "Growing history and the prefix cache"
GATEWAY = "How many streams one gateway process holds"
CAPACITY = "Pipeline capacity (sim engine, one process per stage)"
CHEAPER_CORE = "A cheaper core (2026-12-01)"
TARGETS = "Reading the targets"
CPU_ROW = "| 500 | 0.003 | 0.034 | 0.031 | 0.000 | 0.022 | 0.009 | 0.034 | 0.134 |"


def _in(value: float, unit: str, source: str, quote: tuple[str, str] | None = None) -> float:
    """An input: its unit and source; `quote` = (section, text) of bench/RESULTS.md it cites."""
    return field(default=value, metadata={"unit": unit, "source": source, "quote": quote})


def _measured(value: float, unit: str, section: str, quote: str, note: str = "") -> float:
    """An input read off bench/RESULTS.md: `quote` is in its section `section`, once (a test
    checks). A section, not a line number: regenerating the file moves its lines."""
    return _in(
        value,
        unit,
        f"measured: {RESULTS}, *{section}*" + (f", {note}" if note else ""),
        (section, quote),
    )


@dataclass(frozen=True)
class Inputs:
    """Every number the model starts from, with where it comes from."""

    conversations_per_day: float = _in(10e6, "conversations/day", SIZED_FOR)
    turns_per_conversation: float = _in(
        10,
        "turns",
        "assumption: 10M conversations × 10 turns / 86,400 s"
        " gives the design load's ≈1,160 turns/s",
    )
    output_tokens_per_turn: float = _in(500, "tokens", SIZED_FOR + ": ≈500 output tokens per turn")
    peak_to_average: float = _in(3, "×", SIZED_FOR + ": three times the average at peak")
    stream_tokens_per_s: float = _in(
        50,
        "tokens/s",
        "assumption: a reader's decode rate (20 ms per token); 500 tokens "
        "then stream 10 s, which gives the design load's ~12k concurrent streams",
    )
    system_prompt_tokens: float = _in(500, "tokens", "assumption: system prompt of a chat product")
    user_message_tokens: float = _in(100, "tokens", "assumption: a user's message")
    chars_per_token: float = _in(
        4, "chars", "the gateway's own estimate (gateway/admission/rate_limits.py)"
    )
    prefix_cached_fraction: float = _in(
        0.75,
        "of prompt tokens",
        f"assumption, under the 0.806 measured over 10 turns of one "
        f"conversation ({RESULTS}, *{PREFIX}*): KV eviction under load loses some",
        (PREFIX, "0.806 overall"),
    )
    decode_tokens_per_s_70b: float = _in(
        2242.99 / 4,
        "output tokens/s per GPU",
        "published: 2,242.99 output tokens/s on "
        "4×H100-80GB-SXM, Llama-3.1-70B-Instruct-FP8, vLLM 0.5.4, 320 ShareGPT prompts at "
        "once (≈205 tokens in, 197 out: the results file of that setting), ÷ 4 GPUs; " + LAMBDA,
    )
    decode_tokens_per_s_8b: float = _in(
        3400.4,
        "output tokens/s per GPU",
        f"published: 1×H100-80GB-SXM, Llama-3.1-8B-FP8, same run; {LAMBDA}",
    )
    params_70b: float = _in(70.6e9, "parameters", "Llama-3.1-70B")
    params_8b: float = _in(8.03e9, "parameters", "Llama-3.1-8B")
    gpus_per_replica_70b: float = _in(4, "GPUs", "tensor parallel 4, as in the published run")
    gpu_fp8_flops: float = _in(
        1979e12, "FLOP/s", "H100 SXM dense FP8 peak (NVIDIA datasheet, 3,958 with sparsity)"
    )
    prefill_mfu: float = _in(
        0.4,
        "of peak",
        "assumption: prefill is compute-bound; 40 % of "
        "peak FLOPs (no published vLLM prefill figure under these conditions)",
    )
    gpu_target_load: float = _in(
        0.8,
        "of saturation",
        "assumption: the published figure is at "
        "saturation (all prompts at once); keep 20 % for queueing",
    )
    published_ms_per_token_70b: float = _in(
        38.26, "ms per output token", f"published: the same row's inter-token latency; {LAMBDA}"
    )
    gpu_memory_bytes: float = _in(80e9, "bytes", "H100-80GB")
    gpu_memory_utilization: float = _in(
        0.9, "of GPU memory", "vLLM's default gpu_memory_utilization"
    )
    kv_bytes_per_token_70b: float = _in(
        2 * 80 * 8 * 128 * 2,
        "bytes",
        "K and V × 80 layers × 8 KV heads × 128 dims × 2 bytes "
        "(BF16 KV cache), Llama-3.1-70B's config",
    )
    think_time_s: float = _in(
        60,
        "s",
        "assumption: between an answer's end and the conversation's next turn (reading, typing)",
    )
    coalesce_ms: float = _in(50, "ms", "CHATPIPE_COALESCE_MS default (workers/config.py)")
    record_overhead_bytes: float = _in(
        70,
        "bytes/record",
        "assumption: Kafka record batch v2, 61-byte batch header shared "
        "by the few records of a linger-0 batch, ~10 bytes of varints per record",
    )
    replication_factor: float = _in(3, "copies", "assumption: Kafka and Cassandra RF 3")
    broker_mb_per_s: float = _in(
        250,
        "MB/s in and out per broker",
        "assumption: 10 GbE at 20 %, NVMe disks; room for a broker's loss and its catch-up",
    )
    partition_mb_per_s: float = _in(
        5,
        "MB/s per partition",
        "assumption: what one Python consumer decodes comfortably "
        "(the gateway decoded ~12k events/s, a few MB/s, at one core)",
    )
    partitions_per_broker: float = _in(
        4000, "partition replicas", "assumption: common guidance for a Kafka broker"
    )
    cpu_gateway: float = _measured(
        0.031,
        "CPU s per 1k tokens",
        TARGETS,
        CPU_ROW,
        "the pipeline at 500 streams, sim engine, 2026-11-30 (the slower VM)",
    )
    cpu_safety: float = _measured(0.022, "CPU s per 1k tokens", TARGETS, CPU_ROW)
    cpu_worker: float = _measured(
        0.034, "CPU s per 1k tokens", TARGETS, CPU_ROW, "chatpipe's worker, not the engine"
    )
    cpu_recorder: float = _measured(
        0.0005, "CPU s per 1k tokens", TARGETS, CPU_ROW, "which reads 0.000: half its last digit"
    )
    cpu_scheduler: float = _measured(
        0.009, "CPU s per 1k tokens", TARGETS, CPU_ROW, "its work is per request"
    )
    cpu_billing: float = _measured(
        0.003, "CPU s per 1k tokens", TARGETS, CPU_ROW, "its work is per request"
    )
    bench_tokens_per_request: float = _measured(
        120, "tokens", CAPACITY, "20 tokens/s for 6 s (120 tokens)"
    )
    stage_load: float = _in(
        0.6, "of a core", "assumption: a Python stage process uses one core; run it at 60 %"
    )
    scheduler_decisions_per_s: float = _measured(
        9143,
        "decisions per core-second",
        CHEAPER_CORE,
        "| 27–28 % | 9,143–9,634 each |",
        "one scheduler shard's core, 500 workers, 5,000 waiting, heap frozen: the lowest of "
        "six (`python -m bench scheduler_sim --workers 1000 --shards 2 --kafka-seconds 0 "
        "--seconds 15 --gc-freeze`, 2026-12-01)",
    )
    gateway_streams: float = _measured(
        2000,
        "streams per process",
        GATEWAY,
        "| 2000 | 2000 | 40,010 |",
        "one gateway process held 2,000, not 3,000 (the next row)",
    )
    gateway_tokens_per_s: float = _measured(
        40010, "tokens/s per process", GATEWAY, "| 2000 | 2000 | 40,010 |"
    )
    gateway_load: float = _in(
        0.7, "of the held level", "assumption: headroom for a gateway's loss and uneven balancing"
    )
    heartbeat_s: float = _in(1, "s", "worker and gateway heartbeat period (workers/config.py)")
    lwt_per_turn: float = _in(
        7,
        "conditional writes",
        "conversations/cassandra_store.py: two appends (a conditional "
        "batch and a message_id insert each), finish_answer; ledger/cassandra.py: a charge's "
        "claim and its clearing",
    )
    plain_writes_per_turn: float = _in(
        5,
        "writes",
        "the requests row; ledger/cassandra.py: the user and org counters, day and month",
    )
    reads_per_turn: float = _in(
        10,
        "reads",
        "cassandra_store.py: an id lookup and last_seq per append, the history, "
        "finish_answer's lookup; the ledger's charged row; the API key; the quota's 2 totals",
    )
    lwt_cost: float = _in(4, "writes", "assumption: Paxos prepare, read, propose, commit")
    cassandra_writes_per_node: float = _in(
        15000, "replica writes/s", "assumption: an 8–16 core node, kept well under saturation"
    )
    cassandra_reads_per_node: float = _in(10000, "replica reads/s", "assumption, as above")
    read_replicas: float = _in(2, "replicas", "QUORUM of RF 3")
    row_overhead_bytes: float = _in(
        60, "bytes/row", "assumption: partition and clustering keys, cell timestamps"
    )
    cassandra_compression: float = _in(
        0.5, "on disk / raw", "assumption: LZ4 table compression on text"
    )
    retention_days: float = _in(365, "days", "assumption: chat history kept a year")
    cassandra_tb_per_node: float = _in(
        2,
        "TB of data per node",
        "assumption: repair and bootstrap stay hours, half the disk free for compaction",
    )
    redis_commands_per_turn: float = _in(
        13,
        "commands",
        "gateway/admission/rate_limits.py: 4 limits read and hit, 2 token corrections;"
        " gateway/admission/concurrency.py: a lease taken, renewed, released",
    )
    redis_ops_per_shard: float = _in(
        50000,
        "commands/s",
        "assumption: single-threaded Redis, Lua scripts on 2 keys, at about half its capacity",
    )
    redis_bytes_per_key: float = _in(100, "bytes", "assumption: key, counter, expiry")


def mean_prompt_tokens(i: Inputs) -> float:
    """Turn k of n sends the system prompt, k user messages and k − 1 answers: the mean
    over k = 1..n."""
    n = i.turns_per_conversation
    return (
        i.system_prompt_tokens
        + i.user_message_tokens * (n + 1) / 2
        + i.output_tokens_per_turn * (n - 1) / 2
    )
