"""`python -m bench [run|smoke|profile] …`: chatpipe beside vLLM's server, and its capacity.

python -m bench                 # the full run (~15 min): vLLM server at its defaults,
                                # chatpipe up, vLLM server with chatpipe's engine args, capacity
python -m bench smoke --out D   # seconds: chatpipe with the sim engine, tiny load
python -m bench profile --streams 100   # stages under pyinstrument; bench/PROFILE.md
python -m bench faults          # ~2 min: fault scenarios (bench/fault_scenarios.py),
                                # bench/RESULTS.md
python -m bench differentiators   # minutes, sim engine: ETA error, retraction, cancel,
                                  # resume (--kills N), bench/RESULTS.md
python -m bench gateway         # streams one gateway process holds (--help), RESULTS.md
python -m bench capacity --streams 100,300 --out D   # the capacity phase alone, idle cost
python -m bench capacity_model [--write]   # what the design load needs: docs/CAPACITY.md
python -m bench scheduler_sim --workers 1000   # the scheduler core at scale (--help)
python -m bench retrieval       # what file_ids add to TTFT (--help), RESULTS.md
python -m bench response_cache   # hit ratio, TTFT of a hit against a miss (--help)
python -m bench broker_clients  # what other Kafka clients meet on the embedded broker
python -m bench soak --minutes 20   # mixed load for tens of minutes: idle CPU, slow answers
python -m bench seed            # ~30 min: a chat model's regime, engine pinned and not (--help)
python -m bench prompt_build    # seconds: a growing conversation's prompt, turn by turn
python -m bench sampling_defaults   # minutes: the default model's answers by sampling setting
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import shlex
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from bench.capacity import STAGES, CapacityPlan, capacity, summary
from bench.compare import Workload, chatpipe_side, vllm_side
from bench.cpu import wait_for_quiet
from bench.processes import EngineConfig
from bench.profiles import profiler_command, write_summary
from bench.report import BenchRun, machine, write
from chatpipe.tiny_model import TINY_MODEL_DIR

BENCH_DIR = Path(__file__).resolve().parent
T = TypeVar("T")
log = logging.getLogger("bench")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def _json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("expected NAME=VALUE")
    return name.strip().lower(), value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=("run", "smoke", "profile", "faults", "capacity")
    )
    parser.add_argument("--out", type=Path, default=BENCH_DIR, help="where results go")
    parser.add_argument("--model", type=Path, default=TINY_MODEL_DIR)
    parser.add_argument(
        "--vllm-args",
        type=_json_object,
        default={},
        help="engine args (JSON) for chatpipe (CHATPIPE_VLLM_ARGS) and the "
        "same-args vLLM side; the default side always runs vLLM's defaults",
    )
    parser.add_argument("--levels", type=_ints, default=(1, 8, 32, 64))
    parser.add_argument("--rounds", type=int, default=4, help="requests per client per level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--disconnects", type=int, default=48)
    parser.add_argument(
        "--engine",
        choices=("vllm", "sim"),
        default="vllm",
        help="chatpipe's engine; sim skips vLLM's server",
    )
    parser.add_argument("--skip-vllm", action="store_true", help="no vLLM server side")
    parser.add_argument(
        "--skip-same-args",
        action="store_true",
        help="no vLLM server side with chatpipe's engine args",
    )
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument(
        "--streams",
        type=_ints,
        default=(100, 200, 300, 400, 500),
        help="capacity levels (concurrent SSE streams)",
    )
    parser.add_argument(
        "--stream-rate", type=float, default=20.0, help="capacity: tokens/s per stream"
    )
    parser.add_argument(
        "--hold", type=float, default=6.0, help="capacity: seconds each stream lasts"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="capacity: seconds the stack's idle CPU is measured (0: skip)",
    )
    parser.add_argument(
        "--probes",
        type=int,
        default=10,
        help="capacity: requests one at a time after the idle spell (0: skip)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait at most for other processes to go quiet "
        "before each phase (0: do not wait)",
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=14.0,
        help="minutes into the run after which nothing waits for quiet or "
        "runs a level again (bounds the run's time)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=2,
        help="runs per level on every side; the one with the most tokens/s is kept",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a chatpipe setting for the chatpipe side",
    )
    return parser.parse_args(argv)


async def full_run(args: argparse.Namespace, command: str) -> BenchRun:
    started = time.monotonic()
    cfg = EngineConfig(model=args.model, vllm_args=args.vllm_args)
    patient_until = started + args.patience * 60
    workload = Workload(
        levels=args.levels,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        disconnects=args.disconnects,
        runs=args.runs,
        quiet_wait_s=min(args.quiet_wait, 15.0),
        patient_until=patient_until,
    )
    host = machine()
    run = BenchRun(command, host["date"], host, cfg, workload, chatpipe_engine=args.engine)
    logs = Path(tempfile.mkdtemp(prefix="chatpipe-bench-"))
    log.info("logs in %s", logs)
    settings = dict(args.settings)
    vllm = args.engine == "vllm" and not args.skip_vllm
    if vllm:
        await _quiet(args, patient_until)
        side = await _phase(run, "vLLM server", vllm_side(cfg, workload, logs / "vllm"))
        run.sides += [side] if side else []
    await _quiet(args, patient_until)
    side = await _phase(
        run, "chatpipe up", chatpipe_side(cfg, workload, logs / "chatpipe", args.engine, **settings)
    )
    run.sides += [side] if side else []
    if vllm and not args.skip_same_args:
        await _quiet(args, patient_until)
        side = await _phase(
            run,
            "vLLM server, chatpipe's engine args",
            vllm_side(cfg, workload, logs / "vllm-same-args", same_args=True),
        )
        run.sides += [side] if side else []
    if not args.skip_capacity:
        plan = CapacityPlan(
            streams=args.streams,
            tokens_per_s=args.stream_rate,
            hold_s=args.hold,
            quiet_wait_s=min(args.quiet_wait, 15.0),
            patient_until=patient_until,
            idle_s=args.idle_seconds,
            probes=args.probes,
        )
        await _quiet(args, patient_until)
        run.capacity = await _phase(run, "capacity", capacity(plan, logs / "capacity", **settings))
    run.duration_s = time.monotonic() - started
    return run


async def _phase(run: BenchRun, name: str, phase: Awaitable[T]) -> T | None:
    """A phase that fails is reported, and the run goes on with the next one."""
    try:
        return await phase
    except Exception as exc:
        log.exception("%s failed", name)
        run.failures.append(f"{name}: {type(exc).__name__}: {exc}")
        return None


async def _quiet(args: argparse.Namespace, patient_until: float) -> None:
    """On a shared machine, start each phase when other work is quiet (bounded wait)."""
    left = patient_until - time.monotonic()
    if args.quiet_wait > 0 and left > 0:
        foreign = await wait_for_quiet(min(args.quiet_wait, left))
        log.info("other processes use %.2f cores now", foreign)


def smoke_args(args: argparse.Namespace) -> argparse.Namespace:
    """A run of seconds: sim engine, two small levels, a few disconnects, one capacity level."""
    args.engine, args.levels, args.rounds, args.max_tokens = "sim", (1, 4), 2, 16
    args.disconnects, args.streams, args.stream_rate, args.hold = 6, (20,), 20.0, 2.0
    args.quiet_wait, args.runs, args.idle_seconds, args.probes = 0.0, 1, 2.0, 2
    args.settings = [("sim_tokens_per_s", "200"), ("kafka_idle_after_s", "1"), *args.settings]
    return args


async def profile_run(args: argparse.Namespace) -> Path:
    """Each stage under pyinstrument while one capacity level runs; --out/PROFILE.md."""
    work = Path(tempfile.mkdtemp(prefix="chatpipe-profile-"))
    plan = CapacityPlan(streams=args.streams[:1], tokens_per_s=args.stream_rate, hold_s=args.hold)
    await capacity(plan, work, profiler_command(), work, **dict(args.settings))
    return write_summary(work, STAGES, args.out / "PROFILE.md")


async def capacity_run(args: argparse.Namespace) -> str:
    """The capacity phase alone, with the idle stack's cost; --out/capacity.md."""
    plan = CapacityPlan(
        streams=args.streams,
        tokens_per_s=args.stream_rate,
        hold_s=args.hold,
        quiet_wait_s=min(args.quiet_wait, 15.0),
        idle_s=args.idle_seconds,
        probes=args.probes,
    )
    logs = Path(tempfile.mkdtemp(prefix="chatpipe-capacity-"))
    text = summary(await capacity(plan, logs, **dict(args.settings)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "capacity.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # thousands of sockets
    if argv[:1] == ["scheduler_sim"]:
        from bench.scheduler_sim import cli as scheduler_sim

        scheduler_sim(argv[1:])
        return
    if argv[:1] == ["capacity_model"]:
        from bench.capacity_model import main as capacity_model

        capacity_model(argv[1:])
        return
    if argv[:1] == ["response_cache"]:
        from bench.response_cache import cli as response_cache

        response_cache(argv[1:])
        return
    if argv[:1] == ["gateway"]:
        from bench.gateway_streams import cli as gateway_streams

        gateway_streams(argv[1:], BENCH_DIR)
        return
    if argv[:1] == ["soak"]:
        from bench.soak import cli as soak

        soak(argv[1:], BENCH_DIR)
        return
    if argv[:1] == ["broker_clients"]:
        from bench.broker_clients import cli as broker_clients

        broker_clients(argv[1:])
        return
    if argv[:1] == ["seed"]:
        from bench.seed import cli as seed

        seed(argv[1:], BENCH_DIR)
        return
    if argv[:1] == ["prompt_build"]:
        from bench.prompt_build import cli as prompt_build

        prompt_build(argv[1:])
        return
    if argv[:1] == ["sampling_defaults"]:
        from bench.sampling_defaults import cli as sampling_defaults

        sampling_defaults(argv[1:])
        return
    if argv[:1] == ["differentiators"]:
        from bench.differentiators.suite import main as differentiators

        differentiators(argv[1:], BENCH_DIR)
        return
    if argv[:1] == ["retrieval"]:
        from bench.retrieval import cli as retrieval

        retrieval(argv[1:], BENCH_DIR)
        return
    args = parse_args(argv)
    if args.mode == "profile":
        print(f"profile summary in {asyncio.run(profile_run(args))}")
        return
    if args.mode == "capacity":
        print(asyncio.run(capacity_run(args)))
        return
    if args.mode == "faults":
        from bench.faults import main as faults

        faults(args.out)
        return
    if args.mode == "smoke":
        args = smoke_args(args)
    command = shlex.join([".venv/bin/python", "-m", "bench", *argv])
    run = asyncio.run(full_run(args, command))
    path = write(run, args.out)
    print(f"results in {path} ({run.duration_s / 60:.1f} min)")
    if run.failures:
        raise SystemExit("failed: " + "; ".join(run.failures))


if __name__ == "__main__":
    main()
