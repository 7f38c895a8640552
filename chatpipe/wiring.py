"""Wiring in one place: every dependency is built here from one Settings object."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import secrets
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from billing.stage import BillingStage
from bus.broker import EmbeddedBroker, free_port
from bus.clients import KafkaConfig, drop_pending_writes
from bus.request_reply import RequestReplyClient
from bus.topics import TopicLayout, create_topics, ensure_topics
from chatpipe.api_keys import development_settings, key_secret, require_key_secret
from chatpipe.model_files import check_model_dir
from chatpipe.settings import Settings
from chatpipe.supervise import (
    Pause,
    SpinWatch,
    Supervisor,
    broker_kept_up,
    restart_a_spinning_broker,
)
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey, ConversationStore
from gateway.admission.concurrency import ConcurrencyGate, lease_ttl_s
from gateway.admission.quotas import QuotaGate
from gateway.admission.rate_limits import RateLimiter, per_process
from gateway.app import GatewayDeps, create_app
from gateway.cache.cached_pipeline import CachedPipeline
from gateway.config import (
    GatewayConfig,
    ServerToolsConfig,
)
from gateway.context.builder import ContextBuilder
from gateway.edge.slow_clients import guarded_protocol
from gateway.pipeline import Pipeline
from gateway.rollout import ModelAliases
from gateway.streaming.relay import KafkaPipeline
from ledger.store import SQLiteLedger, UsageLedger
from moderation.policy import SafetyPolicy, build_policy
from ops.metrics import metrics_app
from ops.runtime_file import published_run
from ops.tracing import setup_tracing, shutdown_tracing
from recorder.stage import RecorderStage
from retrieval.documents import Documents
from safety.stage import SafetyStage
from scheduler.core import Policy
from scheduler.shards import Shard
from scheduler.stage import SchedulerStage
from servertools import catalog
from servertools.calculator import Calculator
from servertools.clock import Clock
from servertools.documents import SearchDocuments
from servertools.stage import ToolsStage
from servertools.toolbox import ServerTool, Toolbox
from workers.engine import Engine
from workers.stage import WorkerStage

log = logging.getLogger("chatpipe")

DEV_USER = "dev"


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


async def open_kafka(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    own_topics: Mapping[str, int] | None = None,
    pause: Pause = contextlib.nullcontext,
    idle: Callable[[], bool] | None = None,
) -> KafkaConfig:
    """The configured Kafka, or an embedded broker living as long as `stack`. That one is
    started again on its port whenever it exits, empty (it keeps nothing on disk), with the shared
    topics and `own_topics` (read then) created again; `pause()` is held meanwhile. With
    `idle` (nothing streams), it is also restarted when it spins while idle
    (`embedded_broker_spin_cpu`)."""
    bootstrap = settings.kafka.bootstrap_servers
    if bootstrap:
        kafka = settings.kafka.client(bootstrap)
    else:
        broker = await stack.enter_async_context(EmbeddedBroker())
        # The embedded broker has no users: it listens on loopback only (bus.broker).
        kafka = settings.kafka.model_copy(update={"security_protocol": "PLAINTEXT"}).client(
            broker.bootstrap_servers
        )
        await stack.enter_async_context(
            broker_kept_up(
                broker,
                lambda: create_topics(
                    kafka,
                    {**topic_layout(settings).partitions(), **(own_topics or {})},
                    settings.kafka.replication_factor,
                ),
                pause,
            )
        )
        if idle is not None and settings.kafka.embedded_broker_spin_cpu > 0:
            watch = SpinWatch(settings.kafka.embedded_broker_spin_cpu,
                              settings.kafka.embedded_broker_spin_s)  # fmt: skip
            watching = asyncio.create_task(
                restart_a_spinning_broker(lambda: broker.pid, idle, watch), name="broker-spin"
            )
            stack.push_async_callback(_cancelled, watching)
    await ensure_topics(kafka, topic_layout(settings))
    return kafka


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def kafka_from_settings(settings: Settings, bootstrap_servers: str) -> KafkaConfig:
    """The broker at `bootstrap_servers`, with this process's credential and tuning."""
    return settings.kafka.client(bootstrap_servers)


def topic_layout(settings: Settings) -> TopicLayout:
    return settings.topics.layout(
        settings.kafka.replication_factor, shards=tuple(settings.scheduler.scheduler_shards)
    )


