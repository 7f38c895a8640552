"""The engine's settings: the served model's name and the context length the gateway fits
conversations into, read from the model's directory as vLLM reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from chatpipe.settings import Settings
from workers.config import FALLBACK_CONTEXT_LENGTH, EngineSettings, model_context_length


def model(tmp_path: Path, config: dict, tokenizer: dict | None = None, name: str = "m") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return directory


@pytest.mark.parametrize(
    "config, tokenizer, length",
    [
        ({"max_position_embeddings": 8192}, {"model_max_length": 1e30}, 8192),
        ({"max_position_embeddings": 8192, "n_positions": 4096}, None, 4096),  # the smallest
        ({"text_config": {"max_position_embeddings": 32768}}, None, 32768),
        ({"max_position_embeddings": 4096}, {"model_max_length": 1024}, 1024),
        ({"max_position_embeddings": 8192, "model_max_length": 131072}, None, 131072),
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}},
         None, 16384),
        ({"max_position_embeddings": 131072,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None, 131072),
        ({"hidden_size": 8}, None, FALLBACK_CONTEXT_LENGTH),
    ],
)  # fmt: skip
def test_the_models_own_context_length(tmp_path, config, tokenizer, length):
    assert model_context_length(model(tmp_path, config, tokenizer)) == length


def test_an_unreadable_config_gives_vllms_fallback(tmp_path):
    assert model_context_length(tmp_path / "gone") == FALLBACK_CONTEXT_LENGTH


def test_the_gateways_window_is_the_setting_else_the_engines_else_the_models(tmp_path):
    directory = model(tmp_path, {"max_position_embeddings": 8192})
    assert EngineSettings(model=directory).context_length() == 8192
    engine = EngineSettings(model=directory, vllm_args={"max_model_len": 2048})
    assert engine.context_length() == 2048
    assert EngineSettings(model=directory, max_model_len=1000).context_length() == 1000


def test_a_model_is_served_under_its_directorys_name_unless_named(tmp_path):
    first, second = model(tmp_path, {}, name="first"), model(tmp_path, {}, name="second")
    assert EngineSettings(model=first).model_name == "first"
    assert EngineSettings(model=first, model_name="mine").model_name == "mine"
    settings = Settings(model=first)
    assert settings.replace(model=second).inference.model_name == "second"
    named = Settings(model=first, model_name="mine")
    assert named.replace(model=second).inference.model_name == "mine"
    with pytest.raises(ValidationError, match="CHATPIPE_MODEL_NAME"):
        EngineSettings(model=Path("/"))
