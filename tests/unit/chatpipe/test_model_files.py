"""A model directory checked before anything loads it: each way a file can be missing,
cut short or damaged is one `ModelFileError` naming the file and the command that builds
the directory again."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from chatpipe.model_files import (
    STAMP_FILE,
    ModelFileError,
    ModelStamp,
    build_model_dir,
    check_model_dir,
    is_built,
)

BUILD = {"version": 1}
REBUILD = "chatpipe make-model"


def safetensors(tensors: dict[str, int]) -> bytes:
    """A safetensors file of byte tensors, `name -> length`."""
    header, offset = {}, 0
    for name, length in tensors.items():
        header[name] = {"dtype": "U8", "shape": [length], "data_offsets": [offset, offset + length]}
        offset += length
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + bytes(offset)


def model_dir(root: Path, *, stamped: bool = True) -> Path:
    """A directory holding what a model directory holds (as chatpipe builds it)."""
    directory = root / "model"
    directory.mkdir()
    (directory / "config.json").write_text('{"max_position_embeddings": 8192}')
    (directory / "tokenizer.json").write_text('{"model": {}}')
    (directory / "tokenizer_config.json").write_text("{}")
    (directory / "generation_config.json").write_text('{"temperature": 0.2}')
    (directory / "model.safetensors").write_bytes(safetensors({"a": 100, "b": 28}))
    if stamped:
        ModelStamp.of(directory, "m", BUILD, REBUILD).write(directory)
    return directory


def problem(directory: Path, *, weights: bool = True, rebuild: str | None = None) -> str:
    with pytest.raises(ModelFileError) as raised:
        check_model_dir(directory, weights=weights, rebuild=rebuild)
    return str(raised.value)


def test_a_whole_directory_passes_and_counts_as_built(tmp_path):
    directory = model_dir(tmp_path)
    check_model_dir(directory, weights=True)
    assert is_built(directory, BUILD)
    assert not is_built(directory, {"version": 2})


def test_a_missing_directory_names_the_command_that_builds_it(tmp_path):
    message = problem(tmp_path / "gone", rebuild=REBUILD)
    assert message.startswith(f"no model directory at {tmp_path / 'gone'}")
    assert message.endswith(f"`{REBUILD} --out {tmp_path / 'gone'}` builds it")
    mine = problem(tmp_path / "mine")  # not one chatpipe builds
    assert "CHATPIPE_MODEL" in mine


def test_cut_short_weights_are_named_with_their_sizes(tmp_path):
    directory = model_dir(tmp_path, stamped=False)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    message = problem(directory, rebuild=REBUILD)
    assert message.startswith(f"{weights} is cut short")
    assert message.endswith(f"`{REBUILD} --out {directory}` builds it")


def test_a_stamped_file_cut_short_is_caught_by_its_size_even_without_weights(tmp_path):
    directory = model_dir(tmp_path)
    (directory / "tokenizer.json").write_text("{}")  # valid JSON, not the build's
    message = problem(directory, weights=False)
    assert str(directory / "tokenizer.json") in message and f"`{REBUILD} --out" in message
    assert not is_built(directory, BUILD)


def test_damaged_weights_of_the_same_size_fail_their_checksum(tmp_path):
    directory = model_dir(tmp_path)
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert "SHA-256" in problem(directory)
    check_model_dir(directory, weights=False)  # a gateway reads no weights: not hashed
    assert not is_built(directory, BUILD), "so building it again replaces it"


def test_a_damaged_header_and_garbage_for_weights(tmp_path):
    directory = model_dir(tmp_path, stamped=False)
    weights = directory / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 12) + b"not json!!!!" + bytes(8))
    assert "not a safetensors header" in problem(directory)
    weights.write_bytes(b"\xff" * 64)  # a header length past the file's end
    assert "not a safetensors header" in problem(directory)
    weights.write_bytes(b"abc")
    assert "cut short (3 bytes)" in problem(directory)
    header = b"[1, 2]"  # JSON, but no header of tensors
    weights.write_bytes(struct.pack("<Q", len(header)) + header)
    assert "not a safetensors header" in problem(directory)


def test_bytes_past_the_last_tensor_are_damage(tmp_path):
    directory = model_dir(tmp_path, stamped=False)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"extra")
    assert "5 bytes too many" in problem(directory)


def test_a_missing_config_tokenizer_or_weights(tmp_path):
    directory = model_dir(tmp_path, stamped=False)
    (directory / "model.safetensors").unlink()
    assert "holds no weights" in problem(directory)
    check_model_dir(directory, weights=False)
    (directory / "tokenizer.json").unlink()
    (directory / "tokenizer_config.json").unlink()
    assert "holds no tokenizer" in problem(directory, weights=False)
    (directory / "config.json").unlink()
    assert f"{directory / 'config.json'} is missing" in problem(directory, weights=False)


def test_invalid_json_is_named(tmp_path):
    directory = model_dir(tmp_path, stamped=False)
    (directory / "generation_config.json").write_text('{"temperature": ')
    message = problem(directory, weights=False)
    assert message.startswith(f"{directory / 'generation_config.json'} is not valid JSON")


def test_a_stamp_of_the_wrong_shape_counts_as_none(tmp_path):
    directory = model_dir(tmp_path)
    stamp = json.loads((directory / STAMP_FILE).read_text())
    stamp["files"]["config.json"] = "big"
    (directory / STAMP_FILE).write_text(json.dumps(stamp))
    assert ModelStamp.read(directory) is None and not is_built(directory, BUILD)
    check_model_dir(directory, weights=True)  # checked as any user's directory


def test_a_sharded_model_names_a_missing_shard(tmp_path):
    directory = model_dir(tmp_path, stamped=False)
    index = {"weight_map": {"a": "model.safetensors", "b": "model-2.safetensors"}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"{directory / 'model-2.safetensors'} is missing" in problem(directory)
    (directory / "model.safetensors.index.json").write_text("[]")
    assert "has no weight map" in problem(directory)


# --- building a directory ------------------------------------------------------------


def writes(content: str):
    def write(model: Path) -> None:
        (model / "config.json").write_text(content)

    return write


def test_a_build_is_written_once_and_again_when_damaged_or_of_another_build(tmp_path):
    out, stamp = tmp_path / "m", ModelStamp("m", BUILD, REBUILD, {})
    build_model_dir(out, stamp, writes('{"a": 1}'))
    assert is_built(out, BUILD) and (out / "config.json").read_text() == '{"a": 1}'
    build_model_dir(out, stamp, writes('{"a": 2}'))
    assert (out / "config.json").read_text() == '{"a": 1}', "built already: left alone"
    (out / "config.json").write_text('{"a": 3}')  # same size, other bytes
    build_model_dir(out, stamp, writes('{"a": 4}'))
    assert (out / "config.json").read_text() == '{"a": 4}'
    build_model_dir(out, ModelStamp("m", {"version": 2}, REBUILD, {}), writes('{"a": 5}'))
    assert (out / "config.json").read_text() == '{"a": 5}' and is_built(out, {"version": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"], "no staging left"


def test_a_failed_build_leaves_the_served_model_as_it_was_and_a_killed_ones_files_go(
    tmp_path,
):
    out, stamp = tmp_path / "m", ModelStamp("m", BUILD, REBUILD, {})
    build_model_dir(out, stamp, writes("{}"))

    def fails(model: Path) -> None:
        (model / "config.json").write_text("half")
        raise OSError("disk full")

    (tmp_path / ".m-killed").mkdir()  # what a SIGKILLed build leaves
    with pytest.raises(OSError):
        build_model_dir(out, ModelStamp("m", {"version": 2}, REBUILD, {}), fails)
    assert is_built(out, BUILD)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"]


def test_a_directory_chatpipe_did_not_build_is_never_replaced(tmp_path):
    out = model_dir(tmp_path, stamped=False)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ValueError, match="chatpipe did not build"):
        build_model_dir(out, ModelStamp("m", BUILD, REBUILD, {}), writes("{}"))
    assert sorted(p.name for p in out.iterdir()) == before