def check_models(settings: Settings, *, weights: bool) -> None:
    """Raise `ModelFileError` unless the served model's directory holds what this process
    loads (`weights`: an engine's; else a gateway's tokenizer), and each tokenizer the
    gateway counts another model's prompts with does."""
    from chatpipe import default_model, tiny_model

    rebuilds = {
        default_model.DEFAULT_MODEL_DIR: default_model.REBUILD,
        tiny_model.TINY_MODEL_DIR: tiny_model.REBUILD,
    }
    served = settings.inference.model
    check_model_dir(served, weights=weights, rebuild=rebuilds.get(served))
    for tokenizer in settings.context.context_tokenizers.values():
        check_model_dir(tokenizer, weights=False, rebuild=rebuilds.get(tokenizer))


def build_engine(settings: Settings) -> Engine:
    engine = settings.inference
    if engine.engine == "sim":
        from workers.sim_engine import SimEngine

        return SimEngine(
            engine.model_name,
            engine.max_slots,
            engine.sim_tokens_per_s,
            engine.sim_prompt_tokens_per_s,
        )
    from workers.vllm_engine import VllmEngine

    return VllmEngine(
        engine.model, engine.model_name, engine.vllm_args, tool_parser=engine.tool_parser
    )


def build_store(settings: Settings) -> ConversationStore:
    store = settings.storage
    if store.store == "cassandra":
        from conversations.cassandra_store import CassandraStore

        return CassandraStore(
            store.cassandra_hosts,
            store.cassandra_keyspace,
            create_schema=store.cassandra_create_schema,
            replication_factor=store.cassandra_replication_factor,
            key_secret=key_secret(settings),
        )
    return SQLiteStore(store.database_path, key_secret=key_secret(settings))


def build_ledger(settings: Settings) -> UsageLedger:
    """The usage ledger billing writes and the gateway's quotas read, beside the
    conversation store: its SQLite file, or its Cassandra keyspace."""
    store = settings.storage
    if store.store == "cassandra":
        from ledger.cassandra import CassandraLedger

        return CassandraLedger(
            store.cassandra_hosts,
            store.cassandra_keyspace,
            create_schema=store.cassandra_create_schema,
            replication_factor=store.cassandra_replication_factor,
        )
    return SQLiteLedger(store.database_path)


def gateway_pipeline(kafka: KafkaConfig, settings: Settings) -> KafkaPipeline:
    """A gateway's Kafka side, keeping its model aliases current from chat.rollout."""
    return KafkaPipeline(
        kafka,
        settings.gateway.gateway_id,
        heartbeat_interval_s=settings.worker.heartbeat_interval_s,
        aliases=ModelAliases(settings.scheduler.model_aliases, settings.models),
    )


def safety_policy(
    settings: Settings, client: RequestReplyClient | None, *, output_only: bool = False
) -> SafetyPolicy:
    """The classifiers of the input and output checks, made once per process (the
    embedding model loads once); the judge, input only, asks through `client` (a
    gateway's, started). A safety stage run alone builds the output check only."""
    safety = settings.safety
    if output_only:
        safety = safety.model_copy(update={"input_classifiers": {}})
    if not safety.judge_model and any(
        "judge" in names for names in safety.input_classifiers.values()
    ):
        raise ValueError(
            "CHATPIPE_SAFETY_INPUT_CLASSIFIERS names the judge: "
            "set CHATPIPE_SAFETY_JUDGE_MODEL, the model it asks"
        )
    ask = None
    if safety.judge_model and client is not None:
        from safety.judge import judge_ask

        ask = judge_ask(client, safety.judge_model)
    return build_policy(safety.policy_config(), ask)


def gateway_config(settings: Settings) -> GatewayConfig:
    """What the gateway reads of the settings."""
    gateway, context = settings.gateway, settings.context
    tools = settings.tools
    return GatewayConfig(
        limits=gateway.limits(
            settings.models, settings.inference.model_name, settings.scheduler.tier_models
        ),
        context=context.config(
            default_window_tokens=settings.inference.context_length(),
            default_tokenizer=settings.inference.model,
            small_model=settings.scheduler.small_model,
        ),
        rate_limits=settings.rate_limits.rate_limits(),
        quotas=settings.rate_limits.quotas(),
        request_timeout_s=gateway.request_timeout_s,
        stream_stall_s=gateway.stream_stall_s,
        resume_grace_s=gateway.resume_grace_s,
        max_body_bytes=gateway.max_body_bytes,
        body_read_timeout_s=gateway.body_read_timeout_s,
        auto_titles=context.auto_titles,
        files=settings.files.limits(),
        response_cache=gateway.response_cache(context.system_prompt),
        server_tools=ServerToolsConfig(
            tools=catalog.specs(tools.server_tools), max_rounds=tools.max_tool_rounds
        ),
        max_embedding_inputs=settings.embeddings.max_embedding_inputs,
        concurrency=settings.rate_limits.concurrency(lease_ttl_s(gateway.stream_stall_s)),
    )


