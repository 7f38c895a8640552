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
            return cls(data["name"], data["build"], data["rebuild"], data["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

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


def build_model_dir(out: Path, stamp: ModelStamp, write: Callable[[Path], None]) -> None:
    """Have `write(directory)` fill a model directory, stamp it and move it to `out`.

    Does nothing when `out` already holds this build (`stamp.build`). Written in a
    temporary sibling of `out` and moved into place, so a crash never leaves half a model
    behind, and of two builds at once the later one's move wins whole."""
    out = Path(out).expanduser()
    if is_built(out, stamp.build):
        return
    out.parent.mkdir(parents=True, exist_ok=True)
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
            shutil.rmtree(out)
        model.rename(out)
    except BaseException:
        if not is_built(out, stamp.build):  # else a concurrent build won the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def is_built(directory: Path, build: dict[str, Any]) -> bool:
    """True when `directory` holds a whole build of `build` (its files as the stamp lists
    them, by size: the hashes are for `check_model_dir`)."""
    stamp = ModelStamp.read(directory)
    if stamp is None or stamp.build != build:
        return False
    return all(
        (directory / name).is_file() and (directory / name).stat().st_size == file["size"]
        for name, file in stamp.files.items()
    )


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
        listed = set(json.loads(index.read_text()).get("weight_map", {}).values())
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
