"""The distributed deployment (Dockerfile, docker-compose.yml, k8s/) stays true to the code.

No Docker engine or cluster runs here, so the files are checked as data: every
chatpipe container runs a real CLI command with real options, its environment is
made of Settings fields whose values validate, every stage is deployed in both,
the worker gets a GPU, every process that loads a model directory (the worker's
weights, the gateway's tokenizers) mounts it read-only from the models volume,
and every topic named is a real one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from chatpipe.cli import STAGES, app
from chatpipe.settings import SETTINGS, Settings
from conversations.sqlite_store import SQLiteStore
from gateway.app import create_app
from schemas import topics
from tests.support.deployment import (
    COMPOSE_FILE,
    IMAGE,
    K8S_DIR,
    ROOT,
    Container,
    Mount,
    accepted_env_names,
    compose,
    compose_containers,
    is_chatpipe_image,
    k8s_documents,
    k8s_env,
    k8s_objects,
    settings_from,
)
from tests.support.gateway import ScriptedPipeline, gateway_deps

DOCKERFILE = ROOT / "Dockerfile"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
# Fields whose default is a fresh random id: one shared value would make pods collide.
PER_POD_IDS = ("gateway_id", "worker_id")
MIN_WEIGHT_LOADING_S = 600
# The compose volume and the k8s PersistentVolumeClaim holding the model directories.
MODELS_VOLUME = "models"


# --- loading ---------------------------------------------------------------------------


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in k8s_objects(kind) if doc["metadata"]["name"] == name]
    return found


def chatpipe_env() -> dict[str, str]:
    """The settings every chatpipe pod shares (configmap.yaml)."""
    return k8s_object("ConfigMap", "chatpipe-env")["data"]


def k8s_mounts(container: dict[str, Any], pod: dict[str, Any]) -> tuple[Mount, ...]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = []
    for mount in container.get("volumeMounts", []):
        assert mount["name"] in volumes, f"volumeMount of no pod volume: {mount['name']}"
        claim = volumes[mount["name"]].get("persistentVolumeClaim") or {}
        read_only = bool(mount.get("readOnly") or claim.get("readOnly"))
        mounts.append(Mount(claim.get("claimName", ""), Path(mount["mountPath"]), read_only))
    return tuple(mounts)


def k8s_containers() -> list[Container]:
    containers = []
    for _, doc in k8s_documents():
        if doc.get("kind") not in WORKLOAD_KINDS:
            continue
        pod = doc["spec"]["template"]["spec"]
        owner = f"{doc['kind']}/{doc['metadata']['name']}"
        for spec in [*pod.get("initContainers", []), *pod["containers"]]:
            if not is_chatpipe_image(spec.get("image")):
                continue
            args = [*spec.get("command", []), *spec.get("args", [])]
            if args[:1] == [IMAGE]:
                args = args[1:]
            pod_name = f"{doc['metadata']['name']}-7d4b9c-x2x5q"
            containers.append(
                Container(
                    f"k8s {owner}",
                    doc["kind"],
                    tuple(args),
                    k8s_env(spec, pod_name),
                    spec,
                    k8s_mounts(spec, pod),
                )
            )
    return containers


def all_containers() -> list[Container]:
    return [*compose_containers(), *k8s_containers()]


def by_where(containers: list[Container]) -> Any:
    return pytest.mark.parametrize("container", containers, ids=[c.where for c in containers])


# --- what the code accepts -----------------------------------------------------------------


def resolve_cli(args: tuple[str, ...]) -> dict[str, Any]:
    """Parse `chatpipe *args` as the CLI would, without running it; returns its options.

    Typer ships its own copy of click, so groups are told apart by their `commands`.
    """
    command = typer.main.get_command(app)
    rest = list(args)
    path = ["chatpipe"]
    while hasattr(command, "commands"):
        assert rest, f"`{' '.join(path)}` needs a subcommand"
        name = rest.pop(0)
        assert name in command.commands, f"`{' '.join(path)}` has no command {name!r}"
        command = command.commands[name]
        path.append(name)
    return command.make_context(" ".join(path), rest).params  # raises on a bad option


def cli_overrides(container: Container) -> dict[str, Any]:
    """The CLI options that override Settings fields (`worker --engine sim`)."""
    params = resolve_cli(container.args)
    return {k: v for k, v in params.items() if v is not None and k in SETTINGS}


def container_settings(container: Container, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return settings_from(container.env, monkeypatch, **cli_overrides(container))


def env_field(settings_field: str) -> str:
    return f"{Settings.model_config['env_prefix']}{settings_field}".upper()


# --- the checks ----------------------------------------------------------------------------


def test_the_files_are_found_and_hold_chatpipe_processes() -> None:
    assert len(compose_containers()) >= len(STAGES)
    assert len(k8s_containers()) >= len(STAGES)
    assert sum(len(c.env) for c in all_containers()) > 0
    assert DOCKERFILE.is_file()


@by_where(all_containers())
def test_each_container_runs_an_existing_cli_command(container: Container) -> None:
    resolve_cli(container.args)


def test_every_stage_is_deployed_in_compose_and_k8s() -> None:
    in_compose = {c.command for c in compose_containers()}
    in_k8s = {c.command for c in k8s_containers() if c.kind == "Deployment"}
    assert set(STAGES) <= in_compose, f"no compose service for {set(STAGES) - in_compose}"
    assert set(STAGES) <= in_k8s, f"no k8s Deployment for {set(STAGES) - in_k8s}"


@by_where(all_containers())
def test_env_vars_are_settings_fields(container: Container) -> None:
    unknown = set(container.env) - set(accepted_env_names())
    assert not unknown, f"not a Settings field (chatpipe/settings.py): {sorted(unknown)}"
    not_strings = [
        name
        for name, value in container.env.items()
        if value is not None and not isinstance(value, str)
    ]
    assert not not_strings, f"quote these values (k8s and compose want strings): {not_strings}"


@by_where(all_containers())
def test_env_values_validate_as_settings(
    container: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = container_settings(container, monkeypatch)
    if container.command in STAGES or container.args[:1] == ("topics",):
        # Unset, a stage would refuse to start (only `chatpipe up` embeds a broker).
        assert settings.kafka.bootstrap_servers
    if container.command in ("gateway", "recorder"):
        assert settings.storage.store != "sqlite", "a SQLite file is private to one container"


def test_per_pod_ids_are_never_shared() -> None:
    id_vars = {env_field(name) for name in PER_POD_IDS}
    for configmap in k8s_objects("ConfigMap"):
        assert not id_vars & set(configmap.get("data", {})), configmap["metadata"]["name"]
    for container in compose_containers():  # `docker compose up --scale` copies the env
        assert not id_vars & set(container.env), container.where
    for container in k8s_containers():
        for item in container.spec.get("env", []):
            if item["name"] in id_vars:
                assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def worker(containers: list[Container]) -> Container:
    workers = [c for c in containers if c.command == "worker"]
    assert len(workers) == 1
    return workers[0]


def test_compose_worker_reserves_a_gpu_and_mounts_its_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = worker(compose_containers())
    devices = service.spec["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    settings = container_settings(service, monkeypatch)
    assert settings.inference.engine == "vllm"
    targets = [Path(volume.split(":")[1]) for volume in service.spec["volumes"]]
    assert any(settings.inference.model.is_relative_to(target) for target in targets)


def test_k8s_worker_requests_a_gpu_and_time_to_load_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    container = worker(k8s_containers())
    assert int(container.spec["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    startup = container.spec["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= MIN_WEIGHT_LOADING_S
    assert "readinessProbe" in container.spec
    settings = container_settings(container, monkeypatch)
    assert settings.inference.engine == "vllm"
    (deployment,) = [d for d in k8s_objects("Deployment") if d["metadata"]["name"] == "worker"]
    claims = {
        v["name"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    mounts = [Path(m["mountPath"]) for m in container.spec["volumeMounts"] if m["name"] in claims]
    assert any(settings.inference.model.is_relative_to(mount) for mount in mounts)


def test_k8s_gateway_probes_readiness_and_liveness_on_the_gateways_own_routes(
    tmp_path: Path,
) -> None:
    [gateway] = [c for c in k8s_containers() if c.command == "gateway"]
    probes = {probe: gateway.spec[probe]["httpGet"]["path"]
              for probe in ("readinessProbe", "livenessProbe")}  # fmt: skip
    assert probes == {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    deps = gateway_deps(Settings(), SQLiteStore(tmp_path / "c.db"), ScriptedPipeline())
    served = {getattr(route, "path", "") for route in create_app(deps).routes}
    assert set(probes.values()) <= served


DRAIN_MARGIN_S = 10  # the last heartbeat, commits and leaving the group after the drain


def test_workers_get_to_drain_before_they_are_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM drains a worker for CHATPIPE_DRAIN_TIMEOUT_S; the kill must come later."""
    service = worker(compose_containers())
    drain = container_settings(service, monkeypatch).worker.drain_timeout_s
    assert _seconds(service.spec["stop_grace_period"]) >= drain + DRAIN_MARGIN_S
    container = worker(k8s_containers())
    drain = container_settings(container, monkeypatch).worker.drain_timeout_s
    (deployment,) = [d for d in k8s_objects("Deployment") if d["metadata"]["name"] == "worker"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= drain + DRAIN_MARGIN_S


def _seconds(duration: str) -> float:
    """A compose duration such as "45s", "1m30s"."""
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


# What each stage reads from model directories as it starts (chatpipe/wiring.py
# run_stage). A new stage must be put in one of the two sets.
STAGES_READING_MODELS = {"gateway", "worker"}
STAGES_WITHOUT_MODELS = {"scheduler", "safety", "recorder", "billing", "tools"}


def model_dirs(container: Container, settings: Settings) -> dict[str, Path]:
    """Model name -> the directory `container` loads for it at start."""
    if container.command == "gateway":
        # ContextBuilder.warm_up: every served model's tokenizer and chat template.
        return {
            model: settings.context.context_tokenizers.get(model, settings.inference.model)
            for model in settings.models
        }
    if container.command == "worker" and settings.inference.engine == "vllm":
        return {settings.inference.model_name: settings.inference.model}  # weights and tokenizer
    return {}


def test_every_stage_says_whether_it_reads_model_directories() -> None:
    assert not STAGES_READING_MODELS & STAGES_WITHOUT_MODELS
    assert set(STAGES) == STAGES_READING_MODELS | STAGES_WITHOUT_MODELS


@by_where(all_containers())
def test_model_directories_are_set_and_mounted_read_only_from_the_models_volume(
    container: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = container_settings(container, monkeypatch)
    default = SETTINGS["model"].default
    for model, directory in model_dirs(container, settings).items():
        assert directory != default, (
            f"{container.where}: {model}'s directory left at the default {default}, which"
            f" no image has: set {env_field('model')} (or {env_field('context_tokenizers')})"
        )
        covering = [m for m in container.mounts if directory.is_relative_to(m.target)]
        assert covering, f"{container.where} loads {directory} but mounts nothing there"
        mount = max(covering, key=lambda m: len(m.target.parts))  # the innermost wins
        assert mount.source == MODELS_VOLUME, f"{container.where}: {directory} is on {mount}"
        assert mount.read_only, f"{container.where}: mount {mount.target} read-only"


@pytest.mark.parametrize("containers", [compose_containers, k8s_containers], ids=["compose", "k8s"])
def test_gateways_count_tokens_with_the_served_model(
    containers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateways = [c for c in containers() if c.command == "gateway"]
    served = worker(containers())
    assert gateways
    worker_settings = container_settings(served, monkeypatch).inference
    for gateway in gateways:
        settings = container_settings(gateway, monkeypatch)
        assert worker_settings.model_name in settings.models, gateway.where
        tokenizer = model_dirs(gateway, settings)[worker_settings.model_name]
        assert tokenizer == worker_settings.model, (
            f"{gateway.where} counts {worker_settings.model_name}'s tokens with {tokenizer},"
            f" the worker serves {worker_settings.model}"
        )


def test_compose_model_readers_wait_for_the_model_writers() -> None:
    def on_models(container: Container, read_only: bool) -> bool:
        return any(m.source == MODELS_VOLUME and m.read_only == read_only for m in container.mounts)

    containers = compose_containers()
    writers = {c.where.removeprefix("compose ") for c in containers if on_models(c, False)}
    readers = [c for c in containers if on_models(c, True)]
    assert writers and readers
    for reader in readers:
        depends_on = reader.spec.get("depends_on") or {}
        if isinstance(depends_on, list):  # short syntax: only "service_started"
            depends_on = {name: {} for name in depends_on}
        for writer in writers:
            condition = depends_on.get(writer, {}).get("condition")
            assert condition == "service_completed_successfully", (
                f"{reader.where} may start before {writer} has written the models volume"
            )


TOPIC_MENTION = re.compile(r"\bchat\.[\w.<>*-]*[\w>*]")


def is_real_topic(name: str) -> bool:
    if name in topics.shared_topics():
        return True
    tiers = {tier.value for tier in topics.Tier} | {"<tier>", "*"}
    if name.startswith(topics.REQUESTS_PREFIX):
        return name.removeprefix(topics.REQUESTS_PREFIX) in tiers
    return name.startswith(topics.DELIVER_PREFIX) and len(name) > len(topics.DELIVER_PREFIX)


def test_topic_names_mentioned_are_real_topics() -> None:
    files = [COMPOSE_FILE, DOCKERFILE, *sorted(K8S_DIR.glob("*.y*ml"))]
    mentions = {(path.name, m) for path in files for m in TOPIC_MENTION.findall(path.read_text())}
    assert mentions
    unknown = sorted((path, name) for path, name in mentions if not is_real_topic(name))
    assert not unknown, f"not a topic of schemas/topics.py: {unknown}"


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    manifests = {p.name for p in K8S_DIR.glob("*.y*ml")} - {"kustomization.yaml"}
    assert manifests
    assert set(kustomization["resources"]) == manifests


def test_worker_autoscaling_reads_the_scheduler_backlog_and_demand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KEDA scales the workers between a warm floor and one worker per chat.work
    partition, on the scheduler group's lag on every request topic and on Prometheus
    metrics chatpipe serves; it reads Kafka as a user allowed to see that lag."""
    from chatpipe.kafka_acls import Operation, Resource, allowed
    from ops.metrics import LIVE_GAUGES
    from scheduler.shards import GROUP as SCHEDULER_GROUP

    assert not k8s_objects("HorizontalPodAutoscaler"), "KEDA makes the HPA (worker-scaledobject)"
    (scaled,) = k8s_objects("ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "worker",
    }
    assert "replicas" not in k8s_object("Deployment", "worker")["spec"], "KEDA sets it"
    settings = settings_from(chatpipe_env(), monkeypatch)
    assert (
        1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= settings.topics.work_partitions
    )
    assert spec["maxReplicaCount"] > 100, "room for hundreds of GPU workers"

    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 600, "slow to give back"

    triggers = spec["triggers"]
    kafka = [t["metadata"] for t in triggers if t["type"] == "kafka"]
    assert sorted(m["topic"] for m in kafka) == sorted(topics.request_topics())
    namespace = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())["namespace"]
    service = k8s_object("Service", settings.kafka.bootstrap_servers.split(":")[0])
    for metadata in kafka:
        assert metadata["consumerGroup"] == SCHEDULER_GROUP
        assert metadata["allowIdleConsumers"] == "true", "else capped at the topic's partitions"
        assert metadata["sasl"] == "scram_sha512"
        # KEDA runs in its own namespace: the full name of the Kafka Service.
        host, port = metadata["bootstrapServers"].split(":")
        assert host == f"{service['metadata']['name']}.{namespace}.svc"
        assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    # ... where the broker advertises a name that resolves from there too.
    kafka_pod = k8s_object("StatefulSet", "kafka")["spec"]["template"]["spec"]
    advertised = {e["name"]: e.get("value") for e in kafka_pod["containers"][0]["env"]}
    assert advertised["KAFKA_ADVERTISED_HOST"].endswith(f".{namespace}.svc")

    (prometheus,) = [t["metadata"] for t in triggers if t["type"] == "prometheus"]
    metrics = set(re.findall(r"chatpipe:\w+", prometheus["query"]))
    assert "chatpipe:num_requests_waiting" in metrics
    assert metrics <= set(LIVE_GAUGES), f"not served: {metrics - set(LIVE_GAUGES)}"
    assert 0 < float(prometheus["threshold"]) <= 1, "demand in workers, over a utilisation"

    refs = {t["authenticationRef"]["name"] for t in triggers if t["type"] == "kafka"}
    (auth,) = [a for a in k8s_objects("TriggerAuthentication") if a["metadata"]["name"] in refs]
    (username_ref,) = [
        r for r in auth["spec"]["configMapTargetRef"] if r["parameter"] == "username"
    ]
    user = k8s_object("ConfigMap", username_ref["name"])["data"][username_ref["key"]]
    (password_ref,) = [r for r in auth["spec"]["secretTargetRef"] if r["parameter"] == "password"]
    assert {"name": password_ref["name"], "key": password_ref["key"]} == {
        "name": f"chatpipe-kafka-{user}",
        "key": "password",
    }
    # Reading a group's offsets takes Describe on the group (which Read grants) and on
    # the topics.
    assert allowed(user, Operation.READ, Resource.GROUP, SCHEDULER_GROUP)
    for topic in topics.request_topics():
        assert allowed(user, Operation.DESCRIBE, Resource.TOPIC, topic)


def evictions_allowed(budget: dict[str, Any], replicas: int) -> int:
    """Pods a PodDisruptionBudget lets a drain take at once out of `replicas` healthy
    ones (Kubernetes rounds a percentage up)."""

    def count(value: int | str) -> int:
        if isinstance(value, str):
            return -(-replicas * int(value.removesuffix("%")) // 100)
        return value

    spec = budget["spec"]
    if "maxUnavailable" in spec:
        return count(spec["maxUnavailable"])
    return replicas - count(spec["minAvailable"])


def test_every_workload_has_a_disruption_budget_that_lets_drains_through() -> None:
    """One budget per Deployment and StatefulSet; each lets a node drain evict at least
    one pod (0 would block the drain for good) and the workers no more than a tenth."""
    budgets = k8s_objects("PodDisruptionBudget")
    (scaled,) = k8s_objects("ScaledObject")
    workloads = [*k8s_objects("Deployment"), *k8s_objects("StatefulSet")]
    covered = []
    for workload in workloads:
        name = workload["metadata"]["name"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, f"{name}: {len(matching)} disruption budgets"
        budget = matching[0]
        covered.append(budget["metadata"]["name"])
        replicas = workload["spec"].get("replicas", scaled["spec"]["minReplicaCount"])
        assert evictions_allowed(budget, replicas) >= 1, f"{name}: no drain gets through"
    assert sorted(covered) == sorted(b["metadata"]["name"] for b in budgets)
    worker_budget = k8s_object("PodDisruptionBudget", "worker")
    maximum = scaled["spec"]["maxReplicaCount"]
    assert evictions_allowed(worker_budget, maximum) <= -(-maximum // 10)


def test_gateway_listens_where_it_is_published(monkeypatch: pytest.MonkeyPatch) -> None:
    service = next(c for c in compose_containers() if c.command == "gateway")
    settings = container_settings(service, monkeypatch)
    assert settings.gateway.host == "0.0.0.0"
    assert any(str(p).endswith(f":{settings.gateway.port}") for p in service.spec["ports"])

    container = next(c for c in k8s_containers() if c.command == "gateway")
    settings = container_settings(container, monkeypatch)
    assert settings.gateway.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container.spec["ports"]}
    (k8s_service,) = [s for s in k8s_objects("Service") if s["metadata"]["name"] == "gateway"]
    target = k8s_service["spec"]["ports"][0]["targetPort"]
    assert ports.get(target, target) == settings.gateway.port


def hosts(settings: Settings) -> set[str]:
    servers = (settings.kafka.bootstrap_servers or "").split(",")
    return {
        h.split(":")[0].split(".")[0] for h in [*servers, *settings.storage.cassandra_hosts] if h
    }


def test_kafka_and_cassandra_hosts_are_services_of_the_same_deployment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compose_services = set(compose()["services"])
    k8s_services = {s["metadata"]["name"] for s in k8s_objects("Service")}
    checked = 0
    for containers, services in (
        (compose_containers(), compose_services),
        (k8s_containers(), k8s_services),
    ):
        for container in containers:
            named = hosts(container_settings(container, monkeypatch))
            assert named <= services, f"{container.where}: no service {named - services}"
            checked += len(named)
    assert checked


def test_dockerfile_installs_every_package_and_runs_the_cli() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    dockerfile = DOCKERFILE.read_text()
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", dockerfile, re.MULTILINE))
    assert packages and packages <= copied, f"Dockerfile does not copy {packages - copied}"
    assert re.search(r'^ENTRYPOINT \["chatpipe"\]$', dockerfile, re.MULTILINE)
    extra = re.search(r"^ARG EXTRA=(\w+)$", dockerfile, re.MULTILINE)
    assert extra and extra.group(1) == "gpu"
    assert {"gpu", "cpu"} <= set(pyproject["project"]["optional-dependencies"])


def test_the_configuration_page_settings_table_matches_the_code():
    from chatpipe.settings import settings_table

    page = (ROOT / "docs" / "operating" / "configuration.md").read_text()
    start = page.index("<!-- settings-table: generated by `chatpipe settings` -->\n")
    end = page.index("\n<!-- end of settings-table -->")
    table = page[start:end].split("\n", 1)[1]
    assert table == settings_table(), "the settings table is stale: paste `chatpipe settings`"


# --- Kafka: every stage its own user, ACLs, nothing published ----------------------------

KAFKA_SERVER_SCRIPT = K8S_DIR / "kafka-server.sh"
KAFKA_ACLS_SCRIPT = K8S_DIR / "kafka-acls.sh"
SCRIPTS_MOUNT = "/opt/chatpipe"


def kafka_clients() -> list[Container]:
    return [c for c in all_containers() if c.command in STAGES or c.args[:1] == ("topics",)]


def kafka_user(container: Container) -> str:
    """Each stage connects as itself; topic creation as the admin."""
    from chatpipe.kafka_acls import ADMIN

    return container.command if container.command in STAGES else ADMIN


def secret_ref(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (item,) = [item for item in spec.get("env", []) if item["name"] == name]
    return item["valueFrom"]["secretKeyRef"]


def required_from_env_file(value: str | None, variable: str) -> bool:
    """A compose value taken from `.env`/the shell, refusing to start without it."""
    return bool(value) and re.fullmatch(rf"\$\{{{variable}:\?[^}}]+\}}", value) is not None


@by_where(kafka_clients())
def test_every_kafka_client_has_its_own_user_and_a_password_from_a_secret(
    container: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chatpipe.kafka_acls import MECHANISM, password_variable

    settings = container_settings(container, monkeypatch)
    user = kafka_user(container)
    assert settings.kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    assert settings.kafka.sasl_mechanism == MECHANISM
    assert settings.kafka.sasl_username == user
    password = env_field("kafka_sasl_password")
    if container.kind == "service":
        assert required_from_env_file(container.env[password], password_variable(user))
    else:
        assert secret_ref(container.spec, password) == {
            "name": f"chatpipe-kafka-{user}",
            "key": "password",
        }


def test_stage_users_are_the_acl_tables_and_all_are_provisioned() -> None:
    """kafka-init (compose) and the topics Job's init container (k8s) get every user's
    password, from the same place the user's own container does, and run the script."""
    from chatpipe.kafka_acls import ADMIN, GRANTS, password_variable

    users = [ADMIN, *GRANTS]
    assert set(GRANTS) == set(STAGES)
    services = compose()["services"]
    init = services["kafka-init"]
    assert init["entrypoint"] == ["sh", f"{SCRIPTS_MOUNT}/kafka-acls.sh"]
    assert f"./k8s/kafka-acls.sh:{SCRIPTS_MOUNT}/kafka-acls.sh:ro" in init["volumes"]
    for user in users:
        variable = password_variable(user)
        assert required_from_env_file(init["environment"][variable], variable)
    assert services["topics"]["depends_on"] == {
        "kafka-init": {"condition": "service_completed_successfully"}
    }

    (job,) = [j for j in k8s_objects("Job") if j["metadata"]["name"] == "topics"]
    (acls,) = job["spec"]["template"]["spec"]["initContainers"]
    assert acls["command"] == ["sh", f"{SCRIPTS_MOUNT}/kafka-acls.sh"]
    for user in users:
        assert secret_ref(acls, password_variable(user)) == {
            "name": f"chatpipe-kafka-{user}",
            "key": "password",
        }


def broker_config() -> dict[str, str]:
    """The server.properties kafka-server.sh writes (both deployments run it)."""
    text = KAFKA_SERVER_SCRIPT.read_text()
    body = re.search(r'cat > "\$config" <<EOF\n(.*?)\nEOF\n', text, re.DOTALL)
    assert body, "kafka-server.sh no longer writes $config from a heredoc"
    lines = [line for line in body.group(1).splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_the_broker_requires_scram_and_denies_what_no_acl_allows() -> None:
    from chatpipe.kafka_acls import ADMIN, MECHANISM

    config = broker_config()
    assert config["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert config["allow.everyone.if.no.acl.found"] == "false"
    assert config["super.users"] == f"User:{ADMIN}"
    protocols = dict(p.split(":") for p in config["listener.security.protocol.map"].split(","))
    listeners = dict(
        re.fullmatch(r"(\w+)://(.*)", listener).groups()
        for listener in config["listeners"].split(",")
    )
    assert set(listeners) == set(protocols)
    assert set(protocols.values()) <= {"SASL_PLAINTEXT", "SASL_SSL"}, "a listener without auth"
    controller = config["controller.listener.names"]
    assert listeners[controller].startswith("localhost:"), "the controller is reachable"
    (broker,) = set(listeners) - {controller}
    assert config["inter.broker.listener.name"] == broker
    assert config[f"listener.name.{broker.lower()}.sasl.enabled.mechanisms"] == MECHANISM
    assert config["auto.create.topics.enable"] == "false"
    # The admin's SCRAM credential exists before the broker takes its first connection.
    assert f'--add-scram "{MECHANISM}=[name={ADMIN},password=$KAFKA_ADMIN_PASSWORD]"' in (
        KAFKA_SERVER_SCRIPT.read_text()
    )


def test_both_deployments_run_the_secured_broker_from_its_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    command = ["sh", f"{SCRIPTS_MOUNT}/kafka-server.sh"]
    kafka = compose()["services"]["kafka"]
    assert kafka["entrypoint"] == command
    assert f"./k8s/kafka-server.sh:{SCRIPTS_MOUNT}/kafka-server.sh:ro" in kafka["volumes"]
    assert required_from_env_file(
        kafka["environment"]["KAFKA_ADMIN_PASSWORD"], "KAFKA_ADMIN_PASSWORD"
    )
    (statefulset,) = [s for s in k8s_objects("StatefulSet") if s["metadata"]["name"] == "kafka"]
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == command
    assert secret_ref(container, "KAFKA_ADMIN_PASSWORD") == {
        "name": "chatpipe-kafka-admin",
        "key": "password",
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SCRIPTS_MOUNT]
    generated = volumes[mount["name"]]["configMap"]["name"]
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    (scripts,) = [g for g in kustomization["configMapGenerator"] if g["name"] == generated]
    assert set(scripts["files"]) == {KAFKA_SERVER_SCRIPT.name, KAFKA_ACLS_SCRIPT.name}
    # Clients reach the broker where it advertises itself.
    advertised = broker_config()["advertised.listeners"]
    port = advertised.rsplit(":", 1)[1]
    assert settings_from(chatpipe_env(), monkeypatch).kafka.bootstrap_servers == (f"kafka:{port}")


@pytest.mark.parametrize("script", [KAFKA_SERVER_SCRIPT, KAFKA_ACLS_SCRIPT], ids=lambda p: p.name)
def test_the_kafka_scripts_are_valid_shell(script: Path) -> None:
    import subprocess

    result = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_kafka_is_not_published_outside_the_deployment() -> None:
    services = compose()["services"]
    assert "ports" not in services["kafka"], "Kafka must not have a host port"
    published = [str(p) for s in services.values() for p in s.get("ports") or []]
    assert not [p for p in published if re.search(r"\b909\d\b", p)], published
    (service,) = [s for s in k8s_objects("Service") if s["metadata"]["name"] == "kafka"]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert [p["port"] for p in service["spec"]["ports"]] == [9092], "only the SASL listener"


def test_no_development_user_and_gateways_get_the_key_secret() -> None:
    for path in [
        COMPOSE_FILE,
        *sorted(p for p in K8S_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts),
    ]:
        assert "DEV_API_KEY" not in path.read_text(), f"{path.name} creates the dev user"
    gateways = [c for c in all_containers() if c.command == "gateway"]
    assert {c.kind for c in gateways} == {"service", "Deployment"}
    variable = env_field("key_secret")
    for gateway in gateways:
        if gateway.kind == "service":
            assert required_from_env_file(gateway.env[variable], variable)
        else:
            assert secret_ref(gateway.spec, variable) == {
                "name": "chatpipe-key-secret",
                "key": "secret",
            }
