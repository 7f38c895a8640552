"""A model directory that cannot be served stops `chatpipe up` and a worker at once with
one line naming the file and the command that builds it again: no stack trace, no
hang, exit status 1. Real processes, started as a user starts them, on copies of the
tiny model damaged on purpose."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.chatpipe_up import BIN, reader_env

CHECKED_WITHIN_S = 60
"""Far more than the check takes: the command's imports dominate."""


@pytest.fixture
def copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    return target


def refused(*argv: str, env: dict[str, str] | None = None) -> str:
    """`chatpipe argv`'s one line on stderr; it must exit 1 at once, and print no trace."""
    done = subprocess.run(
        [str(BIN / "chatpipe"), *argv], env={**reader_env(), **(env or {})},
        capture_output=True, text=True, timeout=CHECKED_WITHIN_S,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and done.stdout == "", done.stderr
    return lines[0]


def test_weights_cut_short(copy):
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    line = refused("up", "--model", str(copy))
    assert line.startswith(f"chatpipe up: {weights} has 1,000 bytes where its build wrote")
    assert line.endswith(f"`chatpipe make-tiny-model --out {copy}` builds it")


def test_weights_damaged_in_place(copy):
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    line = refused("up", "--model", str(copy))
    assert line.startswith(f"chatpipe up: {weights} is damaged"), line


def test_a_damaged_tokenizer_stops_even_the_sim_engine(copy):
    (copy / "tokenizer.json").write_text("{")
    line = refused("up", "--engine", "sim", "--model", str(copy))
    assert str(copy / "tokenizer.json") in line and "make-tiny-model" in line


def test_the_default_model_never_built(tmp_path):
    home = tmp_path / "home"
    line = refused("up", env={"HOME": str(home)})
    model = home / ".cache" / "chatpipe" / "smollm2-135m-instruct"
    assert line == f"chatpipe up: no model directory at {model}: " \
        f"`chatpipe make-model --out {model}` builds it"  # fmt: skip


def test_a_worker_run_alone_checks_before_it_reaches_for_the_broker(copy):
    (copy / "config.json").unlink()
    line = refused("worker", "--model", str(copy), env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert line.startswith(f"chatpipe worker: {copy / 'config.json'} is missing"), line


def test_vllm_reads_the_default_models_sampling_defaults(default_model_dir):
    """What a request leaves unset gets these in chatpipe's workers and in `vllm serve`
    alike: both take them from the directory as vLLM reads it."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e .[cpu])")
    from vllm.config import ModelConfig

    from chatpipe.default_model import SAMPLING_DEFAULTS

    read = ModelConfig(model=str(default_model_dir)).get_diff_sampling_param()
    assert read == SAMPLING_DEFAULTS
