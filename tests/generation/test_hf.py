"""HFEngine: stop strings, eos, lengths, batching, sampling, seeds and logprobs.

Two models: `ScriptedLM`, a stub whose next token is fixed by position (so tests know exactly
what is generated and can check cuts token by token), and a tiny random Qwen2 for everything
numerical (greedy agreement with `model.generate`, batch vs alone, seeds, logprobs).
"""

from __future__ import annotations

import copy
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config

from simsearch.errors import NonFiniteError
from simsearch.generation.hf import HFEngine, sample_next, similar_lengths, top_p_filter
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.types import Completion, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one intra-op thread is fastest, and far faster on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    # Frequent words become single tokens (" Varn", " founded"): the stop tests rely on it.
    words = ["Alma", "Varn", "Oslo", "founded", "born", "answer", "the", "is", "1987", "was", "in"]
    texts = [" ".join(rng.choices(words, k=10)) + " <search> q </search> <answer> a </answer>" for _ in range(300)]
    # Random words fill the rest of the vocabulary, so that random-weight models see variety.
    made_up = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=4)) for _ in range(200)]
    texts += [" ".join(rng.choice(made_up) for _ in range(10)) for _ in range(100)]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, seed=0)


class ScriptedLM(torch.nn.Module):
    """Predicts script[p + 1] after the token at position p, whatever the tokens are.

    A prompt of length L is therefore continued by script[L], script[L + 1], ...; prompts of
    different lengths get different continuations, which also checks the engine's position ids
    under left padding. Logits are a one-hot of height 30, so even temperature-1 sampling picks
    the scripted token (the others have probability about vocab * e^-30).

    Its one-layer cache stores each token's (position, id) as its key and value, so the engine
    can cut and re-assemble it like a real one; every forward checks that the positions the
    attention mask shows are exactly 0, 1, ..., and records the token ids it shows
    (`contexts`: one list per row per forward), i.e. what a real model would attend to.
    """

    def __init__(self, script: list[int], vocab: int, eos: int) -> None:
        super().__init__()
        self.script = script
        self.vocab = vocab
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the engine a device
        self.config = Qwen2Config(
            vocab_size=vocab,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            intermediate_size=8,
        )
        self.generation_config = GenerationConfig(eos_token_id=eos)
        self.contexts: list[list[int]] = []

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep=0):
        entry = torch.stack([position_ids, input_ids], dim=-1).float()[:, None]  # [B, 1, T, 2]
        keys, _ = past_key_values.update(entry, entry, 0)  # [B, 1, cached + T, 2]
        assert keys.shape[2] == attention_mask.shape[1]
        for row, mask in zip(keys[:, 0].long().tolist(), attention_mask.tolist()):
            shown = [pair for pair, m in zip(row, mask) if m]
            assert [position for position, _ in shown] == list(range(len(shown)))
            self.contexts.append([token for _, token in shown])
        targets = torch.tensor([[self.script[p + 1] for p in row] for row in position_ids.tolist()])  # [B, T]
        logits = torch.nn.functional.one_hot(targets, self.vocab).float() * 30.0  # [B, T, V]
        return SimpleNamespace(logits=logits)


def scripted_engine(tokenizer, continuation: list[int], prompt_len: int = 3) -> HFEngine:
    script = [0] * prompt_len + continuation + [0] * 50  # pad (id 0) after the script
    return HFEngine(ScriptedLM(script, len(tokenizer), tokenizer.eos_token_id), tokenizer)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


PROMPT = [10, 11, 12]  # any 3 tokens: ScriptedLM ignores the content


def test_stop_string_spelled_over_tokens_is_cut_inside_the_last_token(tokenizer):
    continuation = ids(tokenizer, "The answer is Oslo, founded 1987 and more")
    # The stop string ends inside " founded", which is one token: the text stops at "fo",
    # the token ids include the whole " founded" token and nothing after it.
    founded = ids(tokenizer, " founded")
    assert len(founded) == 1
    k = continuation.index(founded[0]) + 1
    engine = scripted_engine(tokenizer, continuation)
    params = SamplingParams(temperature=0.0, max_new_tokens=30, stop=["Oslo, fo"])
    [out] = engine.generate([PROMPT], params)
    assert out == Completion(continuation[:k], "The answer is Oslo, fo", "stop", "Oslo, fo")
    assert len(ids(tokenizer, "The answer is Oslo,")) > 3  # the stop really spans several tokens