def build_gateway_deps(
    settings: Settings,
    store: ConversationStore,
    pipeline: KafkaPipeline,
    ledger: UsageLedger,
    safety: SafetyPolicy,
) -> GatewayDeps:
    config = gateway_config(settings)
    context = ContextBuilder.from_config(config.context)
    cached = config.response_cache
    served: Pipeline = (CachedPipeline(pipeline, pipeline, store, cached, safety.output_policy)
                        if cached.ttl_s > 0 else pipeline)  # fmt: skip
    return GatewayDeps(
        config,
        store,
        served,
        context,
        rate_limiter=RateLimiter.from_config(config.rate_limits),
        quotas=QuotaGate.from_config(config.quotas, ledger),
        concurrency=ConcurrencyGate.from_config(config.concurrency, store.get_org_settings),
        safety=safety,
        aliases=pipeline.aliases,
        documents=Documents(store, context.embedding_model, config.files),
    )


DEV_KEY_NAME = "development key"


async def ensure_dev_key(store: ConversationStore, settings: Settings) -> str:
    """The development API key of user `dev` in org `dev`: CHATPIPE_DEV_API_KEY, or a
    new random one. Run by `chatpipe up` always, by a gateway run alone only when
    CHATPIPE_DEV_API_KEY is set: nothing else creates the dev user.

    The development keys stored before (an earlier start's random key, or an earlier
    CHATPIPE_DEV_API_KEY) are revoked: only the key printed last opens."""
    key = settings.gateway.dev_api_key or f"cp-dev-{secrets.token_urlsafe(18)}"
    await store.add_api_key(
        key,
        ApiKey(
            user_id=DEV_USER, org_id=DEV_USER, tier=settings.gateway.default_tier, name=DEV_KEY_NAME
        ),
    )
    current = await store.find_api_key(key)
    if current is not None and current.revoked_at is not None:
        log.warning("the development key (CHATPIPE_DEV_API_KEY) was revoked: choose another")
    for old in await store.list_api_keys():
        if (old.name == DEV_KEY_NAME and (old.user_id, old.org_id) == (DEV_USER, DEV_USER)
                and old.revoked_at is None and current is not None
                and old.key_id != current.key_id):  # fmt: skip
            await store.revoke_api_key(old.key_id)
    return key


def worker_stage(kafka: KafkaConfig, engine: Engine, settings: Settings) -> WorkerStage:
    shard = settings.shard_of(settings.inference.model_name)
    return WorkerStage(kafka, engine, settings.worker.config(shard))


def safety_stage(kafka: KafkaConfig, settings: Settings, policy: SafetyPolicy) -> SafetyStage:
    config = settings.safety.stage_config(settings.gateway.generation_idle_timeout_s)
    return SafetyStage(kafka, policy, config)


def build_documents(settings: Settings, store: ConversationStore) -> Documents:
    """A user's files searched (retrieval), outside a gateway: the tools stage's."""
    config = gateway_config(settings)
    return Documents(
        store, ContextBuilder.from_config(config.context).embedding_model, config.files
    )


def tools_stage(
    kafka: KafkaConfig, settings: Settings, store: ConversationStore, documents: Documents
) -> ToolsStage:
    """The chat.tools stage with the server tools an operator turned on."""
    built: dict[str, Callable[[], ServerTool]] = {
        "calculator": Calculator,
        "clock": Clock,
        "search_documents": lambda: SearchDocuments(store, documents),
    }
    tools = settings.tools
    searches = "search_documents" in tools.server_tools
    return ToolsStage(
        kafka,
        Toolbox([built[name]() for name in tools.server_tools], tools.server_tool_timeout_s),
        warm_up=documents.warm_up if searches else None,
    )


