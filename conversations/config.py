"""The conversation store's settings (composed into `chatpipe.settings.Settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator


class StoreSettings(BaseModel):
    """Which store keeps conversations, API keys and the token ledger, and where."""

    store: Literal["sqlite", "cassandra"] = Field(
        "sqlite", description="conversation store: sqlite or cassandra"
    )
    database_path: Path = Field(
        Path("chatpipe.db"), description="SQLite file (conversations, API keys, token ledger)"
    )
    cassandra_hosts: list[str] = Field(
        default_factory=list,
        description="Cassandra contact points (host or host:port)",
    )
    cassandra_keyspace: str = Field("chatpipe", description="Cassandra keyspace")

    cassandra_replication_factor: int = Field(
        1, ge=1, description="SimpleStrategy replication of a keyspace the store creates"
    )
    cassandra_create_schema: bool = Field(
        True,
        description="create keyspace and tables on open; false where a one-off job runs"
        " `chatpipe store create-schema`",
    )

    @model_validator(mode="after")
    def _check_store(self) -> StoreSettings:
        if self.store == "cassandra" and not self.cassandra_hosts:
            raise ValueError("store=cassandra needs CHATPIPE_CASSANDRA_HOSTS")
        return self
