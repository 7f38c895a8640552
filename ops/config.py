"""The traces' settings (composed into `chatpipe.settings.Settings`; `ops.tracing`)."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class TracingSettings(BaseModel):
    """Where each stage's spans go."""

    model_config = ConfigDict(validate_by_name=True, validate_by_alias=True)

    otlp_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("CHATPIPE_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="OTLP/HTTP collector (e.g. http://localhost:4318): each stage's spans go to "
        "its /v1/traces; unset = no tracing. The SDK reads its other OTEL_* variables itself",
    )