def recorder_stage(
    kafka: KafkaConfig, store: ConversationStore, settings: Settings
) -> RecorderStage:
    return RecorderStage(kafka, store, settings.gateway.generation_idle_timeout_s)


def scheduling_policy(settings: Settings, shard: Shard = Shard()) -> Policy:
    """The policy of `shard`'s scheduler: routes between models stay inside the shard."""
    return settings.scheduler.policy(
        shard.decides,
        worker_lost_after_s=settings.worker.worker_lost_after_s,
        # A gateway's heartbeats stop, then clients have the resume grace to come back.
        gateway_grace_s=settings.gateway.resume_grace_s + 2 * settings.worker.heartbeat_interval_s,
    )


def scheduler_stage(
    kafka: KafkaConfig, settings: Settings, shard: str | None = None, *, alone: bool = False
) -> SchedulerStage:
    """The scheduler of `shard` (default: the settings' `scheduler_shard`), in a process
    of its own (`alone`) or beside the other stages. Only the unnamed shard's deletes the
    delivery topics of gone gateways (one janitor)."""
    scheduler = settings.scheduler
    of = Shard.of(scheduler.scheduler_shards, scheduler.scheduler_shard if shard is None else shard)
    return SchedulerStage(
        kafka,
        scheduling_policy(settings, of),
        deliver_topic_ttl_s=0.0 if of.name else settings.gateway.deliver_topic_ttl_s,
        shard=of,
        gc_freeze_s=scheduler.gc_freeze_s(alone),
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside chatpipe's loop: signals are chatpipe's, which stops every stage."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def gateway_server(
    deps: GatewayDeps, settings: Settings, *, docs_by_default: bool = True
) -> uvicorn.Server:
    """The gateway's HTTP server: headers bounded in time (`header_read_timeout_s`),
    bodies by the app; /docs and /openapi.json with `api_docs` (unset: `docs_by_default`,
    on under `chatpipe up`, off for a gateway run alone)."""
    gateway = settings.gateway
    api_docs = docs_by_default if gateway.api_docs is None else gateway.api_docs
    config = uvicorn.Config(
        create_app(deps, api_docs=api_docs),
        host=gateway.host,
        port=gateway.port,
        log_level="warning",
        lifespan="on",
        http=guarded_protocol(gateway.header_read_timeout_s),
    )
    return _EmbeddedServer(config)


@contextlib.asynccontextmanager
async def serving_metrics(port: int) -> AsyncIterator[None]:
    """This process's Prometheus metrics (ops.metrics) at /metrics on `port`, on every
    interface, while the context lasts: a stage run alone, for a scraper to reach."""
    server = _EmbeddedServer(
        uvicorn.Config(
            metrics_app(), host="0.0.0.0", port=port, log_level="warning", lifespan="off"
        )
    )
    task = asyncio.create_task(server.serve(), name="metrics")
    try:
        yield
    finally:
        server.should_exit = True
        await asyncio.wait([task], timeout=5)


async def _until_stopped(tasks: dict[str, asyncio.Task[None]]) -> None:
    """Wait for Ctrl-C/SIGTERM, or for a stage to end (it failed: say why)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait(
            [stopper, *tasks.values()], return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stopper.cancel()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    for task in done - {stopper}:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s stopped: %r", task.get_name(), task.exception())
    log.info("stopping")


@dataclass
class Stack:
    settings: Settings
    kafka: KafkaConfig
    store: ConversationStore
    pipeline: KafkaPipeline
    engine: Engine | None
    api_key: str
    tasks: dict[str, asyncio.Task[None]]
    gateway: FastAPI
    """The gateway's app (`app.state.deps`: what its routes are served with)."""

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.gateway.host}:{self.settings.gateway.port}"


