"""`chatpipe store create-schema` on the default (SQLite) store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatpipe.cli import app


def test_store_create_schema_makes_the_tables_and_can_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = tmp_path / "chat.db"
    monkeypatch.setenv("CHATPIPE_DATABASE_PATH", str(database))
    for _ in range(2):
        result = CliRunner().invoke(app, ["store", "create-schema"])
        assert result.exit_code == 0, result.output
        assert f"schema ready in {database}" in result.output
    tables = {
        name
        for (name,) in sqlite3.connect(database).execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
    }
    assert {"conversations", "messages", "branch_choices", "summaries"} <= tables
