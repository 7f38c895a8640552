"""Every Kubernetes manifest in k8s/ validates against its schema, offline.

Built-in kinds against the Kubernetes API's own schemas at K8S_VERSION
(`kubernetes-validate`); the operators' kinds (KEDA, Strimzi, K8ssandra) against
the schemas of their CustomResourceDefinitions, vendored in tests/schemas/crds
(README there). Both strictly: a field the schema does not know is an error, as
`kubectl apply` (server-side field validation) makes it. The files are checked as
written and as kustomize builds them, and each kustomization lists exactly the
files there are. The operator deployment (k8s/operators/) is the plain one with
Kafka and Cassandra handed to Strimzi and K8ssandra: these tests check it points
the stages at the operators' Services and gives every stage its Kafka user and
the ACLs of chatpipe/kafka_acls.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.deployment import K8S_DIR, ROOT, settings_from

K8S_VERSION = "1.33.0"
CRD_SCHEMAS = ROOT / "tests" / "schemas" / "crds"
OPERATORS_DIR = K8S_DIR / "operators"
SHARDED_DIR = K8S_DIR / "sharded"
KUSTOMIZATIONS = (K8S_DIR, OPERATORS_DIR, SHARDED_DIR)
# The plain manifests the operators replace.
REPLACED_BY_OPERATORS = {K8S_DIR / "kafka.yaml", K8S_DIR / "cassandra.yaml"}

Document = dict[str, Any]


# --- the schemas ---------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """`schema` with unknown fields refused wherever it lists an object's fields and
    neither keeps unknown ones (x-kubernetes-preserve-unknown-fields) nor says what
    they may be (additionalProperties), which is how the API server reads a CRD's
    schema under strict field validation."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


@cache
def crd_schemas() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    """(apiVersion, kind) -> a validator of the vendored schema."""
    validators = {}
    for path in sorted(CRD_SCHEMAS.glob("*.json")):
        vendored = json.loads(path.read_text())
        schema = strict(vendored["schema"])
        # The API server fills these in from the URL; a manifest must name them.
        schema["required"] = sorted({*schema.get("required", ()), "apiVersion", "kind"})
        schema["properties"]["metadata"] = {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}},
            "x-kubernetes-preserve-unknown-fields": True,
        }
        validators[vendored["apiVersion"], vendored["kind"]] = jsonschema.Draft4Validator(schema)
    return validators


def problems(doc: Document) -> list[str]:
    """What is wrong with `doc` by its schema; empty if nothing."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key in crd_schemas():
        return sorted(
            f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
            for error in crd_schemas()[key].iter_errors(doc)
        )
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"no schema (vendor the CRD's in tests/schemas/crds): {exc.message}"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.absolute_path))}: {exc.message}"]
    return []


# --- the manifests -------------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.rglob("*.y*ml") if p.name != "kustomization.yaml")


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def documents(path: Path) -> list[Document]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=LOADER) if doc]


@cache
def written() -> frozenset[str]:
    return frozenset(json.dumps(d, sort_keys=True) for p in manifest_files() for d in documents(p))


def kustomization(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def listed_files(folder: Path) -> set[Path]:
    """Every file or folder a kustomization names, resolved."""
    spec = kustomization(folder)
    names = [
        *spec.get("resources", ()),
        *(f for g in spec.get("configMapGenerator", ()) for f in g.get("files", ())),
        *(p["path"] for p in spec.get("patches", ()) if "path" in p),
    ]
    return {(folder / name).resolve() for name in names}


def resources(folder: Path) -> set[Path]:
    return {(folder / name).resolve() for name in kustomization(folder)["resources"]}


@cache
def built(folder: Path) -> list[Document]:
    """What `kubectl kustomize` makes of `folder` (the operator folder lists the plain
    manifests from outside itself, hence the restrictor flag)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    result = subprocess.run(
        [kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.load_all(result.stdout, Loader=LOADER) if doc]


def one(docs: list[Document], kind: str, name: str | None = None) -> Document:
    (found,) = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return found


def name_of(doc: Document) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


# --- every manifest validates --------------------------------------------------------------


def test_there_are_manifests_and_schemas_for_every_operator_kind() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for p in manifest_files() for d in documents(p)}
    assert {
        "ScaledObject",
        "Kafka",
        "KafkaNodePool",
        "KafkaUser",
        "K8ssandraCluster",
        "Deployment",
        "PodDisruptionBudget",
    } <= {kind for _, kind in kinds}
    assert set(crd_schemas()) <= kinds, "a vendored schema no manifest uses"


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S_DIR)))
def test_each_manifest_file_validates(path: Path) -> None:
    docs = documents(path)
    assert docs
    invalid = {name_of(doc): found for doc in docs if (found := problems(doc))}
    assert not invalid