def test_single_token_tag_stop(tokenizer):
    continuation = ids(tokenizer, "<search> Alma Varn </search> tail text")
    engine = scripted_engine(tokenizer, continuation)
    params = SamplingParams(temperature=0.0, max_new_tokens=30, stop=["</search>", "</answer>"])
    [out] = engine.generate([PROMPT], params)
    close = tokenizer.convert_tokens_to_ids("</search>")
    assert out.token_ids == continuation[: continuation.index(close) + 1]
    assert out.token_ids[-1] == close
    assert out.text == "<search> Alma Varn </search>"
    assert (out.finish_reason, out.stop) == ("stop", "</search>")


def test_first_ending_stop_string_wins(tokenizer):
    continuation = ids(tokenizer, "Alma Varn <answer> x </answer>")
    engine = scripted_engine(tokenizer, continuation)
    # "Varn" ends before "</answer>" does.
    params = SamplingParams(temperature=0.0, max_new_tokens=30, stop=["</answer>", "Varn"])
    assert engine.generate([PROMPT], params)[0].text == "Alma Varn"
    # " Varn" is one token that completes both "Varn" and "Va" at once: "Va" ends first.
    assert len(ids(tokenizer, " Varn")) == 1
    params = SamplingParams(temperature=0.0, max_new_tokens=30, stop=["Varn", "Va"])
    out = engine.generate([PROMPT], params)[0]
    assert (out.text, out.stop, out.token_ids) == ("Alma Va", "Va", ids(tokenizer, "Alma Varn"))


def test_eos_ends_with_stop_reason_and_no_stop_string(tokenizer):
    eos = tokenizer.eos_token_id
    continuation = [*ids(tokenizer, "Alma"), eos, *ids(tokenizer, " never seen")]
    engine = scripted_engine(tokenizer, continuation)
    params = SamplingParams(temperature=0.0, max_new_tokens=30, stop=["</answer>"])
    [out] = engine.generate([PROMPT], params)
    assert out == Completion([*ids(tokenizer, "Alma"), eos], "Alma", "stop", None)


def test_length_finish_and_stop_on_the_last_allowed_token(tokenizer):
    continuation = ids(tokenizer, "<answer> Oslo </answer> and then more words")
    engine = scripted_engine(tokenizer, continuation)
    [out] = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert out == Completion(continuation[:2], tokenizer.decode(continuation[:2]), "length", None)
    # The stop string completes exactly at max_new_tokens: "stop" wins over "length".
    k = continuation.index(tokenizer.convert_tokens_to_ids("</answer>")) + 1
    params = SamplingParams(temperature=0.0, max_new_tokens=k, stop=["</answer>"])
    assert engine.generate([PROMPT], params)[0].finish_reason == "stop"
    # A stop string in the prompt does not count: only generated text is searched.
    prompt = ids(tokenizer, "a </answer>")[:3]
    assert len(prompt) == 3 and tokenizer.convert_tokens_to_ids("</answer>") in prompt
    params = SamplingParams(temperature=0.0, max_new_tokens=1, stop=["</answer>"])
    assert engine.generate([prompt], params)[0].finish_reason == "length"


def test_rows_finish_at_different_steps_in_one_batch(tokenizer):
    # Position-scripted: a prompt of length L continues with script[L:].
    text = "Alma Varn <search> Oslo </search> was founded in 1987 <answer> 1987 </answer> end"
    script = ids(tokenizer, text) + [0] * 40
    engine = HFEngine(ScriptedLM(script, len(tokenizer), tokenizer.eos_token_id), tokenizer, batch_size=8)
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop=["</search>", "</answer>"])
    prompts = [script[:length] for length in (2, 6, 9, 4)]
    batched = engine.generate(prompts, params)
    alone = [engine.generate([p], params)[0] for p in prompts]
    assert batched == alone
    # Hand check of two rows: length 2 reaches </search> within 6 tokens; length 9 does not.
    assert batched[0].text == " <search> Oslo </search>" and batched[0].stop == "</search>"
    assert batched[2].finish_reason == "length" and batched[2].token_ids == script[9:15]


