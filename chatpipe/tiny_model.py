"""Random-weight Llamas and a byte-level BPE tokenizer, built offline.

Tests and `make run` serve the tiny one with the real vLLM engine: its text is
meaningless, but tokenization, prefix caching, batching and streaming are real.
The benchmark's `seed` shape is the same family, sized so that one unbatched
stream decodes at the speed a chat model does on a GPU (tens of tokens a second)
on one core of a CPU. Weights come from a fixed torch seed; the tokenizer is
trained on the Python docs shipped with the standard library (`pydoc_data`), so
no download is needed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

BUILD_VERSION = 1
STAMP_FILE = "chatpipe-tiny-model.json"
VOCAB_SIZE = 3000
SEED = 0

BOS, EOS, PAD = "<|begin_of_text|>", "<|end|>", "<|pad|>"
ROLE_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_MARKERS, "<|end_of_text|>"]

# Each turn is `<|role|>\ncontent<|end|>\n`; the model answers after `<|assistant|>\n`
# and stops at `<|end|>` (its eos token).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_FALLBACK_CORPUS = """\
The quick brown fox jumps over the lazy dog. A conversation is a list of turns:
a system prompt, then user and assistant messages. Hello! How can I help you today?
Numbers 0 1 2 3 4 5 6 7 8 9, punctuation .,;:!?'"()[]{}<>/\\|@#$%^&*-+=_~`
"""


@dataclass(frozen=True)
class Shape:
    """A Llama's size; every shape shares the tokenizer and the chat template."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int  # head_dim = hidden_size / heads; vLLM's CPU attention needs 64
    max_position_embeddings: int


SHAPES = {
    "tiny": Shape(128, 256, 2, 2, 4096),
    "seed": Shape(256, 512, 12, 4, 16384),
}
"""`tiny`: tests and `make run`. `seed`: the benchmark in a chat model's regime (its
decode speed on one core is in docs/benchmarks.md); ten turns of 500-token answers fit."""


def tiny_model_is_built(out: Path, shape: str = "tiny") -> bool:
    """True when `out` holds a complete model of this shape and build version."""
    try:
        stamp = json.loads((out / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return stamp == _stamp(shape)


def _stamp(shape: str) -> dict:
    stamp: dict = {"version": BUILD_VERSION}
    if shape != "tiny":  # the tiny model's stamp predates shapes: it stays valid
        stamp |= {"shape": shape, **asdict(SHAPES[shape])}
    return stamp


def build_tiny_model(out: Path, shape: str = "tiny") -> None:
    """Write a model of `shape` (config, safetensors weights, tokenizer) to `out`.

    Idempotent: does nothing when `out` already holds this build. The files are
    written to a temporary sibling directory and moved into place, so a crash or
    a concurrent build never leaves a half-written model behind.
    """
    out = Path(out)
    if tiny_model_is_built(out, shape):
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)
    try:
        tokenizer = _train_tokenizer()
        tokenizer.save_pretrained(staging)
        _save_model(staging, tokenizer, SHAPES[shape])
        (staging / STAMP_FILE).write_text(json.dumps(_stamp(shape)))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if tiny_model_is_built(out, shape):  # a concurrent build won the race
            return
        raise


def _corpus() -> list[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return [_FALLBACK_CORPUS]
    return [_FALLBACK_CORPUS, *(topics[name] for name in sorted(topics))]


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_MARKERS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def _save_model(out: Path, tokenizer, shape: Shape) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    special = {
        "bos_token_id": tokenizer.convert_tokens_to_ids(BOS),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS),
        "pad_token_id": tokenizer.convert_tokens_to_ids(PAD),
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=False,
        dtype="float32",
        **special,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    GenerationConfig(**special).save_pretrained(out)