def as_written(doc: Document, folder: Path) -> str:
    """`doc` without what the kustomization adds to every object (namespace, labels)."""
    doc = copy.deepcopy(doc)
    metadata = doc["metadata"]
    metadata.pop("namespace", None)
    for label in kustomization(folder).get("labels", ()):
        for key in label["pairs"]:
            metadata.get("labels", {}).pop(key, None)
    if metadata.get("labels") == {}:
        del metadata["labels"]
    return json.dumps(doc, sort_keys=True)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_what_kustomize_builds_validates(folder: Path) -> None:
    """What the build changes or makes (patched objects, generated ConfigMaps); the rest
    is validated as written above."""
    docs = built(folder)
    assert len(docs) > 10
    changed = [doc for doc in docs if as_written(doc, folder) not in written()]
    assert changed
    invalid = {name_of(doc): found for doc in changed if (found := problems(doc))}
    assert not invalid
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert namespaces == {kustomization(folder)["namespace"]}


def mutate(path: str, change: Callable[[Document], Any], kind: str) -> Document:
    """A copy of the first `kind` in `path`, changed."""
    broken = copy.deepcopy(next(d for d in documents(K8S_DIR / path) if d["kind"] == kind))
    change(broken)
    return broken


BROKEN = {
    "a misspelt ScaledObject field": mutate(
        "worker-scaledobject.yaml", lambda d: d["spec"].update(minReplicaCont=4), "ScaledObject"
    ),
    "a trigger threshold not a string": mutate(
        "worker-scaledobject.yaml",
        lambda d: d["spec"]["triggers"][0]["metadata"].update(threshold=0.8),
        "ScaledObject",
    ),
    "a node pool role Strimzi lacks": mutate(
        "operators/kafka.yaml", lambda d: d["spec"].update(roles=["brokers"]), "KafkaNodePool"
    ),
    "a SCRAM mechanism Strimzi lacks": mutate(
        "operators/kafka-users.yaml",
        lambda d: d["spec"].update(authentication={"type": "scram-sha-256"}),
        "KafkaUser",
    ),
    "a datacenter without its size": mutate(
        "operators/cassandra.yaml",
        lambda d: d["spec"]["cassandra"]["datacenters"][0].pop("size"),
        "K8ssandraCluster",
    ),
    "a misspelt pod field": mutate(
        "worker.yaml",
        lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriod=120),
        "Deployment",
    ),
    "a budget of a list": mutate(
        "disruption-budgets.yaml",
        lambda d: d["spec"].update(maxUnavailable=[1]),
        "PodDisruptionBudget",
    ),
    "a kind nobody defines": mutate(
        "worker-scaledobject.yaml", lambda d: d.update(kind="ScaledObjekt"), "ScaledObject"
    ),
}


