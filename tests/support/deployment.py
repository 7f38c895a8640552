"""The deployment files read: compose, k8s manifests, the settings they set."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices

from chatpipe.settings import SETTINGS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S_DIR = ROOT / "k8s"


IMAGE = "chatpipe"


@dataclass(frozen=True)
class Mount:
    source: str  # compose volume (or host path) / k8s PersistentVolumeClaim; "" if neither
    target: Path
    read_only: bool


@dataclass(frozen=True)
class Container:
    """One chatpipe process as a deployment file declares it."""

    where: str  # "compose gateway", "k8s Deployment/worker"
    kind: str  # "service" in compose, else the k8s workload kind
    args: tuple[str, ...]  # what follows the `chatpipe` entrypoint
    env: dict[str, str | None]  # None: filled in outside the file (shell, Secret)
    spec: dict[str, Any]  # the compose service or k8s container, as written
    mounts: tuple[Mount, ...] = ()

    @property
    def command(self) -> str:
        return self.args[0] if self.args else ""


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.y*ml")):
        docs += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def k8s_objects(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in k8s_documents() if doc.get("kind") == kind]


def is_chatpipe_image(image: str | None) -> bool:
    return bool(image) and image.rsplit("/", 1)[-1].split(":")[0] == IMAGE


def compose_env(service: dict[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def compose_mounts(service: dict[str, Any]) -> tuple[Mount, ...]:
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):  # long syntax
            mounts.append(
                Mount(
                    volume.get("source", ""), Path(volume["target"]), bool(volume.get("read_only"))
                )
            )
            continue
        parts = volume.split(":")
        if len(parts) == 1:  # an anonymous volume
            parts = ["", *parts]
        source, target, *mode = parts
        read_only = bool(mode) and "ro" in mode[0].split(",")
        mounts.append(Mount(source, Path(target), read_only))
    return tuple(mounts)


def compose_containers() -> list[Container]:
    containers = []
    for name, service in compose()["services"].items():
        if not is_chatpipe_image(service.get("image")):
            continue
        command = service.get("command") or []
        args = shlex.split(command) if isinstance(command, str) else command
        containers.append(
            Container(
                f"compose {name}",
                "service",
                tuple(args),
                compose_env(service),
                service,
                compose_mounts(service),
            )
        )
    return containers


def k8s_env(container: dict[str, Any], pod_name: str) -> dict[str, str | None]:
    configmaps = {cm["metadata"]["name"]: cm.get("data", {}) for cm in k8s_objects("ConfigMap")}
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        assert name in configmaps, f"envFrom names a ConfigMap not in k8s/: {name}"
        env.update(configmaps[name])
    for item in container.get("env", []):
        field_ref = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[item["name"]] = pod_name if field_ref == "metadata.name" else item.get("value")
    return env


def accepted_env_names() -> dict[str, str]:
    """Environment variable name -> Settings field, as pydantic-settings reads them."""
    prefix = Settings.model_config["env_prefix"]
    names = {}
    for name, setting in SETTINGS.items():
        alias = setting.info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(
                {choice.upper(): name for choice in alias.choices if isinstance(choice, str)}
            )
        elif isinstance(alias, str):
            names[alias.upper()] = name
        else:
            names[f"{prefix}{name}".upper()] = name
    return names


def settings_from(
    env: dict[str, str | None], monkeypatch: pytest.MonkeyPatch, **overrides: Any
) -> Settings:
    """Settings exactly as the container would build them from its environment."""
    accepted = accepted_env_names()
    for name in list(os.environ):
        if name.upper() in accepted:
            monkeypatch.delenv(name)
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    return Settings(**overrides)