def test_n_samples_are_prompt_major(tokenizer):
    script = ids(tokenizer, "one two three four five six seven eight nine ten") + [0] * 40
    engine = HFEngine(
        ScriptedLM(script, len(tokenizer), tokenizer.eos_token_id), tokenizer, batch_size=4
    )  # 4 // 3 = 1 prompt per chunk
    params = SamplingParams(temperature=1.0, max_new_tokens=2, n=3, seed=0)
    prompts = [script[:2], script[:5]]  # the engine reorders internally (longest first)
    out = engine.generate(prompts, params)
    assert [c.token_ids for c in out] == [script[2:4]] * 3 + [script[5:7]] * 3


def test_greedy_matches_transformers_generate(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    for text in ["Alma Varn was", "Where was Alma Varn born? <search>", "the"]:
        prompt = ids(tokenizer, text)
        expected = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        out = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=12))[0]
        # eos_token_id=None above: transformers never stops early, so compare up to our stop.
        assert out.token_ids == expected[: len(out.token_ids)]


def test_greedy_is_the_same_alone_and_in_batches(model, tokenizer):
    prompts = [
        ids(tokenizer, t)
        for t in [
            "Alma",
            "Where was Alma Varn born?",
            "founded in 1987 by the",
            "Oslo is",
            "x y z w v u t s",
        ]
    ]
    params = SamplingParams(temperature=0.0, max_new_tokens=16, stop=["</search>"])
    alone = [HFEngine(model, tokenizer).generate([p], params)[0] for p in prompts]
    assert HFEngine(model, tokenizer, batch_size=64).generate(prompts, params) == alone
    assert HFEngine(model, tokenizer, batch_size=2).generate(prompts, params) == alone
    # Greedy n=2: both copies equal the n=1 result.
    doubled = HFEngine(model, tokenizer).generate(
        prompts, SamplingParams(temperature=0.0, max_new_tokens=16, stop=["</search>"], n=2)
    )
    assert doubled == [c for c in alone for _ in range(2)]


def test_seed_reproducibility_and_n_samples_differ(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prompts = [ids(tokenizer, "Alma Varn was"), ids(tokenizer, "Oslo")]
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=10, n=4, seed=7)
    first = engine.generate(prompts, params)
    assert len(first) == 8
    assert engine.generate(prompts, params) == first
    other = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=10, n=4, seed=8))
    assert [c.token_ids for c in other] != [c.token_ids for c in first]
    # The 4 samples of one prompt are not copies of each other (random weights: near-uniform).
    assert len({tuple(c.token_ids) for c in first[:4]}) > 1


def test_logprobs_match_a_manual_forward(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    prompts = [ids(tokenizer, "Where was Alma Varn born?"), ids(tokenizer, "Oslo")]
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=1, logprobs=True)
    for prompt, out in zip(prompts, engine.generate(prompts, params)):
        assert len(out.logprobs) == len(out.token_ids)
        sequence = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(sequence).logits[0, len(prompt) - 1 : -1]  # predicts each generated id
        # Temperature-1 log-softmax of the raw logits, whatever temperature sampled the token.
        expected = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(out.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-5)
    greedy = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=4))
    assert all(c.logprobs is None for c in greedy)