@pytest.mark.parametrize("broken", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_manifest_is_refused(broken: Document) -> None:
    assert problems(broken)


# --- the kustomizations list what there is -------------------------------------------------


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_kustomization_names_files_that_exist_and_lists_its_own(folder: Path) -> None:
    listed = listed_files(folder)
    missing = sorted(str(p) for p in listed if not p.exists())
    assert not missing, f"{folder.name}/kustomization.yaml names missing files: {missing}"
    own = {p.resolve() for p in folder.glob("*.y*ml") if p.name != "kustomization.yaml"}
    assert own <= resources(folder), f"not applied: {sorted(own - resources(folder))}"


def test_every_manifest_is_applied_by_some_kustomization() -> None:
    applied = set().union(*(resources(folder) for folder in KUSTOMIZATIONS))
    unlisted = {p.resolve() for p in manifest_files()} - applied
    assert not unlisted, sorted(map(str, unlisted))


def test_the_operator_deployment_is_the_plain_one_but_kafka_and_cassandra() -> None:
    plain, operators = kustomization(K8S_DIR), kustomization(OPERATORS_DIR)
    own = {p.resolve() for p in OPERATORS_DIR.glob("*.y*ml") if p.name != "kustomization.yaml"}
    assert resources(OPERATORS_DIR) - own == resources(K8S_DIR) - REPLACED_BY_OPERATORS
    for key in ("namespace", "labels", "images"):
        assert operators[key] == plain[key], key
    generated = {g["name"]: g for g in plain["configMapGenerator"]}
    for generator in operators["configMapGenerator"]:
        files = [
            str((OPERATORS_DIR / f).resolve().relative_to(K8S_DIR)) for f in generator["files"]
        ]
        assert {**generator, "files": files} == generated[generator["name"]]


# --- the operators' clusters -----------------------------------------------------------------


def test_the_sharded_deployment_is_the_plain_one_with_a_scheduler_per_shard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """k8s/sharded: every plain manifest, and each named shard's scheduler Deployment,
    whose settings decide for the served model, with the autoscaler on its group's lag."""
    from scheduler.shards import Shard

    own = {p.resolve() for p in SHARDED_DIR.glob("*.y*ml") if p.name != "kustomization.yaml"}
    assert resources(SHARDED_DIR) - own == resources(K8S_DIR)
    docs = built(SHARDED_DIR)
    env = one(docs, "ConfigMap", "chatpipe-env")["data"]
    shards = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("scheduler")
    ]
    names = set()
    for deployment in shards:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        own_env = {e["name"]: e["value"] for e in container.get("env", ()) if "value" in e}
        settings = settings_from({**env, **own_env}, monkeypatch)
        names.add(settings.scheduler.scheduler_shard)
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"]["type"] == "Recreate"
        assert one(docs, "PodDisruptionBudget", deployment["metadata"]["name"])
    assert names == {"", *settings.scheduler.scheduler_shards}
    served = settings.shard_of(settings.inference.model_name)
    assert served
    groups = {
        t["metadata"]["consumerGroup"]
        for t in one(docs, "ScaledObject", "worker")["spec"]["triggers"]
        if t["type"] == "kafka"
    }
    assert groups == {Shard.of(settings.scheduler.scheduler_shards, served).group}


