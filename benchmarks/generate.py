"""Generation speed of HFEngine: batched vs one prompt at a time vs a bare KV-cached loop.

Run:  python -m benchmarks.generate [--prompts 32] [--new-tokens 64] [--repeats 3]
          [--threads N]

For each tiny Qwen2 model built in-process (random weights, 1000-token byte-level BPE), on the same
prompts (equal length, so the bare loop needs no padding):

- engine batched:    HFEngine.generate on all prompts in one call (greedy, with a stop string,
                     so the per-step stop check is paid as in a rollout);
- engine sequential: HFEngine.generate on one prompt per call;
- bare loop:         prefill + greedy argmax decode steps over a DynamicCache, nothing else:
                     the ceiling the engine's bookkeeping is measured against;
- hf generate:       transformers' `model.generate` with the same stop string, for reference.

Tokens/s counts generated tokens. Each measurement is repeated `--repeats` times, interleaved so
that load on this shared machine hits all three alike, and the best run is kept. The last line
printed is one JSON object with the ratios (for the first, default-sized model) and every raw
figure.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time

import torch
from transformers import DynamicCache, PreTrainedModel

from simsearch.generation.hf import HFEngine
from simsearch.models import TAG_TOKENS, build_tiny_model, train_tokenizer
from simsearch.types import SamplingParams

MODELS = {
    "h128-l4": dict(hidden=128, layers=4, heads=4, kv_heads=2, ffn=384),
    "h256-l6": dict(hidden=256, layers=6, heads=4, kv_heads=2, ffn=768),
}


def synthetic_texts(rng: random.Random, count: int) -> list[str]:
    """Sentences of random lowercase words with the tags, enough to fill a 1000-token BPE."""
    texts = []
    for _ in range(count):
        words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(rng.randint(8, 24))]
        tag = rng.choice(TAG_TOKENS)
        texts.append(f"{' '.join(words)} {tag} {rng.randint(0, 9999)}.")
    return texts


def bare_loop(model: PreTrainedModel, prompts: torch.Tensor, new_tokens: int) -> int:
    """Greedy decoding with nothing but the model and its KV cache; returns tokens generated."""
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1, :].argmax(-1, keepdim=True)  # [B, 1]
        for _ in range(new_tokens - 1):
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1, :].argmax(-1, keepdim=True)
    return prompts.shape[0] * new_tokens


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def bench_model(
    name: str, model: PreTrainedModel, engine: HFEngine, prompts: list[list[int]], args
) -> dict[str, float]:
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens, stop=["</answer>"])
    prompt_tensor = torch.tensor(prompts)
    sequential_prompts = prompts[: args.sequential_prompts]

    def batched() -> int:
        return sum(len(c.token_ids) for c in engine.generate(prompts, params))

    def sequential() -> int:
        return sum(len(engine.generate([p], params)[0].token_ids) for p in sequential_prompts)

    def bare() -> int:
        return bare_loop(model, prompt_tensor, args.new_tokens)

    def hf_generate() -> int:
        """transformers' own generate with a stop string, for reference."""
        out = model.generate(
            input_ids=prompt_tensor,
            attention_mask=torch.ones_like(prompt_tensor),
            do_sample=False,
            max_new_tokens=args.new_tokens,
            stop_strings=["</answer>"],
            tokenizer=engine.tokenizer,
            pad_token_id=engine.pad_id,
        )
        return int((out[:, prompt_tensor.shape[1] :] != engine.pad_id).sum())

    runs = {"batched": batched, "sequential": sequential, "bare_loop": bare, "hf_generate": hf_generate}
    # Warm-up (allocator, kernels, tokenizer caches), short: a few tokens each.
    warm = SamplingParams(temperature=0.0, max_new_tokens=4, stop=["</answer>"])
    engine.generate(prompts, warm)
    engine.generate(prompts[:1], warm)
    bare_loop(model, prompt_tensor, 4)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for key, fn in runs.items():
            seconds, tokens = timed(fn)
            best[key] = max(best.get(key, 0.0), tokens / seconds)
    return {
        f"{name}/batched_tokens_per_s": best["batched"],
        f"{name}/sequential_tokens_per_s": best["sequential"],
        f"{name}/bare_loop_tokens_per_s": best["bare_loop"],
        f"{name}/hf_generate_tokens_per_s": best["hf_generate"],
        f"{name}/batched_over_sequential": best["batched"] / best["sequential"],
        f"{name}/batched_over_bare_loop": best["batched"] / best["bare_loop"],
    }


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring); sets torch's threads when --threads is given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32, help="prompts in the batched call")
    parser.add_argument("--prompt-tokens", type=int, default=80, help="tokens per prompt")
    parser.add_argument("--new-tokens", type=int, default=64, help="max new tokens per prompt")
    parser.add_argument(
        "--sequential-prompts", type=int, default=8, help="prompts generated one at a time (tokens/s is a rate)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; best kept")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 keeps torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Every model's figures, keyed `MODEL/figure`, plus torch_threads."""
    rng = random.Random(args.seed)
    tokenizer = train_tokenizer(synthetic_texts(rng, 3000), vocab_size=1000)
    # Prompts of ordinary (non-special) tokens, all the same length.
    first_plain = len(tokenizer.all_special_ids)
    prompts = [
        [rng.randrange(first_plain, len(tokenizer)) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)
    ]
    figures: dict[str, float] = {"torch_threads": torch.get_num_threads()}
    for name in args.models:
        model = build_tiny_model(tokenizer, seed=args.seed, **MODELS[name])
        engine = HFEngine(model, tokenizer, batch_size=args.prompts)
        figures.update(bench_model(name, model, engine, prompts, args))
        params_m = sum(p.numel() for p in model.parameters()) / 1e6
        figures[f"{name}/params_millions"] = params_m
    return figures