def test_string_prompts_equal_token_prompts(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    texts = ["Alma Varn was", "Where is Oslo?"]
    as_ids = [ids(tokenizer, t) for t in texts]
    assert engine.generate(texts, GREEDY) == engine.generate(as_ids, GREEDY)


# --------------------------------------------------------------------------- prefix reuse

INFO = list(range(60, 75))  # stands for an inserted information block: ids not in SCRIPT_IDS
SCRIPT_IDS = list(range(100, 190))


def test_prefix_reuse_on_hand_computed_lengths(tokenizer):
    assert tokenizer.eos_token_id < 60 and tokenizer.pad_token_id < 60  # no row ends early
    script, mark, other = SCRIPT_IDS, INFO[0], INFO[1]
    lm = ScriptedLM(script, len(tokenizer), tokenizer.eos_token_id)
    engine = HFEngine(lm, tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=3)

    def run(prompts: list[list[int]]) -> tuple[list[list[int]], dict[str, int]]:
        """Outputs and the change in engine.stats of one call."""
        lm.contexts.clear()
        before = dict(engine.stats)
        outs = [c.token_ids for c in engine.generate(prompts, params)]
        # The prefill forwards (the first rows recorded) showed each row its whole prompt, the
        # last decode step its prompt and all generated ids but the last: the kept keys and
        # values were put back in place.
        assert sorted(lm.contexts[: len(prompts)]) == sorted(prompts)
        assert all(p + out[:-1] in lm.contexts for p, out in zip(prompts, outs))
        return outs, {k: engine.stats[k] - before[k] for k in before}

    # Turn 1: no cache. Each row keeps prompt + 2 of its 3 ids (the 3rd was never fed): 6 + 9.
    # One prefill group (7 <= 2 * 4 + 16), window 7: 2 x 7 slots.
    outs, stats = run([script[:4], script[:7]])
    assert outs == [script[4:7], script[7:10]]
    # 3 decode steps (one per generated id, the last never fed), 2 rows x 3 ids decoded.
    assert stats == {"prompt_tokens": 11, "reused_tokens": 0, "prefill_tokens": 11, "prefill_slots": 14,
                     "decode_steps": 3, "decoded_tokens": 6}  # fmt: skip
    assert engine.kept_tokens == 15

    # Turn 2: a extends the 6 kept tokens of row 0 (suffix 3), b the 9 of row 1 (suffix 6);
    # c has no cached prefix (4 tokens). One group, window = longest suffix = 6, so a keeps
    # 9 - 6 = 3 and recomputes 3 of its cached tokens, b keeps 15 - 6 = 9, c (shorter than the
    # window, left-padded) 0.
    a = script[:7] + [mark] * 2
    b = script[:10] + [mark] * 5
    c = [mark] * 4
    outs, stats = run([a, b, c])
    assert outs == [script[9:12], script[15:18], script[4:7]]  # true positions: 9, 15, 4
    assert stats == {"prompt_tokens": 28, "reused_tokens": 12, "prefill_tokens": 16, "prefill_slots": 18,
                     "decode_steps": 3, "decoded_tokens": 9}  # fmt: skip
    assert engine.kept_tokens == (9 + 2) + (15 + 2) + (4 + 2)

    # Turn 3: f extends a's 11 kept tokens (suffix 4). d is a with its first token changed
    # (30 tokens): no reuse. e extends turn 1's row 0, but only the previous call's sequences
    # are kept: no reuse. Groups by suffix: [f 4, e 8] (8 <= 2 * 4 + 16) with window 8, so f
    # keeps 15 - 8 = 7; then [d 30] (30 > 24) alone. The two caches merge into one batch.
    f = a + script[9:12] + [mark] * 3
    d = [other] + a[1:] + script[9:12] + [mark] * 18
    e = script[:8]
    outs, stats = run([f, d, e])
    assert outs == [script[15:18], script[30:33], script[8:11]]
    assert stats == {"prompt_tokens": 53, "reused_tokens": 7, "prefill_tokens": 46, "prefill_slots": 2 * 8 + 30,
                     "decode_steps": 3, "decoded_tokens": 9}  # fmt: skip

    # A prompt equal to a kept sequence reuses all but its last token (which gives the logits).
    outs, stats = run([f + script[15:17]])  # f's kept sequence: f + the first 2 generated ids
    assert outs == [script[17:20]] and stats["reused_tokens"] == 16 and stats["prefill_slots"] == 1

    engine.reset_prefix_cache()
    assert engine.kept_tokens == 0
    outs, stats = run([f + script[15:17] + [mark]])
    assert stats["reused_tokens"] == 0 and outs == [script[18:21]]


def test_similar_lengths_groups():
    # Sorted: 7, 7 | 40 > 2 * 7 + 16 = 30 starts a group; 73 <= 2 * 40 + 16 = 96 joins it |
    # 100 > 96 starts one; 124 <= 216 joins it.
    assert similar_lengths([7, 73, 7, 124, 100, 40]) == [[0, 2], [1, 5], [3, 4]]
    assert similar_lengths([5]) == [[0]]
    # The bound is inclusive: 36 = 2 * 10 + 16 joins, 37 does not.
    assert similar_lengths([36, 10]) == [[0, 1]]
    assert similar_lengths([37, 10]) == [[1], [0]]


def three_turns(engine: HFEngine, prompts: list[list[int]], params: SamplingParams):
    """A scripted multi-turn sequence; each turn's prompts depend on the previous outputs.

    Turn 2 extends rows 0 and 1 with inserts of different lengths (7 and 2 ids), gives row 2 a
    changed first token and a long insert (not an extension: no reuse, and long enough to be
    prefilled apart from the others, whose caches are then merged with its), drops row 3
    (finished) and adds a fresh prompt. Turn 3 extends every turn-2 row, with n=2 samples each.
    """
    first = engine.generate(prompts, params)
    turn2 = [
        prompts[0] + first[0].token_ids + INFO[:7],
        prompts[1] + first[1].token_ids + INFO[:2],
        [INFO[0]] + prompts[2][1:] + first[2].token_ids + INFO * 2,
        prompts[4],
    ]
    # Uncached suffixes: last generated id + insert, or the whole prompt. Several groups.
    assert len(similar_lengths([1 + 7, 1 + 2, len(turn2[2]), len(turn2[3])])) > 1
    second = engine.generate(turn2, params)
    turn3 = [p + c.token_ids + INFO[: 4 + i] for i, (p, c) in enumerate(zip(turn2, second))]
    third = engine.generate(turn3, replace(params, n=2))
    return [first, second, third]


@pytest.mark.parametrize("batch_size", [64, 2])
@pytest.mark.parametrize(
    "params",
    [
        # Greedy: stop "e" ends one row after 1 token; the others run to 10.
        SamplingParams(temperature=0.0, max_new_tokens=10, stop=["e"], logprobs=True),
        # Seeded sampling: rows end at different steps (1 to 10 tokens).
        SamplingParams(temperature=1.0, max_new_tokens=10, stop=["a"], logprobs=True, seed=3),
    ],
)
def test_prefix_reuse_changes_no_output_over_three_turns(model, tokenizer, params, batch_size):
    texts = ["Where was Alma Varn born?", "Oslo", "founded in 1987 by the", "the answer is",
             "Varn was born in the"]  # fmt: skip
    prompts = [ids(tokenizer, t) for t in texts]
    on = HFEngine(model, tokenizer, batch_size=batch_size)
    off = HFEngine(model, tokenizer, batch_size=batch_size, prefix_cache=False)
    with_reuse = three_turns(on, prompts, params)
    without = three_turns(off, prompts, params)
    assert len({len(c.token_ids) for c in with_reuse[0]}) > 1  # rows finished at different steps
    for turn_on, turn_off in zip(with_reuse, without):
        assert [(c.token_ids, c.text, c.finish_reason, c.stop) for c in turn_on] == [
            (c.token_ids, c.text, c.finish_reason, c.stop) for c in turn_off
        ]
        for c_on, c_off in zip(turn_on, turn_off):
            assert torch.allclose(torch.tensor(c_on.logprobs), torch.tensor(c_off.logprobs), atol=1e-5, rtol=0)
    assert off.stats["reused_tokens"] == 0 and off.kept_tokens == 0
    assert on.stats["reused_tokens"] > 0
    assert on.stats["prompt_tokens"] == off.stats["prompt_tokens"]
    assert on.stats["prefill_tokens"] == off.stats["prompt_tokens"] - on.stats["reused_tokens"]


def test_kept_sequences_are_dropped_when_the_weights_change(model, tokenizer):
    engine = HFEngine(model, tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)

    def extend(prompt: list[int]) -> tuple[list[int], int]:
        """Generates on `prompt`; returns the next turn's prompt and the tokens reused."""
        before = engine.stats["reused_tokens"]
        [out] = engine.generate([prompt], params)
        return prompt + out.token_ids + INFO[:3], engine.stats["reused_tokens"] - before

    prompt = ids(tokenizer, "Where was Alma Varn born?")
    turn2, _ = extend(prompt)
    # The control: turn 2 reuses the prompt and 3 of the 4 generated ids (the 4th was never
    # fed); its window is its 4 uncached tokens.
    turn3, reused = extend(turn2)
    assert reused == len(prompt) + 3
    # An in-place update (as an optimizer step makes) bumps the parameter's version counter.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.0)
    turn4, reused = extend(turn3)
    assert reused == 0
    # The explicit reset, for updates the counters do not see.
    engine.reset_prefix_cache()
    assert engine.kept_tokens == 0
    _, reused = extend(turn4)
    assert reused == 0


def test_prefix_cache_off_keeps_nothing(model, tokenizer):
    engine = HFEngine(model, tokenizer, prefix_cache=False)
    prompt = ids(tokenizer, "Oslo")
    [out] = engine.generate([prompt], GREEDY)
    engine.generate([prompt + out.token_ids + INFO[:3]], GREEDY)
    assert engine.kept_tokens == 0 and engine.stats["reused_tokens"] == 0
    assert engine.stats["prefill_tokens"] == engine.stats["prompt_tokens"] == 2 * len(prompt) + 12 + 3
    assert engine.stats["prefill_slots"] == engine.stats["prompt_tokens"]  # one row per call


def test_training_mode_is_restored(model, tokenizer):
    model.train()
    try:
        HFEngine(model, tokenizer).generate([[5, 6, 7]], GREEDY)
        assert model.training
    finally:
        model.eval()


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(temperature=-1.0), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(max_new_tokens=0), "max_new_tokens"),
        (SamplingParams(n=0), "n must"),
        (SamplingParams(stop=[""]), "empty string"),
    ],
)
def test_bad_params_are_rejected(model, tokenizer, params, message):
    with pytest.raises(ValueError, match=message):
        HFEngine(model, tokenizer).generate([[5, 6]], params)


