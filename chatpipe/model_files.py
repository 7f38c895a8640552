"""A model directory, checked before anything loads it.

A missing, cut-short or damaged file would otherwise surface deep inside transformers
or vLLM (the weights in the engine's own child process) as a stack trace, or not at
all. `check_model_dir` reads what each file's format lets it read cheaply — every JSON
file parses, every safetensors file is as long as its header says — and, for a
directory chatpipe built, each file's size and SHA-256 against the stamp written
beside them (`STAMP_FILE`). A problem is one `ModelFileError` naming the file and the
command that builds the directory again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STAMP_FILE = "chatpipe-model.json"
"""What built a directory: its served name, its build (compared to tell whether it is
up to date), the command that builds it again, and each file's size and SHA-256."""

JSON_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SAFETENSORS_HEADER_MAX = 100 << 20
"""The longest header a safetensors file may have (the format's own bound)."""


class ModelFileError(Exception):
    """A model directory that cannot be served, said in one sentence: the file, what is
    wrong with it, and how to get it back."""


@dataclass(frozen=True)
class ModelStamp:
    """What `STAMP_FILE` holds (`files`: name -> size and sha256)."""

    name: str
    build: dict[str, Any]
    rebuild: str
    files: dict[str, dict[str, Any]]

    @classmethod
    def read(cls, directory: Path) -> ModelStamp | None:
        """The directory's stamp; None where there is none, or it is unreadable (the
        directory then counts as not built)."""
        try:
            data = json.loads((directory / STAMP_FILE).read_text())
            stamp = cls(data["name"], data["build"], data["rebuild"], data["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        files_ok = isinstance(stamp.files, dict) and all(
            isinstance(file, dict)
            and isinstance(file.get("size"), int)
            and isinstance(file.get("sha256"), str)
            for file in stamp.files.values()
        )
        return stamp if files_ok and isinstance(stamp.rebuild, str) else None

    @classmethod
    def of(cls, directory: Path, name: str, build: dict[str, Any], rebuild: str) -> ModelStamp:
        """The stamp of the files now in `directory`."""
        files = {
            path.name: {"size": path.stat().st_size, "sha256": file_sha256(path)}
            for path in sorted(directory.iterdir())
            if path.is_file() and path.name != STAMP_FILE
        }
        return cls(name, build, rebuild, files)

    def write(self, directory: Path) -> None:
        stamp = {"name": self.name, "build": self.build, "rebuild": self.rebuild,
                 "files": self.files}  # fmt: skip
        (directory / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")

    def matches(self, directory: Path) -> bool:
        """Every file the stamp lists is in `directory`, of its size and SHA-256."""
        return all(
            (directory / name).is_file()
            and (directory / name).stat().st_size == file["size"]
            and file_sha256(directory / name) == file["sha256"]
            for name, file in self.files.items()
        )


def build_model_dir(out: Path, stamp: ModelStamp, write: Callable[[Path], None]) -> None:
    """Have `write(directory)` fill a model directory, stamp it and move it to `out`.

    Does nothing when `out` already holds this build whole (`is_built`). Builds of one
    `out` run one at a time (a lock file beside it), each in a temporary sibling moved
    into place, so a crash leaves no half model where one is served; a sibling a killed
    build left is removed by the next. Raises `ValueError`, touching nothing, when `out`
    holds files chatpipe did not build (no stamp): it is someone's own model."""
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(out, stamp.build):
            return
        if out.exists() and any(out.iterdir()) and ModelStamp.read(out) is None:
            raise ValueError(f"{out} holds files chatpipe did not build: choose another --out")
        for left in out.parent.glob(f".{out.name}-*"):
            shutil.rmtree(left, ignore_errors=True)  # a killed build's
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            model = staging / "model"
            model.mkdir()
            write(model)
            for path in model.iterdir():
                path.chmod(0o644)
            model.chmod(0o755)
            ModelStamp.of(model, stamp.name, stamp.build, stamp.rebuild).write(model)
            if out.exists():
                out.rename(staging / "replaced")
            model.rename(out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def is_built(directory: Path, build: dict[str, Any]) -> bool:
    """True when `directory` holds a whole build of `build`: its stamp says so, and its
    files are the stamp's, size and SHA-256."""
    stamp = ModelStamp.read(directory)
    return stamp is not None and stamp.build == build and stamp.matches(directory)


def check_model_dir(directory: Path, *, weights: bool, rebuild: str | None = None) -> None:
    """Raise `ModelFileError` unless `directory` holds a model to serve: its config and
    tokenizer (what a gateway reads), and with `weights` its weights too (what a worker
    loads, each file hashed against the stamp where chatpipe built it). `rebuild`: the
    command (taking `--out DIR`) that builds this directory when its stamp cannot say (it
    is gone)."""
    stamp = ModelStamp.read(directory)
    remedy = _remedy(stamp.rebuild if stamp else rebuild, directory)
    if not directory.is_dir():
        raise ModelFileError(f"no model directory at {directory}: {remedy}")
    for name in JSON_FILES:
        _check_json(directory / name, remedy, required=name == "config.json")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFileError(f"{directory} holds no tokenizer ({TOKENIZER_FILES[0]}): {remedy}")
    if stamp is not None:
        _check_stamped(directory, stamp, remedy, hashed=weights)
    if weights:
        _check_weights(directory, remedy)


def _remedy(rebuild: str | None, directory: Path) -> str:
    if rebuild:
        return f"`{rebuild} --out {directory}` builds it"
    return "put the model's Hugging Face files there, or point CHATPIPE_MODEL at them"


def _check_json(path: Path, remedy: str, *, required: bool) -> None:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        if required:
            raise ModelFileError(f"{path} is missing: {remedy}") from None
        return
    except OSError as exc:
        raise ModelFileError(f"{path} cannot be read ({exc.strerror}): {remedy}") from None
    try:
        json.loads(text)
    except ValueError:
        raise ModelFileError(f"{path} is not valid JSON (cut short or damaged): {remedy}") from None


def _check_stamped(directory: Path, stamp: ModelStamp, remedy: str, *, hashed: bool) -> None:
    for name, expected in stamp.files.items():
        path = directory / name
        if not path.is_file():
            raise ModelFileError(f"{path} is missing: {remedy}")
        size = path.stat().st_size
        if size != expected["size"]:
            raise ModelFileError(
                f"{path} has {size:,} bytes where its build wrote {expected['size']:,}"
                f" (cut short or damaged): {remedy}"
            )
        if hashed and file_sha256(path) != expected["sha256"]:
            raise ModelFileError(
                f"{path} is damaged (its SHA-256 is not the one its build wrote): {remedy}"
            )


def _check_weights(directory: Path, remedy: str) -> None:
    shards = sorted(directory.glob("*.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise ModelFileError(f"{index} has no weight map (damaged): {remedy}")
        listed = {str(name) for name in weight_map.values()}
        for name in sorted(listed):
            if not (directory / name).is_file():
                raise ModelFileError(f"{directory / name} is missing (listed in {index}): {remedy}")
    if not shards and not any(directory.glob("*.bin")) and not any(directory.glob("*.pt")):
        raise ModelFileError(f"{directory} holds no weights (model.safetensors): {remedy}")
    for shard in shards:
        _check_safetensors(shard, remedy)


def _check_safetensors(path: Path, remedy: str) -> None:
    """The file is as long as its header says: 8 bytes of header length, the JSON
    header, then the tensors up to the furthest end offset."""
    size = path.stat().st_size
    damaged = f"{path} is damaged (its header is not a safetensors header): {remedy}"
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise ModelFileError(f"{path} is cut short ({size} bytes): {remedy}")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(SAFETENSORS_HEADER_MAX, size - 8):
            raise ModelFileError(damaged)
        try:
            header = json.loads(file.read(header_len))
            if not isinstance(header, dict):
                raise ModelFileError(damaged)
            end = max(
                (int(entry["data_offsets"][1]) for key, entry in header.items()
                 if key != "__metadata__"),
                default=0,
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, IndexError):
            raise ModelFileError(damaged) from None
    expected = 8 + header_len + end
    if size < expected:
        raise ModelFileError(f"{path} is cut short ({size:,} of {expected:,} bytes): {remedy}")
    if size > expected:
        raise ModelFileError(f"{path} has {size - expected:,} bytes too many: {remedy}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
