"""Load Hugging Face causal LMs (`load_model`), and build tiny ones offline that load the same way."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
TAG_TOKENS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
)
# pad first so it gets id 0, eos id 1, then the tags in the order above.
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, *TAG_TOKENS)

# A deliberately plain chat template: "role: content" lines, then "assistant: " as the
# generation prompt. The simulator sends [system "", user prompt] through it, as ZeroSearch
# sends its prompt through the simulator's own chat template.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

# The tiny tool-calling tokenizer (the quickstart's `protocol: tool-call`): ChatML turns ending in
# <|im_end|> (its eos), calls in <tool_call> tags as Qwen2.5's, results in a `tool` turn; the tools
# are named, not spelled out, as a tiny model cannot read their JSON schemas. Written here.
TOOL_SPECIAL_TOKENS = (PAD_TOKEN, "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>",
                       "</tool_response>", "<think>", "</think>", "<answer>", "</answer>")  # fmt: skip
TINY_TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for tool in tools %} {{ tool['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|im_start|>tool\n<tool_response>{{ message['content'] }}</tool_response>"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_DTYPES: dict[str, torch.dtype | str] = {
    "auto": "auto",
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def load_model(
    path: str | Path,
    *,
    adapter: str | Path | None = None,
    dtype: str = "auto",
    device: str = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a causal LM (eval mode) and its tokenizer (pad defaults to eos), optionally with a PEFT adapter.

    Args:
        path: A `save_pretrained` directory, or a hub model name when online.
        adapter: A PEFT adapter directory (or hub name), loaded for inference, not merged.
        dtype: "auto" (the checkpoint's), "float32", "bfloat16" or "float16".

    Raises:
        FileNotFoundError: `path` (or `adapter`) looks local but does not exist, or has no
            `config.json`.
        ValueError: `dtype` is not one of the supported names.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(_DTYPES)}")
    source = _check_source(path, what="model", marker="config.json")
    model: PreTrainedModel
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=_DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(source)
    except OSError as err:
        if Path(source).exists():
            raise
        raise FileNotFoundError(
            f"model {source!r} is not a local directory ({Path(source).resolve()} does not "
            f"exist) and could not be loaded from the Hugging Face hub ({err}); fix the path, "
            "or go online / download the model first"
        ) from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if adapter is not None:
        # Imported here: peft is only needed by users of adapters.
        from peft import PeftModel

        adapter_source = _check_source(adapter, what="adapter", marker="adapter_config.json")
        # A PeftModel forwards every PreTrainedModel attribute to the model it wraps.
        model = cast(PreTrainedModel, PeftModel.from_pretrained(model, adapter_source, is_trainable=False))
    model.to(device)  # type: ignore[arg-type]  # transformers types `to` as a decorated method
    model.eval()
    return model, tokenizer


def _check_source(path: str | Path, *, what: str, marker: str) -> str:
    """`path` as a string, checked to hold `marker` when local (hub-like names pass through)."""
    text = str(path)
    local = Path(text).expanduser()
    looks_local = isinstance(path, Path) or local.is_absolute() or text.startswith((".", "~")) or text.count("/") > 1
    if local.exists():
        if local.is_dir() and not (local / marker).is_file():
            raise FileNotFoundError(
                f"{what} directory {local} has no {marker}; point to a directory written by save_pretrained"
            )
        return str(local)
    if looks_local:
        raise FileNotFoundError(
            f"{what} path {local} does not exist; check the path (or use a hub name like 'Qwen/Qwen2.5-3B' when online)"
        )
    return text


def train_tokenizer(
    texts: list[str],
    vocab_size: int = 1000,
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    chat_template: str = TINY_CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts` (Qwen2's pre-tokenization) with `chat_template`.

    Special tokens (default: pad, eos and the eight tag tokens) get ids 0, 1, 2, ... in order and
    are never split; decoding gives back the exact NFC text. `vocab_size` counts them and the 256
    byte tokens.
    """
    if len(special_tokens) < 2:
        raise ValueError("special_tokens must start with the pad and eos tokens")
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs 256 byte tokens plus "
            f"{len(special_tokens)} special tokens"
        )
    backend = Tokenizer(models.BPE())
    # The Qwen2 pipeline (NFC, Qwen's split regex, then bytes), because transformers rebuilds
    # exactly this pipeline when it loads the saved tokenizer next to a Qwen2 config; any other
    # pre-tokenizer would encode differently after a save/load round trip.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    pad, eos, *others = special_tokens
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=pad,
        eos_token=eos,
        extra_special_tokens=others,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 384,
    max_positions: int = 4096,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM for CPU tests (float32, eval mode, tied embeddings).

    `tokenizer` sets the vocabulary and the pad / eos ids; `heads` must divide `hidden` and
    `kv_heads` must divide `heads`. `seed` leaves the global torch RNG untouched.
    """
    if hidden % heads != 0 or heads % kv_heads != 0:
        raise ValueError(f"heads={heads} must divide hidden={hidden} and kv_heads={kv_heads} must divide heads")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    # fork_rng keeps the caller's global RNG stream unchanged by our seeding.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.eval()
    return model


def save_tiny(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """Writes a model and its tokenizer into `directory`, loadable by `load_model`; returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
