"""The engine args a `VllmEngine` starts with: vLLM's defaults, chatpipe's few, then
CHATPIPE_VLLM_ARGS; names vLLM does not know fail before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chatpipe.settings import Settings
from workers.vllm_engine import (
    CHATPIPE_ENGINE_ARGS,
    CPU_KV_CACHE_BYTES,
    VllmEngine,
    engine_arg_values,
    resolve_engine_args,
)

FIELDS = {
    "model",
    "served_model_name",
    "scheduling_policy",
    "disable_log_stats",
    "structured_outputs_config",
    "max_num_seqs",
    "enforce_eager",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
}
MODEL = Path("/models/tiny")


def resolve(vllm_args: dict[str, object], on_cpu: bool = False) -> dict[str, object]:
    return resolve_engine_args(MODEL, "tiny-random", vllm_args, on_cpu=on_cpu, known=FIELDS)


def test_without_overrides_only_the_model_and_chatpipes_needs_are_set() -> None:
    assert resolve({}) == {
        "model": "/models/tiny",
        "served_model_name": ["tiny-random"],
        "scheduling_policy": "priority",
        "disable_log_stats": True,
        "structured_outputs_config": {
            "backend": "guidance",
            "disable_any_whitespace": True,
            "disable_additional_properties": True,
        },
    }
    assert set(CHATPIPE_ENGINE_ARGS) == {
        "scheduling_policy",
        "disable_log_stats",
        "structured_outputs_config",
    }


@pytest.mark.parametrize(
    ("vllm_args", "kv_cache_bytes"),
    [
        ({}, CPU_KV_CACHE_BYTES),
        ({"kv_cache_memory_bytes": 1 << 28}, 1 << 28),
        ({"gpu_memory_utilization": 0.5}, None),  # vLLM's own sizing, at that share of memory
    ],
)
def test_on_the_cpu_the_kv_cache_has_a_set_size_unless_vllm_args_size_it(
    vllm_args: dict[str, object], kv_cache_bytes: int | None
) -> None:
    assert resolve(vllm_args, on_cpu=True).get("kv_cache_memory_bytes") == kv_cache_bytes
    assert resolve(vllm_args, on_cpu=False).get("kv_cache_memory_bytes") == (
        vllm_args.get("kv_cache_memory_bytes")
    )


def test_overrides_add_fields_and_replace_chatpipes_defaults() -> None:
    args = resolve({"enforce_eager": True, "max_num_seqs": 64, "disable_log_stats": False})

    assert args["enforce_eager"] is True
    assert args["max_num_seqs"] == 64
    assert args["disable_log_stats"] is False
    assert args["scheduling_policy"] == "priority"


@pytest.mark.parametrize(
    ("vllm_args", "message"),
    [
        ({"max_num_seq": 8}, "'max_num_seq' is not an AsyncEngineArgs field (did you mean"),
        ({"max-num-seqs": 8}, "'max-num-seqs' is not an AsyncEngineArgs field (did you mean"),
        ({"xyzzy": 1}, "'xyzzy' is not an AsyncEngineArgs field"),
        ({"model": "/elsewhere"}, "'model' is set by CHATPIPE_MODEL"),
        ({"served_model_name": ["x"]}, "'served_model_name' is set by CHATPIPE_MODEL_NAME"),
    ],
)
def test_a_name_vllm_does_not_take_from_chatpipe_is_refused_by_name(
    vllm_args: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match="CHATPIPE_VLLM_ARGS") as error:
        resolve(vllm_args)
    assert message in str(error.value)
    if "did you mean" in message:
        assert str(error.value).endswith("(did you mean 'max_num_seqs'?)")


def test_every_bad_name_is_named_at_once() -> None:
    with pytest.raises(ValueError) as error:
        resolve({"max_num_seqs": 4, "enforce_eagre": True, "kv_cache_gib": 1})
    problems = str(error.value).removeprefix("CHATPIPE_VLLM_ARGS: ").split("; ")
    assert [p.split()[0] for p in problems] == ["'enforce_eagre'", "'kv_cache_gib'"]


def test_the_names_checked_are_those_of_vllms_async_engine_args() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from vllm.engine.arg_utils import AsyncEngineArgs

    engine = VllmEngine(MODEL, "tiny-random", {"max_num_seqs": 5, "enforce_eager": True})
    args = engine.engine_args()
    AsyncEngineArgs(**engine_arg_values(args))  # every field exists
    assert args["max_num_seqs"] == 5
    with pytest.raises(ValueError, match="'max_num_sequences' is not an AsyncEngineArgs"):
        VllmEngine(MODEL, "tiny-random", {"max_num_sequences": 5})


def test_a_config_given_as_json_becomes_vllms_config_class() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from vllm.config import StructuredOutputsConfig

    values = engine_arg_values(
        {
            "max_num_seqs": 5,
            "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
        }
    )
    assert values["max_num_seqs"] == 5
    config = values["structured_outputs_config"]
    assert isinstance(config, StructuredOutputsConfig) and config.disable_any_whitespace


def test_slots_are_unknown_until_the_engine_has_started() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed")
    engine = VllmEngine(MODEL, "tiny-random", {})
    with pytest.raises(RuntimeError, match="once the engine has started"):
        _ = engine.max_slots


def test_vllm_args_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATPIPE_VLLM_ARGS", '{"enforce_eager": true, "max_num_seqs": 64}')

    assert Settings().inference.vllm_args == {"enforce_eager": True, "max_num_seqs": 64}


def test_max_slots_redirects_a_vllm_user_to_vllm_args(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATPIPE_MAX_SLOTS", "64")

    with pytest.raises(ValueError, match=re.escape("CHATPIPE_VLLM_ARGS='{\"max_num_seqs\": 64}'")):
        Settings(engine="vllm")
    assert Settings(engine="sim").inference.max_slots == 64