def test_empty_prompt_is_rejected(model, tokenizer):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        HFEngine(model, tokenizer).generate([[5], []], GREEDY)


def test_top_p_filter_keeps_the_nucleus():
    # Sorted probabilities 1/2, 1/4, 5/32, 3/32 (exact in binary); the mass of the strictly
    # more probable tokens is 0, 1/2, 3/4, 29/32. A token stays while that mass is < top_p.
    probs = torch.tensor([[5 / 32, 1 / 2, 3 / 32, 1 / 4]])
    assert torch.equal(top_p_filter(probs, 0.5), torch.tensor([[0, 1 / 2, 0, 0]]))
    assert torch.equal(top_p_filter(probs, 0.7), torch.tensor([[0, 1 / 2, 0, 1 / 4]]))
    assert torch.equal(top_p_filter(probs, 0.75), torch.tensor([[0, 1 / 2, 0, 1 / 4]]))
    assert torch.equal(top_p_filter(probs, 0.76), torch.tensor([[5 / 32, 1 / 2, 0, 1 / 4]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)


def test_sample_next_greedy_and_temperature():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    greedy = sample_next(logits, temperature=0.0, top_p=1.0, generator=None)
    assert greedy.tolist() == [1, 0]
    # Logits (0, ln 3): p(1) = 3/4 at temperature 1; at temperature 1/2 the logits double to
    # (0, 2 ln 3), so p(1) = 9/10. 20000 draws: standard error 0.002, so +-0.01 is 5 sigma.
    two = torch.tensor([[0.0, torch.log(torch.tensor(3.0)).item()]]).expand(20000, 2)
    generator = torch.Generator().manual_seed(0)
    hot = sample_next(two, temperature=1.0, top_p=1.0, generator=generator).float().mean()
    cold = sample_next(two, temperature=0.5, top_p=1.0, generator=generator).float().mean()
    assert abs(hot.item() - 0.75) < 0.01 and abs(cold.item() - 0.9) < 0.01
    # top_p 0.5 keeps only the 3/4 token: every draw is 1.
    nucleus = sample_next(two, temperature=1.0, top_p=0.5, generator=generator)
    assert bool((nucleus == 1).all())


def test_sample_next_marks_rows_with_non_finite_logits():
    logits = torch.tensor([[0.0, 3.0, 1.0], [float("nan"), 0.0, 0.0], [0.0, float("inf"), 0.0], [1e38, 0.0, 0.0]])
    assert sample_next(logits, temperature=0.0, top_p=1.0, generator=None).tolist() == [1, -1, -1, 0]
    # At temperature 1e-3 row 3's 1e38 overflows float32 to inf: marked too, never sampled.
    generator = torch.Generator().manual_seed(0)
    assert sample_next(logits, temperature=1e-3, top_p=0.9, generator=generator).tolist() == [1, -1, -1, -1]


class NanAfter(ScriptedLM):
    """ScriptedLM whose logits turn nan for batch rows `rows` from position `position` on."""

    def __init__(self, *args, rows: set[int], position: int) -> None:
        super().__init__(*args)
        self.nan_rows, self.nan_position = rows, position

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep=0):
        out = super().forward(input_ids, attention_mask, position_ids, past_key_values, use_cache, logits_to_keep)
        for b in self.nan_rows & set(range(len(input_ids))):  # the prefill has one row per prompt
            out.logits[b, position_ids[b] >= self.nan_position] = float("nan")
        return out


def test_non_finite_logits_raise_a_clear_error_naming_rows_and_token(tokenizer):
    script = [0] * 3 + list(range(40, 60))
    lm = NanAfter(script, len(tokenizer), tokenizer.eos_token_id, rows={1}, position=5)
    engine = HFEngine(lm, tokenizer, prefix_cache=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=10, n=2, seed=0)
    # Prompts of 3 tokens: the logits after position 5 give generated token 4 (positions 3, 4, 5).
    with pytest.raises(NonFiniteError, match=r"1 row\(s\) \(prompt 0 sample 1\) at generated token 4"):
        engine.generate([[10, 11, 12]], params)
    # A row that finished before its logits went bad ends normally.
    lm.nan_position = 7
    stop = SamplingParams(temperature=0.0, max_new_tokens=3)
    assert [c.token_ids for c in engine.generate([[10, 11, 12]] * 2, stop)] == [script[3:6]] * 2


@pytest.mark.parametrize("compile", [False, True])
def test_non_finite_weights_end_a_real_model_with_the_error(model, tokenizer, compile, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)  # the static path, eagerly
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.lm_head.weight[5] = float("inf")  # logit 5 is +-inf or nan for every row
    with pytest.raises(
        NonFiniteError, match=r"2 row\(s\) \(prompt 0 sample 0, prompt 1 sample 0\) at generated token 1"
    ):
        HFEngine(broken, tokenizer, compile=compile).generate(
            [[5, 6, 7], [8, 9]], SamplingParams(temperature=1.0, max_new_tokens=4)
        )


@pytest.mark.parametrize("batch_size", [64, 2])
def test_static_cache_decoding_gives_the_eager_greedy_tokens(model, tokenizer, batch_size, monkeypatch):
    """compile=True's static-cache loop, with torch.compile replaced by the identity (a real compile: below)."""
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    texts = ["Where was Alma Varn born?", "Oslo", "founded in 1987 by the", "the answer is", "Varn was born in the"]
    prompts = [ids(tokenizer, t) for t in texts]
    params = SamplingParams(temperature=0.0, max_new_tokens=10, stop=["e"], logprobs=True)
    static = HFEngine(model, tokenizer, batch_size=batch_size, compile=True)
    eager = HFEngine(model, tokenizer, batch_size=batch_size)
    turns_static, turns_eager = three_turns(static, prompts, params), three_turns(eager, prompts, params)
    assert len({len(c.token_ids) for c in turns_eager[0]}) > 1  # rows finished at different steps
    for turn_static, turn_eager in zip(turns_static, turns_eager):
        assert [(c.token_ids, c.text, c.finish_reason) for c in turn_static] == [
            (c.token_ids, c.text, c.finish_reason) for c in turn_eager
        ]
        for c_static, c_eager in zip(turn_static, turn_eager):
            assert torch.allclose(torch.tensor(c_static.logprobs), torch.tensor(c_eager.logprobs), atol=1e-5, rtol=0)
    assert static.stats["reused_tokens"] == eager.stats["reused_tokens"] > 0  # kept from the static cache
    assert static.kept_tokens == eager.kept_tokens


# Real torch.compile against eager decoding: tests/generation/test_compiled_agreement.py.


def test_stop_filter_skips_only_tokens_that_cannot_end_a_stop(tokenizer, model):
    engine = HFEngine(model, tokenizer)
    keep = engine._stop_filter(["</search>", "Oslo, fo"])
    assert keep is not None and len(keep) == len(tokenizer)
    close = tokenizer.convert_tokens_to_ids("</search>")
    assert keep[close] and keep[ids(tokenizer, " founded")[0]]  # ">" and "o"
    assert not keep[ids(tokenizer, " Varn")[0]]  # neither ">" nor "o"
    assert engine._stop_filter(["end "]) is None and engine._stop_filter([]) is None
