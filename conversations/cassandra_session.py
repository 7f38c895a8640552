"""The Cassandra driver behind the store: prepared statements run asynchronously.

`CqlSession` is all `CassandraStore` needs: run a named statement of
`cassandra_schema.STATEMENTS`, or a conditional batch of them, and get the
rows back as dicts. `DriverSession` does it with `cassandra-driver`:
statements are prepared once at connect, executed with `execute_async`,
and each driver `ResponseFuture` is bridged to an asyncio future
(`bridge`), following every page, so the event loop never blocks.
Consistency is LOCAL_QUORUM, LOCAL_SERIAL for conditional (LWT) writes.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any, Protocol

from conversations import cassandra_schema as cql

Rows = list[dict[str, Any]]


class CqlSession(Protocol):
    async def run(self, name: str, values: tuple) -> Rows:
        """Execute statement `name` with `values` bound; every row of the result."""

    async def batch(self, statements: list[tuple[str, tuple]]) -> Rows:
        """One batch on one partition; with a condition it is applied all or nothing."""

    async def close(self) -> None: ...


def parse_hosts(hosts: list[str]) -> tuple[list[str], int]:
    """`["a", "b:9043"]` -> (["a", "b"], port). Every host must use the one port."""
    names, ports = [], set()
    for host in hosts:
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "9042")
        names.append(name)
        ports.add(int(port))
    if len(ports) > 1:
        raise ValueError(f"Cassandra hosts must share one port, got {sorted(ports)}")
    return names, ports.pop() if ports else 9042


def bind_values(name: str, values: tuple, unset: object) -> tuple:
    """Values to bind: an insert leaves a None column unset rather than writing a
    null (a null is a tombstone to compact away); conditions keep their None."""
    if name.startswith("insert_"):
        return tuple(unset if value is None else value for value in values)
    return values


def bridge(response_future: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Rows]:
    """An asyncio future of every row of a driver `ResponseFuture`, across pages.

    The driver calls back on its own I/O thread; the future is settled on the
    loop's thread. A cancelled future leaves the query running to its end.
    """
    future: asyncio.Future[Rows] = loop.create_future()
    rows: Rows = []

    def settle(outcome: Rows | BaseException) -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def on_page(page: Rows) -> None:
        rows.extend(page)
        if response_future.has_more_pages:
            response_future.start_fetching_next_page()
        else:
            loop.call_soon_threadsafe(settle, rows)

    def on_error(error: BaseException) -> None:
        loop.call_soon_threadsafe(settle, error)

    response_future.add_callbacks(on_page, on_error)
    return future


class DriverSession:
    """`CqlSession` on a live cluster through `cassandra-driver`."""

    def __init__(self, cluster: Any, session: Any, prepared: dict[str, Any]) -> None:
        self._cluster = cluster
        self._session = session
        self._prepared = prepared

    @classmethod
    async def connect(
        cls,
        hosts: list[str],
        keyspace: str,
        *,
        create_schema: bool = True,
        replication_factor: int = 1,
        request_timeout_s: float = 10.0,
        schema: ModuleType = cql,
    ) -> DriverSession:
        """Connect, create the schema if asked, and prepare every statement.

        `schema`: the module whose `schema_cql(keyspace, replication_factor)` and
        `statements(keyspace)` it creates and prepares; the store's by default (the
        usage ledger passes `ledger.cassandra_schema`)."""
        return await asyncio.to_thread(
            cls._connect,
            hosts,
            keyspace,
            create_schema,
            replication_factor,
            request_timeout_s,
            schema,
        )

    @classmethod
    def _connect(
        cls,
        hosts: list[str],
        keyspace: str,
        create_schema: bool,
        replication_factor: int,
        request_timeout_s: float,
        schema: ModuleType,
    ) -> DriverSession:
        from cassandra import ConsistencyLevel
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.query import dict_factory

        names, port = parse_hosts(hosts)
        profile = ExecutionProfile(
            consistency_level=ConsistencyLevel.LOCAL_QUORUM,
            serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
            row_factory=dict_factory,
            request_timeout=request_timeout_s,
        )
        cluster = Cluster(names, port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        try:
            session = cluster.connect()
            if create_schema:
                for statement in schema.schema_cql(keyspace, replication_factor):
                    session.execute(statement, timeout=120.0)
                cluster.control_connection.wait_for_schema_agreement()
            prepared = {
                name: session.prepare(text) for name, text in schema.statements(keyspace).items()
            }
        except BaseException:
            cluster.shutdown()
            raise
        return cls(cluster, session, prepared)

    async def run(self, name: str, values: tuple) -> Rows:
        from cassandra.query import UNSET_VALUE

        bound = self._prepared[name].bind(bind_values(name, values, UNSET_VALUE))
        return await bridge(self._session.execute_async(bound), asyncio.get_running_loop())

    async def batch(self, statements: list[tuple[str, tuple]]) -> Rows:
        from cassandra.query import UNSET_VALUE, BatchStatement

        batch = BatchStatement()  # one partition: no batch log is written
        for name, values in statements:
            batch.add(self._prepared[name], bind_values(name, values, UNSET_VALUE))
        return await bridge(self._session.execute_async(batch), asyncio.get_running_loop())

    async def close(self) -> None:
        await asyncio.to_thread(self._cluster.shutdown)
