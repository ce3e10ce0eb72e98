"""Compiled decoding (`HFEngine(compile=True)`) against eager decoding, as issue 56 asks.

- float32 with TF32 off: the greedy tokens must be identical (CPU here; CUDA where there is one).
- bfloat16 (CUDA only): teacher-forced, both engines read the same forced text; every forced
  token's log-probability may move at most a bound calibrated on eager against eager (the same
  prompts decoded in two half batches), and an argmax may flip only where eager's two best
  tokens lie closer than twice that bound. Identical greedy tokens are not asked for: random-weight
  logits have near-ties, and fused casts round differently (docs/scaling.md).

The harness (`teacher_forced_logprobs`, `agreement`, `agrees`) is benchmarks/gpu_check.py's: its
compiled part reports the same figures on a GPU.
"""

from __future__ import annotations

import copy
import random
from contextlib import contextmanager

import pytest
import torch

from simsearch.generation.hf import HFEngine
from simsearch.models import build_tiny_model, train_tokenizer
from simsearch.types import SamplingParams

CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def gpu_check():
    from benchmarks import gpu_check

    return gpu_check


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    words = ["Alma", "Varn", "Oslo", "founded", "born", "answer", "the", "is", "1987", "was", "in"]
    texts = [" ".join(rng.choices(words, k=10)) + " <search> q </search> <answer> a </answer>" for _ in range(300)]
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, seed=0)


def untied(model, seed: int = 0):
    """A copy of `model` with its own random output head: a tiny tied model's argmax is mostly its input
    token, which would make agreement trivial; this one's next tokens vary, near-ties included."""
    copied = copy.deepcopy(model)
    head = torch.randn(copied.lm_head.weight.shape, generator=torch.Generator().manual_seed(seed))
    copied.lm_head.weight = torch.nn.Parameter(head)
    return copied


def prompts_of(tokenizer) -> list[list[int]]:
    texts = ["Where was Alma Varn born?", "Oslo", "the answer is", "founded in 1987 by the"]  # unequal lengths
    return [tokenizer(t)["input_ids"] for t in texts]


@contextmanager
def tf32_off():
    """float32 matmuls and convolutions in full float32 (TF32 off), as the float32 comparison needs."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def test_teacher_forcing_feeds_the_forced_text_and_the_static_loop_agrees_with_eager(
    gpu_check, model, tokenizer, monkeypatch
):
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)  # the static-cache loop, eagerly
    prompts = prompts_of(tokenizer)
    eager = HFEngine(model, tokenizer, prefix_cache=False)
    forced = gpu_check.forced_tokens(eager, len(prompts), 6, len(tokenizer))
    reference = gpu_check.teacher_forced_logprobs(eager, prompts, forced)  # asserts the rows got their text
    assert reference["chosen"].shape == (4, 6) and reference["top2"].shape == (4, 6, 2)
    # Row by row, the same as one prompt alone (the rows were mapped back to prompt order).
    alone = gpu_check.teacher_forced_logprobs(eager, prompts[1:2], forced[1:2])
    torch.testing.assert_close(alone["chosen"][0], reference["chosen"][1], rtol=0, atol=1e-5)
    static = HFEngine(model, tokenizer, prefix_cache=False, compile=True)
    found = gpu_check.agreement(reference, gpu_check.teacher_forced_logprobs(static, prompts, forced))
    assert found["flips"] == 0 and found["max_logprob_delta"] < 1e-5 and found["positions"] == 24
    assert gpu_check.agrees(found, found)


def test_the_rule_refuses_a_flip_between_clearly_separated_tokens(gpu_check, model, tokenizer):
    prompts = prompts_of(tokenizer)
    eager = HFEngine(model, tokenizer, prefix_cache=False)
    forced = gpu_check.forced_tokens(eager, len(prompts), 6, len(tokenizer))
    reference = gpu_check.teacher_forced_logprobs(eager, prompts, forced)
    broken = untied(model)  # another output head: clear flips
    found = gpu_check.agreement(
        reference, gpu_check.teacher_forced_logprobs(HFEngine(broken, tokenizer, prefix_cache=False), prompts, forced)
    )
    noise = {"max_logprob_delta": 0.0}
    assert found["flips"] > 0 and not gpu_check.agrees(found, noise)
    # Rounding-sized changes with a flip only on a near-tie pass; the same flip on a clear margin fails.
    bound = gpu_check.AGREEMENT_SLACK * gpu_check.AGREEMENT_MIN_NOISE
    assert gpu_check.agrees({"max_logprob_delta": bound, "largest_flip_margin": 1.9 * bound}, noise)
    assert not gpu_check.agrees({"max_logprob_delta": bound, "largest_flip_margin": 2 * bound}, noise)
    assert not gpu_check.agrees({"max_logprob_delta": 1.01 * bound, "largest_flip_margin": 0.0}, noise)


@pytest.mark.slow
def test_compiled_float32_decoding_with_tf32_off_gives_the_eager_greedy_tokens(gpu_check, model, tokenizer):
    """torch.compile for real (inductor on CPU: about 20-50 s here, mostly compiling); on CUDA where there is one."""
    device = "cuda" if CUDA else "cpu"
    on_device = untied(model, seed=1).to(device=device, dtype=torch.float32)
    prompts = prompts_of(tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    with tf32_off():
        compiled = HFEngine(on_device, tokenizer, compile=True, prefix_cache=False)
        eager = HFEngine(on_device, tokenizer, prefix_cache=False)
        expected = [c.token_ids for c in eager.generate(prompts, params)]
        assert [c.token_ids for c in compiled.generate(prompts, params)] == expected
        assert compiled.stats["decode_steps"] == 8 and compiled.stats["decoded_tokens"] == 32
        forced = gpu_check.forced_tokens(eager, len(prompts), 8, len(tokenizer))
        found = gpu_check.agreement(
            gpu_check.teacher_forced_logprobs(eager, prompts, forced),
            gpu_check.teacher_forced_logprobs(compiled, prompts, forced),
        )
    assert found["flips"] == 0 and found["max_logprob_delta"] < 1e-4


@pytest.mark.skipif(not CUDA, reason="bfloat16 compiled-vs-eager numerics need CUDA (fused casts, CUDA graphs)")
def test_compiled_bf16_decoding_agrees_with_eager_within_eager_noise(gpu_check, model, tokenizer):
    bf16 = untied(model, seed=1).to(device="cuda", dtype=torch.bfloat16)
    prompts = prompts_of(tokenizer) * 4  # 16 rows: halves of 8 make the noise
    eager = HFEngine(bf16, tokenizer, prefix_cache=False)
    forced = gpu_check.forced_tokens(eager, len(prompts), 16, len(tokenizer))
    reference = gpu_check.teacher_forced_logprobs(eager, prompts, forced)
    half = HFEngine(bf16, tokenizer, batch_size=8, prefix_cache=False)
    noise = gpu_check.agreement(
        reference,
        gpu_check.concatenated(
            [gpu_check.teacher_forced_logprobs(half, prompts[s], forced[s]) for s in (slice(0, 8), slice(8, None))]
        ),
    )
    compiled = HFEngine(bf16, tokenizer, compile=True, prefix_cache=False)
    found = gpu_check.agreement(reference, gpu_check.teacher_forced_logprobs(compiled, prompts, forced))
    assert gpu_check.agrees(found, noise), (found, noise)