def operator_docs() -> list[Document]:
    return [
        d
        for p in sorted(OPERATORS_DIR.glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in documents(p)
    ]


def env_patch() -> dict[str, str]:
    """The operator deployment's changes to chatpipe-env."""
    for patch in kustomization(OPERATORS_DIR)["patches"]:
        doc = yaml.safe_load(patch.get("patch", ""))
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            assert doc["metadata"]["name"] == "chatpipe-env"
            return doc["data"]
    raise AssertionError("no patch of chatpipe-env")


def test_stages_reach_the_operators_services(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = operator_docs()
    kafka = one(docs, "Kafka")
    (listener,) = kafka["spec"]["kafka"]["listeners"]
    cassandra = one(docs, "K8ssandraCluster")["spec"]["cassandra"]
    (datacenter,) = cassandra["datacenters"]
    plain_env = one(documents(K8S_DIR / "configmap.yaml"), "ConfigMap", "chatpipe-env")["data"]
    settings = settings_from({**plain_env, **env_patch()}, monkeypatch)
    # Strimzi's bootstrap Service and cass-operator's datacenter Service.
    assert settings.kafka.bootstrap_servers == (
        f"{kafka['metadata']['name']}-kafka-bootstrap:{listener['port']}"
    )
    assert settings.storage.cassandra_hosts == [
        f"{cassandra['clusterName']}-{datacenter['metadata']['name']}-service"
    ]
    assert listener["tls"] is False
    assert settings.kafka.security_protocol == "SASL_PLAINTEXT"
    assert listener["authentication"]["type"].upper() == settings.kafka.sasl_mechanism
    brokers = [p for p in docs if p["kind"] == "KafkaNodePool" and "broker" in p["spec"]["roles"]]
    min_insync = kafka["spec"]["kafka"]["config"]["min.insync.replicas"]
    assert settings.kafka.replication_factor > min_insync
    assert sum(p["spec"]["replicas"] for p in brokers) >= settings.kafka.replication_factor
    assert datacenter["size"] >= settings.storage.cassandra_replication_factor > 1


def test_the_strimzi_cluster_runs_kraft_with_node_pools() -> None:
    docs = operator_docs()
    kafka = one(docs, "Kafka")
    assert kafka["metadata"]["annotations"] == {
        "strimzi.io/kraft": "enabled",
        "strimzi.io/node-pools": "enabled",
    }
    pools = [d for d in docs if d["kind"] == "KafkaNodePool"]
    assert {d["metadata"]["labels"]["strimzi.io/cluster"] for d in pools} == {
        kafka["metadata"]["name"]
    }
    roles = [role for pool in pools for role in pool["spec"]["roles"]]
    assert sorted(set(roles)) == ["broker", "controller"]
    controllers = sum(p["spec"]["replicas"] for p in pools if "controller" in p["spec"]["roles"])
    assert controllers % 2 == 1 and controllers >= 3, "a quorum that survives one loss"
    assert kafka["spec"]["kafka"]["config"]["auto.create.topics.enable"] is False


def strimzi_acls(user: str) -> dict[tuple[str, str, bool], set[str]]:
    from chatpipe.kafka_acls import EVERY_STAGE, GRANTS

    acls: dict[tuple[str, str, bool], set[str]] = defaultdict(set)
    for grant in (*EVERY_STAGE, *GRANTS[user]):
        acls[grant.resource.value, grant.name, grant.prefixed].add(grant.operation.value)
    return dict(acls)


def test_every_stage_has_its_kafka_user_with_the_acl_tables_grants() -> None:
    from chatpipe.kafka_acls import ADMIN, GRANTS

    docs = operator_docs()
    kafka = one(docs, "Kafka")
    users = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaUser"}
    assert set(users) == {ADMIN, *GRANTS}
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple", "superUsers": [ADMIN]}
    assert "authorization" not in users[ADMIN]["spec"]
    for name, user in users.items():
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"]
        authentication = user["spec"]["authentication"]
        assert authentication["type"] == "scram-sha-512"
        # The Secret the stage's own pods read (tests/unit/project/test_deployment_files.py).
        assert authentication["password"]["valueFrom"]["secretKeyRef"] == {
            "name": f"chatpipe-kafka-{name}",
            "key": "password",
        }
        if name == ADMIN:
            continue
        deployed: dict[tuple[str, str, bool], set[str]] = defaultdict(set)
        for acl in user["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            key = (resource["type"], resource["name"], resource["patternType"] == "prefix")
            deployed[key] |= set(acl["operations"])
        assert dict(deployed) == strimzi_acls(name), (
            f"{name}: KafkaUser != chatpipe/kafka_acls.py; regenerate:"
            " python k8s/operators/kafka_users.py > k8s/operators/kafka-users.yaml"
        )


def test_the_operator_build_hands_kafka_and_cassandra_to_the_operators() -> None:
    docs = built(OPERATORS_DIR)
    assert not [d for d in docs if d["kind"] == "StatefulSet"]
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    budgets = {d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert not {"kafka", "cassandra"} & (services | budgets)
    topics_pod = one(docs, "Job", "topics")["spec"]["template"]["spec"]
    assert "initContainers" not in topics_pod, "users come from the KafkaUsers"
    kafka = one(docs, "Kafka")
    (listener,) = kafka["spec"]["kafka"]["listeners"]
    namespace = kafka["metadata"]["namespace"]
    bootstrap = f"{kafka['metadata']['name']}-kafka-bootstrap.{namespace}.svc:{listener['port']}"
    triggers = one(docs, "ScaledObject", "worker")["spec"]["triggers"]
    kafka_triggers = [t for t in triggers if t["type"] == "kafka"]
    assert kafka_triggers
    assert {t["metadata"]["bootstrapServers"] for t in kafka_triggers} == {bootstrap}
    env = one(docs, "ConfigMap", "chatpipe-env")["data"]
    assert env == {**one(built(K8S_DIR), "ConfigMap", "chatpipe-env")["data"], **env_patch()}
