"""The tiny random-weight Llama and a byte-level BPE tokenizer, built offline.

The tests' fast engines serve it with the real vLLM engine: its text is meaningless,
but tokenization, prefix caching, batching, streaming and guided decoding are real.
Weights come from a fixed torch seed; the tokenizer is trained on the Python docs
shipped with the standard library (`pydoc_data`), so no download is needed. Users are
served the default model (`chatpipe.default_model`).
"""

from __future__ import annotations

from pathlib import Path

from chatpipe.model_files import ModelStamp, build_model_dir, is_built

NAME = "tiny-random"
"""Its served name (the directory's name): random weights, tiny."""
TINY_MODEL_DIR = Path("~/.cache/chatpipe").expanduser() / NAME
REBUILD = "chatpipe make-tiny-model"
BUILD_VERSION = 2
HIDDEN_SIZE, INTERMEDIATE_SIZE, LAYERS = 128, 256, 2
HEADS = 2  # head_dim 64: vLLM's CPU attention takes no smaller
CONTEXT = 4096
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


def tiny_model_is_built(out: Path = TINY_MODEL_DIR) -> bool:
    """True when `out` holds a whole build of this version."""
    return is_built(out, {"version": BUILD_VERSION})


def build_tiny_model(out: Path = TINY_MODEL_DIR) -> None:
    """Write the tiny model (config, safetensors weights, tokenizer) to `out`, unless it
    holds this build already (`chatpipe.model_files.build_model_dir`)."""

    def write(model: Path) -> None:
        tokenizer = _train_tokenizer()
        tokenizer.save_pretrained(model)
        _save_model(model, tokenizer)

    build_model_dir(out, ModelStamp(NAME, {"version": BUILD_VERSION}, REBUILD, {}), write)


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
        model_max_length=CONTEXT,
    )


def _save_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    special = {
        "bos_token_id": tokenizer.convert_tokens_to_ids(BOS),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS),
        "pad_token_id": tokenizer.convert_tokens_to_ids(PAD),
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=False,
        dtype="float32",
        **special,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    GenerationConfig(**special).save_pretrained(out)