def print_table(args: argparse.Namespace, figures: dict[str, float]) -> None:
    """One row per model: parameters, the four rates and the two ratios."""
    print(
        f"tokens/s; {args.prompts} prompts x {args.prompt_tokens} tokens, "
        f"{args.new_tokens} new tokens, greedy, best of {args.repeats}, "
        f"{torch.get_num_threads()} torch threads"
    )
    header = (
        f"{'model':10} {'params':>7} {'batched':>10} {'one-by-one':>11} {'bare loop':>10} "
        f"{'hf generate':>12} {'batch/seq':>10} {'batch/bare':>11}"
    )
    print(header)
    print("-" * len(header))
    for name in args.models:
        print(
            f"{name:10} {figures[f'{name}/params_millions']:6.2f}M "
            f"{figures[f'{name}/batched_tokens_per_s']:10.0f} "
            f"{figures[f'{name}/sequential_tokens_per_s']:11.0f} "
            f"{figures[f'{name}/bare_loop_tokens_per_s']:10.0f} "
            f"{figures[f'{name}/hf_generate_tokens_per_s']:12.0f} "
            f"{figures[f'{name}/batched_over_sequential']:9.1f}x "
            f"{figures[f'{name}/batched_over_bare_loop']:10.0%}"
        )


def summary(first: str, figures: dict[str, float]) -> dict[str, float]:
    """The final JSON object: the first model's ratios and rates, then every raw figure rounded."""
    return {
        "batched_over_sequential": figures[f"{first}/batched_over_sequential"],
        "batched_over_bare_loop": figures[f"{first}/batched_over_bare_loop"],
        "batched_tokens_per_s": figures[f"{first}/batched_tokens_per_s"],
        "sequential_tokens_per_s": figures[f"{first}/sequential_tokens_per_s"],
        "bare_loop_tokens_per_s": figures[f"{first}/bare_loop_tokens_per_s"],
        **{k: round(v, 3) for k, v in figures.items()},
    }


def main() -> None:
    args = parse_args()
    figures = measure(args)
    print_table(args, figures)
    print(json.dumps(summary(args.models[0], figures)))


if __name__ == "__main__":
    main()
