"""What a tiny-world base can do: name the asked person (`query_naming`), read results (`reading_accuracy`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from simsearch.data.chat import ToolConversation, search_tool_schema, tool_call_messages
from simsearch.data.rendering import RenderStyle, render_documents, wrap_information
from simsearch.data.templates import TemplateName, render_prompt
from simsearch.eval.metrics import extract_answer
from simsearch.generation.hf import HFEngine
from simsearch.retrieval.base import SearchEngine
from simsearch.tinyworld.traces import tiny_call
from simsearch.tinyworld.values import RELATION_KINDS, value_kind, value_spans
from simsearch.tinyworld.world import TWO_HOP, World
from simsearch.types import Document, QAExample, SamplingParams, SearchRequest

QUERY_NAMING: tuple[str, ...] = ("exact", "miscopied", "unnamed")
"""How a query names the person its question asks about (`query_naming`)."""


def query_naming(query: str, name: str) -> str:
    """How `query` names the person `name`, one of `QUERY_NAMING`.

    `exact`: the name is one of the query's words. `miscopied`: it is not, but a word starting
    with the name's first three letters is (the first syllable copied, the rest not: `Konis`
    searched as `Konbe`). `unnamed`: neither (question words only). A miscopied query finds
    nobody; RL has to learn to name the person, and a policy that cannot copy names cannot.
    """
    words = re.findall(r"[A-Za-z]+", query)
    if name in words:
        return "exact"
    return "miscopied" if any(word.startswith(name[:3]) for word in words) else "unnamed"


def reading_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    world: World,
    engine: SearchEngine,
    examples: Sequence[QAExample],
    *,
    top_k: int,
    template: TemplateName,
    rendering: RenderStyle,
    batch_size: int = 64,
    protocol: str = "tags",
) -> dict[str, dict[str, float]]:
    """How well a base model reads results, per relation: what RL has to start from.

    Each one-hop question is searched with its entity's name (the query RL should learn), and the
    model continues greedily after the results block, as in a rollout's answer turn. Two-hop
    questions are left out: one search for the entity does not find their answer. Per relation,
    the shares of questions whose answer is (`score_reading`)

    - `copied`: a value of the asked kind found in the results, written whole (a year, a city);
    - `invented`: a value of the asked kind found nowhere in the results (digits or name
      pieces mixed up while copying);
    - `right`: the gold answer.

    Args:
        model: The policy (any causal LM, greedy decoding).
        tokenizer: Its tokenizer.
        world: The tiny world the examples come from.
        engine: The search engine (BM25 in the quickstart).
        examples: Questions of `world` (held-out ones measure the skill, not memory).
        top_k: Documents per search, as in RL.
        template: The policy prompt template, as in RL.
        rendering: How results are shown, as in RL.
        batch_size: Prompts per generation batch.
        protocol: "tags", or "tool-call": the search a Hermes call, the results a tool message.

    Returns:
        {relation: {"copied", "invented", "right", "questions"}} plus the same under "all".
    """
    examples = [example for example in examples if world.facts[example.id].relation != TWO_HOP]
    names = [world.facts[example.id].entity for example in examples]
    documents = engine.search([SearchRequest(query=name, top_k=top_k) for name in names])
    if protocol == "tool-call":
        contexts = [_tool_call_context(tokenizer, e.question, name, docs, template, rendering)
                    for e, name, docs in zip(examples, names, documents)]  # fmt: skip
    else:
        prompt_ids = tokenizer([render_prompt(e.question, template=template) for e in examples])["input_ids"]
        # The turns carry no BOS/EOS, as in the rollout.
        searches = [f"<search> {name} </search>" for name in names]
        search_ids = tokenizer(searches, add_special_tokens=False)["input_ids"]
        observations = [wrap_information(render_documents(docs, rendering)) for docs in documents]
        observation_ids = tokenizer(observations, add_special_tokens=False)["input_ids"]
        contexts = [p + s + o for p, s, o in zip(prompt_ids, search_ids, observation_ids)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop=["</answer>"])
    completions = HFEngine(model, tokenizer, batch_size=batch_size, prefix_cache=False).generate(contexts, params)
    return score_reading(world, examples, documents, [completion.text for completion in completions])


def _tool_call_context(
    tokenizer: PreTrainedTokenizerBase, question: str, name: str, documents: list[Document], template: TemplateName,
    rendering: RenderStyle,
) -> list[int]:  # fmt: skip
    """The tool-call rollout's context after one search of `name` and its results."""
    conversation = ToolConversation(tokenizer, [search_tool_schema()], tool_call_messages(question, template))
    call = tiny_call(name)
    prompt, generated = conversation.text, call + tokenizer.eos_token
    added = conversation.add_turn(generated, call, [render_documents(documents, rendering)])
    return [i for text in (prompt, generated, added) for i in tokenizer.encode(text, add_special_tokens=False)]


def score_reading(
    world: World, examples: Sequence[QAExample], documents: Sequence[list[Document]], completions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """`reading_accuracy`'s shares, from each one-hop question's results and the answer turn written after them."""
    counts: dict[str, dict[str, float]] = {}
    cities = world.cities
    for example, docs, completion in zip(examples, documents, completions, strict=True):
        relation = world.facts[example.id].relation
        kind = RELATION_KINDS[relation]
        found = {v for doc in docs for v in value_spans(doc.text, cities) if value_kind(v, cities) == kind}
        answer = (extract_answer(completion) or "").strip()
        is_kind = bool(answer) and value_spans(answer, cities) == [answer] and value_kind(answer, cities) == kind
        for key in (relation, "all"):
            row = counts.setdefault(key, dict.fromkeys(("copied", "invented", "right", "questions"), 0.0))
            row["copied"] += is_kind and answer in found
            row["invented"] += is_kind and answer not in found
            row["right"] += answer in example.golden_answers
            row["questions"] += 1
    for row in counts.values():
        for key in ("copied", "invented", "right"):
            row[key] /= row["questions"]
    return counts
