"""The Grafana dashboard (k8s/grafana-dashboard.json) plots only metrics that exist:
chatpipe's from ops.metrics, vLLM's from its Prometheus stat logger; and it plots every
metric the operators' issue asks for. Kustomize ships it as a ConfigMap for Grafana."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import ops.metrics  # noqa: F401 - defines the chatpipe: metrics

K8S_DIR = Path(__file__).resolve().parents[3] / "k8s"
DASHBOARD = K8S_DIR / "grafana-dashboard.json"
METRIC_NAME = re.compile(r"\b((?:chatpipe|vllm):[A-Za-z0-9_:]+)")
SERIES_SUFFIX = re.compile(r"_(bucket|count|sum|total)$")
ASKED_FOR = {
    "chatpipe:time_to_first_token_seconds",
    "chatpipe:inter_token_latency_seconds",
    "chatpipe:request_queue_time_seconds",
    "chatpipe:request_success",
    "chatpipe:admission_rejections",
    "chatpipe:open_streams",
    "chatpipe:num_requests_waiting",
    "chatpipe:worker_slots_used",
    "chatpipe:worker_slots_max",
    "chatpipe:kv_cache_usage_perc",
    "chatpipe:consumer_lag",
    "chatpipe:dead_letters",
    "chatpipe:retractions",
}


def panels() -> list[dict]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def chatpipe_metrics() -> set[str]:
    return {family.name for family in REGISTRY.collect() if family.name.startswith("chatpipe:")}


def vllm_metrics() -> set[str]:
    """Metric names vLLM's Prometheus stat logger registers, read from its source."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vLLM is installed with chatpipe"
    source = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    return set(re.findall(r'name="(vllm:[A-Za-z0-9_:]+)"', source))


def family(series: str) -> str:
    return SERIES_SUFFIX.sub("", series)


def test_every_panel_queries_metrics_the_code_defines() -> None:
    defined = chatpipe_metrics() | vllm_metrics()
    assert "chatpipe:time_to_first_token_seconds" in defined
    assert "vllm:kv_cache_usage_perc" in defined
    for panel in panels():
        exprs = [target["expr"] for target in panel["targets"]]
        assert exprs, f"panel {panel['title']!r} has no query"
        for expr in exprs:
            names = METRIC_NAME.findall(expr)
            assert names, f"{panel['title']!r}: {expr!r} names no metric"
            unknown = {name for name in names if {name, family(name)}.isdisjoint(defined)}
            assert not unknown, f"{panel['title']!r} queries undefined metrics {unknown}"


def test_the_dashboard_plots_every_metric_operators_asked_for() -> None:
    plotted = {
        form
        for panel in panels()
        for target in panel["targets"]
        for name in METRIC_NAME.findall(target["expr"])
        for form in (name, family(name))
    }
    assert plotted >= ASKED_FOR, f"no panel for {ASKED_FOR - plotted}"
    assert any(name.startswith("vllm:") for name in plotted), "no panel of vLLM's own metrics"


def test_kustomize_ships_the_dashboard_to_grafana() -> None:
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    [generated] = [g for g in kustomization["configMapGenerator"] if DASHBOARD.name in g["files"]]
    assert generated["options"]["labels"]["grafana_dashboard"] == "1"


def test_every_stage_serves_metrics_where_its_pod_is_scraped(monkeypatch) -> None:
    """Each stage's Deployment is annotated for Prometheus on the port its settings serve
    /metrics on, and names that port; compose serves them on the same port."""
    from chatpipe.cli import STAGES
    from tests.support.deployment import compose_containers, k8s_documents, k8s_env, settings_from

    scraped = set()
    for _, doc in k8s_documents():
        if doc.get("kind") != "Deployment":
            continue
        template = doc["spec"]["template"]
        stages = [c for c in template["spec"]["containers"] if c.get("args", [""])[0] in STAGES]
        if not stages:
            continue  # Kafka, Cassandra, Redis
        [container] = stages
        settings = settings_from(k8s_env(container, "pod-1"), monkeypatch)
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert int(annotations["prometheus.io/port"]) == settings.gateway.metrics_port
        assert settings.gateway.metrics_port in [p["containerPort"] for p in container["ports"]]
        scraped.add(container["args"][0])
    assert scraped == set(STAGES)
    for container in compose_containers():
        if container.command in STAGES:
            assert settings_from(container.env, monkeypatch).gateway.metrics_port == 9100, (
                container.where
            )