@contextlib.asynccontextmanager
async def running_stack(settings: Settings, engine: Engine | None) -> AsyncIterator[Stack]:
    """Start everything around an already started engine; stop it all on exit.

    With `engine=None` no worker runs in this process (workers run elsewhere)."""
    if settings.gateway.port == 0:
        settings = settings.replace(port=free_port(settings.gateway.host))
    settings = development_settings(settings)  # the key secret (chatpipe.api_keys)
    async with contextlib.AsyncExitStack() as stack:
        supervisor = Supervisor()
        delivery_topic: dict[str, int] = {}  # once the pipeline has one
        shards = {
            shard: f"scheduler-{shard}" if shard else "scheduler"
            for shard in ("", *settings.scheduler.scheduler_shards)
        }  # one scheduler each
        kafka_stages = (*shards.values(), "safety", "recorder", "billing", "tools", "worker")
        pipelines: list[KafkaPipeline] = []

        @contextlib.asynccontextmanager
        async def broker_restarting() -> AsyncIterator[None]:
            """The broker died with every record: the gateway ends the streams it relays
            (error `answer_lost`) and refuses new requests, every producer drops what it
            held for the dead broker, the stages stop while the broker restarts; then the
            gateway reads its topics again from their new start and takes requests (with
            a new producer), and new stages start."""
            for pipeline in pipelines:
                lost = pipeline.bus_lost()
                log.warning("the broker died: %d open streams end with answer_lost", lost)
            # What producers still hold for the dead broker is dropped, before the stages
            # stop (their producers' last flush) and again once they have.
            dropped = await drop_pending_writes(kafka.bootstrap_servers)
            async with supervisor.paused(kafka_stages):
                dropped += await drop_pending_writes(kafka.bootstrap_servers)
                log.warning("the broker died: %d records not yet written are dropped", dropped)
                yield
                for pipeline in pipelines:
                    await pipeline.bus_back()

        kafka = await open_kafka(
            settings, stack, delivery_topic, broker_restarting,
            idle=lambda: all(p.open_streams == 0 for p in pipelines),
        )  # fmt: skip
        store = build_store(settings)
        await store.open()
        stack.push_async_callback(store.close)
        api_key = await ensure_dev_key(store, settings)
        ledger = build_ledger(settings)
        await ledger.open()
        stack.push_async_callback(ledger.close)
        pipeline = await stack.enter_async_context(gateway_pipeline(kafka, settings))
        pipelines.append(pipeline)
        delivery_topic[pipeline.reply_to] = pipeline.partitions
        policy = safety_policy(settings, pipeline.requests)  # one for input and output
        deps = build_gateway_deps(settings, store, pipeline, ledger, policy)
        server = supervisor.start(
            "gateway", lambda: gateway_server(deps, settings), uvicorn.Server.serve
        )
        schedulers = {
            shard: supervisor.start(
                name, functools.partial(scheduler_stage, kafka, settings, shard)
            )
            for shard, name in shards.items()
        }
        scheduler = schedulers[settings.shard_of(settings.inference.model_name)]
        supervisor.start("safety", lambda: safety_stage(kafka, settings, policy))
        supervisor.start("recorder", lambda: recorder_stage(kafka, store, settings))
        supervisor.start("billing", lambda: BillingStage(kafka, ledger))
        supervisor.start(
            "tools",
            lambda: tools_stage(
                kafka, settings, store, deps.documents or build_documents(settings, store)
            ),
        )
        if engine is not None:
            supervisor.start("worker", lambda: worker_stage(kafka, engine, settings))
        try:
            await _until_ready(
                server, scheduler, supervisor.tasks, expect_worker=engine is not None
            )
            supervisor.restarting = True
            app = server.config.app
            assert isinstance(app, FastAPI), "gateway_server serves create_app's FastAPI app"
            yield Stack(
                settings,
                kafka,
                store,
                pipeline,
                engine,
                api_key,
                supervisor.tasks,
                app,
            )
        finally:
            supervisor.restarting = False
            supervisor.stages["gateway"].should_exit = True
            await asyncio.wait([supervisor.tasks["gateway"]], timeout=5)
            await supervisor.stop()


GC_THRESHOLDS = (7_000, 10, 10)
"""The collector's thresholds in every stage process once started: a tenth as often as
CPython's default (`python -m bench scheduler_sim` runs with them too)."""


