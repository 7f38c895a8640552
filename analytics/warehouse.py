"""Analytics tables as Parquet files, and DuckDB views that count each event once.

`DATA/<table>/*.parquet`: each flush of the consumer adds one file per table (written
under a hidden name, then renamed, so a reader never sees half a file). A record read
again after a crash before its commit lands in a later file too; the views keep one row
per the table's key, so every query counts it once. A DuckDB database (a file, for
other tools to open, or in memory) holds the views; opening it recreates them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import duckdb

from analytics.rows import TABLES, Row, Table

EMPTY_FILE = "_columns.parquet"
"""A table's file with no rows: its columns, so a view works before any data."""


class Warehouse:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def write(self, rows: Mapping[Table, Sequence[Row]]) -> list[Path]:
        """One new Parquet file per table that has rows; the files written."""
        written = []
        with duckdb.connect() as con:
            for table, table_rows in rows.items():
                if table_rows:
                    written.append(self._write(con, table, table_rows))
        return written

    def ensure_tables(self) -> None:
        """Every table's directory, with its empty columns file."""
        with duckdb.connect() as con:
            for table in TABLES:
                if not (self.data_dir / table.name / EMPTY_FILE).exists():
                    self._write(con, table, [], EMPTY_FILE)

    def _write(
        self,
        con: duckdb.DuckDBPyConnection,
        table: Table,
        rows: Sequence[Row],
        name: str | None = None,
    ) -> Path:
        directory = self.data_dir / table.name
        directory.mkdir(parents=True, exist_ok=True)
        name = name or f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.parquet"
        columns = ", ".join(f'"{column}" {kind}' for column, kind in table.columns)
        con.execute(f"CREATE OR REPLACE TEMP TABLE batch ({columns})")
        if rows:
            unnested = ", ".join(f"unnest(${i + 1})" for i in range(len(table.columns)))
            con.execute(
                f"INSERT INTO batch SELECT {unnested}", [list(c) for c in zip(*rows, strict=True)]
            )
        hidden = directory / f".{name}.tmp"
        con.execute(f"COPY batch TO {_literal(hidden)} (FORMAT parquet)")
        target = directory / name
        os.replace(hidden, target)
        return target

    def connect(self, database: Path | None = None) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection (to `database`, or in memory) with one view per table."""
        self.ensure_tables()
        if database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect(str(database) if database is not None else ":memory:")
        for table in TABLES:
            con.execute(
                f'CREATE OR REPLACE VIEW "{table.name}" AS {view_sql(self.data_dir, table)}'
            )
        return con


def view_sql(data_dir: Path, table: Table) -> str:
    """One row per key over every file of `table`: the first read of each."""
    files = _literal(data_dir.resolve() / table.name / "*.parquet")
    key = ", ".join(f'"{column}"' for column in table.key)
    return (
        f"SELECT * FROM read_parquet({files}, union_by_name = true) "
        f"QUALIFY row_number() OVER (PARTITION BY {key} "
        f'ORDER BY "topic", "partition", "offset") = 1'
    )


def _literal(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"
