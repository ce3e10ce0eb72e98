"""Tiny tokenizer and model construction, save/load round trips, and load_model's errors."""

from __future__ import annotations

import random

import pytest
import torch

from simsearch.models import (
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    build_tiny_model,
    load_model,
    save_tiny,
    train_tokenizer,
)


def _texts() -> list[str]:
    rng = random.Random(0)
    words = ["alma", "born", "city", "year", "founded", "the", "of", "Varn", "Oslo", "1987", "é"]
    # Random made-up words too, so that BPE has enough distinct pairs to fill the vocabulary.
    words += ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=5)) for _ in range(300)]
    texts = []
    for _ in range(400):
        body = " ".join(rng.choice(words) for _ in range(12))
        texts.append(f"<think>{body}</think>\n<search> {body} </search>\n<answer> x </answer>")
    return texts


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_texts(), vocab_size=400)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer):
    model = build_tiny_model(tokenizer, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, seed=3)
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny")), model


ROUND_TRIP = [
    "Where was Alma Varn born?",
    "  two  spaces, tabs\tand\nnew\n\nlines ",
    "digits 1987 and 20251 and 3.14",
    "unicode: café, 東京, emoji 🙂",
    '<think>glued</think><search>q</search>\n\n<information>Doc 1(Title: "A") b</information>',
    "x<answer>y</answer>z",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids_in_order(tokenizer):
    # Ids follow SPECIAL_TOKENS order: pad 0, eos 1, then the eight tags 2..9.
    assert len(TAG_TOKENS) == 8
    assert tokenizer.pad_token == PAD_TOKEN and tokenizer.pad_token_id == 0
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.eos_token_id == 1
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer(token)["input_ids"] == [expected_id]
    # Glued to text, a tag is still one token.
    ids = tokenizer("abc<search>def</search>")["input_ids"]
    assert 4 in ids and 5 in ids  # <search> = 4, </search> = 5
    assert tokenizer.decode(ids[ids.index(4) + 1 : ids.index(5)]) == "def"


def test_vocab_size_is_respected(tokenizer):
    assert len(tokenizer) == 400


def test_train_tokenizer_rejects_a_vocab_too_small_for_bytes():
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer(["a b"], vocab_size=100)


def test_chat_template(tokenizer):
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "Query: x"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "system: \nuser: Query: x\nassistant: "


def test_tiny_model_parameter_count_and_tied_embeddings(tokenizer):
    model = build_tiny_model(tokenizer)  # hidden 128, 4 layers, 4 heads, 2 KV heads, FFN 384
    vocab = len(tokenizer)
    # Per layer: q 128*128+128 (bias) = 16512; k and v each 128*64+64 = 8256 (2 KV heads x 32);
    # o 128*128 = 16384; MLP 3*128*384 = 147456; two RMSNorms 256. Sum 197120.
    # Total: embeddings vocab*128 (tied, counted once) + 4 layers + final norm 128.
    assert sum(p.numel() for p in model.parameters()) == vocab * 128 + 4 * 197120 + 128
    # With the 1000-token vocabulary of the tiny world that is 916,608: the notes' 0.92M.
    assert 1000 * 128 + 4 * 197120 + 128 == 916_608
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.pad_token_id == 0 and model.config.eos_token_id == 1


def test_build_tiny_model_is_seeded_and_leaves_global_rng_alone(tokenizer):
    state = torch.random.get_rng_state()
    a = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=32, seed=1)
    b = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=32, seed=1)
    c = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=32, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_build_tiny_model_rejects_bad_heads(tokenizer):
    with pytest.raises(ValueError, match="heads=3"):
        build_tiny_model(tokenizer, hidden=32, heads=3, kv_heads=1)


def test_save_load_round_trip(tiny_dir, tokenizer):
    directory, model = tiny_dir
    loaded, loaded_tokenizer = load_model(directory)
    texts = [*ROUND_TRIP, "year 1987 in Oslo, founded 20251"]
    for text in texts:
        assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    ids = torch.tensor([tokenizer(ROUND_TRIP[0])["input_ids"]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert not loaded.training
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert loaded_tokenizer.pad_token_id == 0 and loaded_tokenizer.eos_token_id == 1


def test_load_model_dtype(tiny_dir):
    directory, _ = tiny_dir
    loaded, _ = load_model(directory, dtype="bfloat16")
    assert next(loaded.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float8"):
        load_model(directory, dtype="float8")


def test_load_model_missing_paths(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model does not exist"):
        load_model(missing)
    with pytest.raises(FileNotFoundError, match="no-such-model does not exist"):
        load_model(str(missing))
    with pytest.raises(FileNotFoundError, match=r"has no config.json"):
        load_model(tmp_path)


def test_load_model_with_adapter(tiny_dir, tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    directory, _ = tiny_dir
    base, _ = load_model(directory)
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # LoRA B starts at zero; make the adapter change the output
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.1)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([tokenizer("Where was Alma born?")["input_ids"]])
    with torch.no_grad():
        expected = peft_model(ids).logits
        plain = load_model(directory)[0](ids).logits
        adapted = load_model(directory, adapter=tmp_path / "adapter")[0](ids).logits
    assert torch.allclose(adapted, expected, atol=1e-6)
    assert not torch.allclose(adapted, plain, atol=1e-3)
    with pytest.raises(FileNotFoundError, match="adapter path"):
        load_model(directory, adapter=tmp_path / "missing-adapter")