def _freeze_startup_objects() -> None:
    """Once a process has started: what start-up loaded (libraries, tokenizers, the
    engine's front end) lives as long as the process, so the collector skips it, and runs
    a tenth as often (streamed events make few reference cycles). At 1,500 streams a
    gateway's collections over all of it were the p99 pause between events."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _until_ready(
    server: uvicorn.Server,
    scheduler: SchedulerStage | None,
    tasks: dict[str, asyncio.Task[None]],
    expect_worker: bool,
    timeout_s: float = 180.0,
) -> None:
    """The gateway listens and, with an in-process worker, the scheduler has seen it
    take its chat.work partitions (a consumer-group join takes seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not server.started or (
        expect_worker
        and scheduler is not None
        and not any(w.partitions for w in scheduler.core.workers.values())
    ):
        for task in tasks.values():
            if task.done():
                task.result()
                raise RuntimeError(f"{task.get_name()} stopped during start-up")
        if loop.time() > deadline:
            raise TimeoutError("the pipeline did not become ready")
        await asyncio.sleep(0.05)


async def run_all(settings: Settings) -> None:
    """`chatpipe up`: broker (unless external), every stage and the gateway, one process."""
    _configure_logging()
    check_models(settings, weights=settings.inference.engine == "vllm")
    settings = development_settings(settings)  # before the engine loads: may refuse
    setup_tracing(settings.tracing.otlp_endpoint)
    engine = build_engine(settings)
    await engine.start()
    try:
        async with running_stack(settings, engine) as stack:
            _freeze_startup_objects()
            print(f"chatpipe is up: {stack.base_url}/  API key: {stack.api_key}", flush=True)
            with published_run(
                settings.storage.database_path,
                stack.kafka.bootstrap_servers,
                stack.base_url,
                not settings.kafka.bootstrap_servers,
            ):
                await _until_stopped(stack.tasks)
    finally:
        await engine.stop()
        shutdown_tracing()  # exports the spans still buffered


async def run_stage(stage: str, settings: Settings) -> None:
    """One stage in its own process, against the Kafka in KAFKA_BOOTSTRAP_SERVERS."""
    _configure_logging()
    if not settings.kafka.bootstrap_servers:
        raise SystemExit("set KAFKA_BOOTSTRAP_SERVERS to run a single stage")
    if stage in ("gateway", "worker"):
        check_models(settings, weights=stage == "worker" and settings.inference.engine == "vllm")
    if stage == "gateway":  # it checks API keys; no development secret outside chatpipe up
        require_key_secret(settings, "chatpipe gateway")
        if (unshared := per_process(settings.rate_limits.rate_limit_storage)) is not None:
            log.warning("%s", unshared)  # a gateway run alone is one of many
    async with contextlib.AsyncExitStack() as stack:
        if setup_tracing(settings.tracing.otlp_endpoint):
            stack.callback(shutdown_tracing)
        kafka = await open_kafka(settings, stack)
        if settings.gateway.metrics_port is not None:
            await stack.enter_async_context(serving_metrics(settings.gateway.metrics_port))
        runners: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "scheduler": lambda: scheduler_stage(kafka, settings, alone=True).run(),
        }
        server: uvicorn.Server | None = None
        if stage == "safety":
            policy = safety_policy(settings, None, output_only=True)
            runners["safety"] = lambda: safety_stage(kafka, settings, policy).run()
        if stage in ("gateway", "billing"):
            ledger = build_ledger(settings)
            await ledger.open()
            stack.push_async_callback(ledger.close)
            runners["billing"] = lambda: BillingStage(kafka, ledger).run()
        if stage in ("gateway", "recorder", "tools"):
            store = build_store(settings)
            await store.open()
            stack.push_async_callback(store.close)
            if stage == "recorder":
                runners["recorder"] = lambda: recorder_stage(kafka, store, settings).run()
            elif stage == "tools":
                runners["tools"] = lambda: tools_stage(
                    kafka, settings, store, build_documents(settings, store)
                ).run()
            else:
                if settings.gateway.dev_api_key:  # the dev user only when asked for
                    await ensure_dev_key(store, settings)
                pipeline = await stack.enter_async_context(gateway_pipeline(kafka, settings))
                deps = build_gateway_deps(
                    settings, store, pipeline, ledger, safety_policy(settings, pipeline.requests)
                )
                server = gateway_server(deps, settings, docs_by_default=False)
                runners["gateway"] = server.serve
        worker: WorkerStage | None = None
        if stage == "worker":
            engine = build_engine(settings)
            await engine.start()
            stack.push_async_callback(engine.stop)
            worker = worker_stage(kafka, engine, settings)
            runners["worker"] = worker.run
        task = asyncio.create_task(runners[stage](), name=stage)
        if server is not None:
            await _until_ready(server, None, {stage: task}, expect_worker=False)
        _freeze_startup_objects()
        try:
            await _until_stopped({stage: task})
            if worker is not None and not task.done():
                await worker.drain(settings.worker.drain_timeout_s)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
