"""Typed settings: the only place the environment is read (env prefix CHATPIPE_).

`Settings` is composed of one model per concern, each declared beside the stage (or
library) that reads it: `settings.kafka` is `bus.config.KafkaSettings`,
`settings.scheduler` is `scheduler.config.SchedulerSettings`, and so on (`GROUPS`). A
setting keeps one flat name, its environment variable without the `CHATPIPE_` prefix:
the group's prefix (`kafka_`, `safety_`; most groups have none) and its field's name,
e.g. `CHATPIPE_KAFKA_FETCH_MAX_WAIT_MS` is `settings.kafka.fetch_max_wait_ms` and
`CHATPIPE_MAX_MESSAGES` is `settings.gateway.max_messages`. A field's
`validation_alias` names its variables instead (`KAFKA_BOOTSTRAP_SERVERS`).

The flat names are also what `Settings(**values)` and `Settings.replace(**values)`
take (the CLI's options, tests), beside the groups themselves."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from bus.config import KafkaSettings, TopicSettings
from conversations.config import StoreSettings
from gateway.config import ContextSettings, EmbeddingsSettings, GatewaySettings, RateLimitSettings
from ops.config import TracingSettings
from retrieval.config import FileSettings
from safety.config import SafetySettings
from scheduler.config import SchedulerSettings
from servertools.config import ServerToolsSettings
from workers.config import DEFAULT_MODEL_DIR, EngineSettings, WorkerSettings, directory_name

ENV_PREFIX = "CHATPIPE_"
GROUPS: dict[str, str] = {"kafka": "kafka_", "safety": "safety_"}
"""The prefix of a group's flat names (and environment variables); a group not named
here has none."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    inference: EngineSettings = Field(default_factory=EngineSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings)
    safety: SafetySettings = Field(default_factory=SafetySettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    storage: StoreSettings = Field(default_factory=StoreSettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    embeddings: EmbeddingsSettings = Field(default_factory=EmbeddingsSettings)
    files: FileSettings = Field(default_factory=FileSettings)
    tools: ServerToolsSettings = Field(default_factory=ServerToolsSettings)

    def __init__(self, **values: Any) -> None:
        """`values` by group (`kafka=KafkaSettings(...)` or a dict) or by flat name
        (`kafka_fetch_max_wait_ms=7`, as in the environment)."""
        super().__init__(**_grouped(values))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The arguments, then the environment by flat name (the stock environment source
        would read each group from one variable, `CHATPIPE_KAFKA`, as JSON)."""
        return (init_settings, _FlatEnvironment(settings_cls))

    def replace(self, **values: Any) -> Settings:
        """A copy with `values` (by flat name) changed, like `model_copy(update=...)`:
        not validated again. A new `model` named by its directory is named anew."""
        update: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            setting = SETTINGS[name]
            update.setdefault(setting.group, {})[setting.field] = value
        engine = update.get("inference", {})
        named_by_directory = self.inference.model_name == directory_name(self.inference.model)
        if "model" in engine and "model_name" not in engine and named_by_directory:
            engine["model_name"] = directory_name(Path(engine["model"]))
        return self.model_copy(
            update={
                group: getattr(self, group).model_copy(update=fields)
                for group, fields in update.items()
            }
        )

    @model_validator(mode="after")
    def _check_model_aliases(self) -> Settings:
        from gateway.rollout import check_weights

        for alias, weights in self.scheduler.model_aliases.items():
            check_weights(alias, weights, self.models)
        return self

    def shard_of(self, model: str) -> str:
        """The scheduler shard deciding for `model` ("" : the unnamed one)."""
        return self.scheduler.shard_of(model)

    def shard_models(self, shard: str) -> frozenset[str] | None:
        """The models `shard` decides for; None for the unnamed one: every model no
        named shard lists."""
        return self.scheduler.shard_models(shard)

    @property
    def models(self) -> list[str]:
        """Model names this deployment serves."""
        return self.scheduler.served_models or [self.inference.model_name]


@dataclass(frozen=True)
class Setting:
    """One setting: its flat name, where it lives in `Settings`, its declaration."""

    name: str
    group: str
    field: str
    info: FieldInfo

    @property
    def env_names(self) -> tuple[str, ...]:
        """Its environment variables, the standard name first."""
        alias = self.info.validation_alias
        if isinstance(alias, AliasChoices):
            return tuple(
                sorted(map(str, alias.choices), key=lambda name: name.startswith(ENV_PREFIX))
            )
        if isinstance(alias, str):
            return (alias,)
        return (f"{ENV_PREFIX}{self.name}".upper(),)

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)


def _settings() -> dict[str, Setting]:
    found: dict[str, Setting] = {}
    for group, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), group
        prefix = GROUPS.get(group, "")
        for field, field_info in model.model_fields.items():
            name = f"{prefix}{field}"
            assert name not in found and name not in Settings.model_fields, name
            found[name] = Setting(name, group, field, field_info)
    return found


SETTINGS: dict[str, Setting] = _settings()
"""Every setting by flat name, in the order of `Settings`' groups and their fields."""


def _grouped(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with those given by flat name moved into their groups."""
    grouped: dict[str, Any] = {}
    flat: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        setting = SETTINGS.get(key)
        if setting is None:
            grouped[key] = value
        else:
            flat.setdefault(setting.group, {})[setting.field] = value
    for group, fields in flat.items():
        given = grouped.get(group, {})
        if isinstance(given, BaseModel):
            given = given.model_dump(exclude_unset=True)
        grouped[group] = {**given, **fields}
    return grouped


@cache
def _flat_model() -> type[BaseSettings]:
    """Every setting as one flat field, for pydantic-settings to read the environment as
    it always did (each variable by name or alias, JSON for lists and dicts); never
    validated itself."""
    from pydantic import create_model

    fields: dict[str, Any] = {
        name: (setting.info.annotation, Field(None, validation_alias=setting.info.validation_alias))
        for name, setting in SETTINGS.items()
    }
    return create_model("FlatSettings", __base__=_FlatBase, **fields)


class _FlatBase(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")


class _FlatEnvironment(EnvSettingsSource):
    """The environment read by flat name, handed on by group."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(_flat_model())

    def __call__(self) -> dict[str, Any]:
        by_key = {
            key.lower(): setting
            for setting in SETTINGS.values()
            for key in (setting.name, *setting.env_names)
        }
        grouped: dict[str, dict[str, Any]] = {}
        for key, value in super().__call__().items():
            setting = by_key[key.lower()]
            grouped.setdefault(setting.group, {})[setting.field] = value
        return grouped


def settings_table() -> str:
    """Every setting as a Markdown table: environment variable, default, meaning."""
    rows = ["| environment variable | default | meaning |", "|---|---|---|"]
    for name, setting in SETTINGS.items():
        env = " or ".join(f"`{alias}`" for alias in setting.env_names)
        if setting.info.default_factory is not None and name.endswith("_id"):
            default = "random per process"
        else:
            default = _shown(setting.default)
        meaning = (setting.info.description or "").replace("|", "\\|")
        rows.append(f"| {env} | {default} | {meaning} |")
    return "\n".join(rows)


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, Path) and value == DEFAULT_MODEL_DIR:
        return f"`~/.cache/chatpipe/{DEFAULT_MODEL_DIR.name}`"
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str)
        return f"`{text}`".replace("|", "\\|") if len(text) <= 60 else "see `settings.py`"
    if hasattr(value, "value"):
        value = value.value
    return f"`{value}`"
