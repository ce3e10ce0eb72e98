"""A toy QA world for `simsearch train` tests: item colors, a corpus that states them, a tiny policy.

The policy (a tiny Qwen2 fine-tuned for a few seconds) searches once and then answers red or blue
at random, so rollouts really search, rewards vary inside groups, and every estimator gets a
learning signal.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from simsearch.data.rendering import render_documents, wrap_information
from simsearch.data.templates import SEARCH_R1_TEMPLATE, render_prompt
from simsearch.models import build_tiny_model, save_tiny, train_tokenizer
from simsearch.types import Document, Passage

COLORS = ("red", "blue")
QUESTIONS = [(f"What color is item {i}?", COLORS[i % 2]) for i in range(16)]
SEARCH_TURN = "<think> look </think>\n<search> item color </search>"
TRAIN_SETTINGS: dict[str, object] = {
    "search.kind": "bm25",
    "search.top_k": 1,
    "sampling.max_new_tokens": 16,
    "rollout.max_turns": 1,
    "rollout.group_size": 4,
    "rollout.max_obs_tokens": 64,
    "rollout.max_context_tokens": 256,
    "prompts_per_step": 2,
    "micro_batch_size": 4,
    "steps": 2,
    "save_every": 0,
    "tensorboard": "false",
    "optim.lr": 1e-3,
    "curriculum.p_end": 0.5,
}
"""`simsearch train` overrides that fit the toy world (besides its paths): one search, groups of 4, two steps."""


def item_passage(i: int, answer: str) -> Passage:
    return Passage(id=str(i), title=f'"Item {i}"', text=f"Item {i} is {answer}.")


def build_world(root: Path) -> Path:
    """Write the toy world into `root` (the same files and weights each time on one machine)."""
    rows = [{"id": str(i), "question": q, "golden_answers": [a]} for i, (q, a) in enumerate(QUESTIONS)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    passages = [item_passage(i, a) for i, (_, a) in enumerate(QUESTIONS)]
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in passages)
    )
    texts = [SEARCH_R1_TEMPLATE.format(question=q) for q, _ in QUESTIONS] * 20 + [
        SEARCH_TURN, wrap_information(render_documents([Document("Item 1", "Item 1 is red.")])),
        "<think> ok </think>\n<answer> red </answer>", "<answer> blue </answer>",
    ] * 20  # fmt: skip
    tokenizer = train_tokenizer(texts, vocab_size=1000)
    model = build_tiny_model(tokenizer, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seed=0)
    teach_format(model, tokenizer, passages)
    save_tiny(model, tokenizer, root / "policy")
    return root


def teach_format(model: torch.nn.Module, tokenizer, passages: list[Passage]) -> None:
    """A few seconds of SFT on `prompt, search turn, information, answer turn` (either color)."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    sequences = []
    for (question, _), passage in zip(QUESTIONS, passages):
        prompt = tokenizer.encode(render_prompt(question, template="search-r1"))
        search, info = (
            encode(SEARCH_TURN),
            encode(wrap_information(render_documents([Document(passage.title, passage.text)]))),
        )
        for color in COLORS:
            answer = [*encode(f"<think> ok </think>\n<answer> {color} </answer>"), tokenizer.eos_token_id]
            ids = prompt + search + info + answer
            mask = [0] * len(prompt) + [1] * len(search) + [0] * len(info) + [1] * len(answer)
            sequences.append((ids, mask))
    width = max(len(ids) for ids, _ in sequences)
    inputs = torch.full((len(sequences), width), tokenizer.pad_token_id)
    targets = torch.zeros((len(sequences), width))
    for row, (ids, mask) in enumerate(sequences):
        inputs[row, : len(ids)] = torch.tensor(ids)
        targets[row, : len(ids)] = torch.tensor(mask, dtype=torch.float)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(60):
        rows = torch.randint(0, len(sequences), (8,), generator=generator)
        logits = model(input_ids=inputs[rows]).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), inputs[rows][:, 1:], reduction="none")
        mask = targets[rows][:, 1:]
        loss = (losses * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
