"""`chatpipe up`'s runtime file: written while it runs, removed after, and a stale one
(its process gone) refused with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ops.runtime_file import (
    NoRunningStack,
    published_run,
    read_run_file,
    run_file,
    running_stack_info,
)


def test_published_while_running_and_removed_after(tmp_path):
    database = tmp_path / "chatpipe.db"
    with published_run(database, "127.0.0.1:9092", "http://127.0.0.1:8000", True) as path:
        assert path == tmp_path / "chatpipe.db.run.json" == run_file(database)
        info = running_stack_info(database)
        assert (info.pid, info.bootstrap_servers, info.gateway_url, info.embedded_broker) == (
            os.getpid(),
            "127.0.0.1:9092",
            "http://127.0.0.1:8000",
            True,
        )
    assert not path.exists()
    with pytest.raises(NoRunningStack, match="no running `chatpipe up`"):
        running_stack_info(database)


def test_a_file_another_process_wrote_since_is_left_alone(tmp_path):
    database = tmp_path / "chatpipe.db"
    with published_run(database, "a:1", "http://a", True) as path:
        data = json.loads(path.read_text()) | {"pid": os.getpid() + 1}
        path.write_text(json.dumps(data))
    assert read_run_file(path).pid == os.getpid() + 1


def test_a_stale_file_is_refused_with_its_pid(tmp_path):
    database = tmp_path / "chatpipe.db"
    with (
        published_run(database, "a:1", "http://a", True),
        pytest.raises(NoRunningStack, match=rf"stale .*pid {os.getpid()}"),
    ):
        running_stack_info(database, alive=lambda pid: False)


def test_an_unreadable_file_is_refused(tmp_path):
    database = tmp_path / "chatpipe.db"
    run_file(database).write_text("{half")
    with pytest.raises(NoRunningStack, match="unreadable"):
        running_stack_info(database)


def test_an_in_memory_database_has_no_file():
    assert run_file(Path(":memory:")) is None
    with published_run(Path(":memory:"), "a:1", "http://a", True) as p:
        assert p is None
