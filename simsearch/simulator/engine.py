"""The simulated search engine: an LLM prompted (or fine-tuned) to write search results.

`SimulatedSearchEngine` implements `SearchEngine` over any `GenerationEngine` (transformers
in-process, or an OpenAI-compatible server hosting the simulator), so the policy's rollout
cannot tell it from a real retriever. Each request says how many of its `top_k` documents must
be noisy (`SearchRequest.num_noisy`, decided by the curriculum); all prompts of a `search` batch
go to the generator in ONE `generate` call.

`parse_documents` turns whatever the simulator wrote into exactly `top_k` documents and never
raises. Rules, in order:

1. ZeroSearch's post-processing: blank lines collapsed, text cut at the first `Doc {top_k+1}`
   (not followed by another digit, so `Doc 40` does not cut a `top_k=3` answer).
2. Numbered blocks: a line starting with `Doc i` (optionally `Document i`, `**Doc i**`, list
   bullets, `:`/`.`/`)` after the number) opens a block that runs to the next such line.
3. Otherwise paragraphs (blank-line separated in the raw output) when there are at least
   `top_k` of them, else non-empty lines.
4. More than `top_k` blocks: the first `top_k` are kept (`trimmed`). Fewer: padded with empty
   documents whose text is `PAD_TEXT` (`padded`); no text at all is `unparsed` (and padded).

Padding uses an explicit empty document, not a repeat of a parsed one: repeating would add
information the simulator never wrote (a repeated answer-bearing document makes a set look
more useful than it was) and would hide format failures from fidelity measurements, whereas an
empty document is what a retriever with too few hits would show, and keeps the number of
documents the policy sees fixed at `top_k`.

Titles: a leading `(Title: ...)` (balanced parentheses) gives the title; otherwise a block of
several lines takes its first line as the title; otherwise the first `TITLE_WORDS` words serve
as the title and the text is the whole block (nothing the simulator wrote is dropped).

Mixing (0 < num_noisy < top_k, our extension: ZeroSearch flips one coin per call): the engine
asks for a useful set and a noisy set of `top_k` documents each, in the same generate call, and
position i of the answer takes the noisy set's document i when i is one of `num_noisy`
positions drawn by `noisy_positions` from a generator seeded by a SHA-256 of the query: the same
query and count always mix the same way (so caching and reruns agree), while the noisy
positions differ across queries (the policy cannot learn "ignore the last document").

Verbatim documents (`verbatim=True`, for the **compat** "zerosearch-simulator" rendering): what
ZeroSearch inserted into the policy's context is the simulator's text itself after its own
post-processing (`zerosearch_postprocess`), not documents re-rendered from a parse. In verbatim
mode the engine cuts that text into `top_k` consecutive pieces at the `Doc i` markers
(`split_verbatim`), so the pieces concatenated are exactly that text, and the rendering
concatenates them. The pieces carry no title; the first holds any text before `Doc 2`, the last
any text after `Doc {top_k}`, and pieces missing from a short answer are empty.

`show_question=False` and `show_answer=False` (ours, for the simsearch, simsearch-brief and
custom presets) keep the request's question or gold answer out of the prompt. Without the
question, the simulator learns which entity a search is about from the query alone, so a query
that does not name the entity cannot be answered from the question line. Without the answer, it
can only write what it learned of the world in fine-tuning, as a real engine can only return
what it indexed: told the answer, a simulator can return it whatever the query, and RL against
it need not learn to search. ZeroSearch always shows both.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from simsearch.generation.base import GenerationEngine
from simsearch.simulator.prompts import (
    PRESETS,
    Preset,
    PromptTemplates,
    as_chat,
    check_templates,
    render,
)
from simsearch.types import Document, SamplingParams, SearchRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAD_TEXT = "(no result)"
"""Text of the documents that pad a short answer to `top_k`."""
TITLE_WORDS = 6
"""Words of an untitled one-line block used as its title."""
SOURCE = "simulator"

ParseMethod = Literal["numbered", "paragraphs", "lines", "empty"]

_BLANK_RUNS = re.compile(r"\n\s*\n")
# A line opening a numbered document: optional bullets/markdown, "Doc" or "Document", a number.
_DOC_MARKER = re.compile(
    r"^[ \t>*#\-]*Doc(?:ument)?[ \t]*(\d+)[ \t]*(?:\*\*)?[ \t]*[:.)\-]?(?:\*\*)?", re.MULTILINE | re.IGNORECASE
)
_TITLE_OPEN = re.compile(r"^\(\s*Title:\s*", re.IGNORECASE)


@dataclass
class ParseResult:
    """Documents parsed from one simulator output, and how."""

    documents: list[Document]  # exactly top_k
    method: ParseMethod
    found: int  # blocks found before padding or trimming
    padded: int  # empty documents appended
    trimmed: int  # blocks dropped beyond top_k

    @property
    def valid(self) -> bool:
        """Numbered blocks, exactly top_k of them after the `Doc {top_k+1}` cut."""
        return self.method == "numbered" and self.padded == 0 and self.trimmed == 0


def parse_documents(text: str, top_k: int) -> ParseResult:
    """Parses a simulator output into exactly `top_k` documents (rules in the module docstring).

    Never raises on any text; `top_k` must be >= 1.

    Args:
        text: What the simulator generated.
        top_k: Documents wanted.

    Returns:
        The documents (source "simulator") and how they were obtained.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    raw = _cut(text.replace("\r\n", "\n").replace("\r", "\n"), top_k)
    collapsed = _BLANK_RUNS.sub("\n", raw).strip()
    method: ParseMethod
    markers = list(_DOC_MARKER.finditer(collapsed))
    if markers:
        method = "numbered"
        ends = [m.start() for m in markers[1:]] + [len(collapsed)]
        blocks = [collapsed[m.end() : end].strip() for m, end in zip(markers, ends)]
        blocks = [b for b in blocks if b]
    else:
        paragraphs = [p.strip() for p in _BLANK_RUNS.split(raw) if p.strip()]
        if len(paragraphs) >= top_k:
            method, blocks = "paragraphs", paragraphs
        else:
            method, blocks = "lines", [line.strip() for line in collapsed.split("\n") if line.strip()]
    if not blocks:
        method = "empty"
    found = len(blocks)
    documents = [_document(b) for b in blocks[:top_k]]
    padded = top_k - len(documents)
    documents += [Document(title="", text=PAD_TEXT, source=SOURCE) for _ in range(padded)]
    return ParseResult(documents, method, found, padded, max(0, found - top_k))


def _cut(text: str, top_k: int) -> str:
    """ZeroSearch's cut: drop everything from the first `Doc {top_k+1}` on."""
    match = re.search(rf"Doc {top_k + 1}(?!\d)", text)
    return text[: match.start()] if match else text


def _document(block: str) -> Document:
    opened = _TITLE_OPEN.match(block)
    if opened:
        depth, i = 1, opened.end()
        while i < len(block) and depth:
            depth += {"(": 1, ")": -1}.get(block[i], 0)
            i += 1
        if depth == 0:
            title = block[opened.end() : i - 1].strip()
            return Document(title=title, text=" ".join(block[i:].split()), source=SOURCE)
    first, _, rest = block.partition("\n")
    if rest.strip():
        return Document(title=first.strip(), text=" ".join(rest.split()), source=SOURCE)
    words = block.split()
    return Document(title=" ".join(words[:TITLE_WORDS]), text=" ".join(words), source=SOURCE)


def zerosearch_postprocess(text: str, top_k: int) -> str:
    """ZeroSearch's post-processing of a simulator answer, byte for byte (**compat**).

    ZeroSearch `llm_agent/generation.py:91` and `:137`: one left-to-right pass replaces each
    `"\\n\\n"` by `"\\n"` (so three newlines become two), then everything from the first
    `Doc {top_k+1}` on is dropped, as a plain substring (so `Doc 6` also cuts at `Doc 60` or in
    mid-sentence with top_k=5). `parse_documents` cuts more carefully; this is the text as
    ZeroSearch policies read it.
    """
    return text.replace("\n\n", "\n").split(f"Doc {top_k + 1}")[0]


def split_verbatim(text: str, top_k: int) -> list[Document]:
    """ZeroSearch's post-processed text as `top_k` documents whose texts concatenate to it.

    Cuts fall where lines opening `Doc 2` ... `Doc {top_k}` markers start (the `_DOC_MARKER`
    lines of `parse_documents`, in order); text before the second marker stays with the first
    piece, and everything from the last cut on stays with the last. Missing pieces are empty.

    Args:
        text: What the simulator generated.
        top_k: Documents wanted (>= 1).

    Returns:
        Exactly `top_k` documents, title "", source "simulator", whose texts joined with "" equal
        `zerosearch_postprocess(text, top_k)`.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    kept = zerosearch_postprocess(text, top_k)
    cuts = [m.start() for m in _DOC_MARKER.finditer(kept)][1:top_k]
    bounds = [0, *cuts, len(kept)]
    pieces = [kept[a:b] for a, b in itertools.pairwise(bounds)]
    pieces += [""] * (top_k - len(pieces))
    return [Document(title="", text=piece, source=SOURCE) for piece in pieces]


def noisy_positions(query: str, top_k: int, num_noisy: int) -> list[int]:
    """The positions (0-based, ascending) that take noisy documents in a mixed answer.

    Deterministic in (query, top_k, num_noisy): a `random.Random` seeded with the SHA-256 of
    the query samples `num_noisy` of the `top_k` positions.
    """
    if not 0 <= num_noisy <= top_k:
        raise ValueError(f"num_noisy={num_noisy} must lie in [0, top_k={top_k}]")
    seed = int.from_bytes(hashlib.sha256(query.encode("utf-8")).digest()[:8], "big")
    return sorted(random.Random(seed).sample(range(top_k), num_noisy))


class SimulatedSearchEngine:
    """A `SearchEngine` whose documents an LLM writes.

    Args:
        generator: Any `GenerationEngine` (HFEngine, the OpenAI-compatible client, ...).
        preset: Prompt preset, see `simsearch.simulator.prompts`.
        tokenizer: The simulator's tokenizer; with `chat=True` prompts go through its chat template
            here and reach the generator as token ids.
        temperature: Sampling temperature (ZeroSearch: 0.8).
        max_new_tokens: Generation budget per prompt (ZeroSearch: 600).
        chat: Send prompts as chat conversations. With a tokenizer, the template is applied here;
            without one the generator receives the plain prompt and must be a chat endpoint
            (the OpenAI-compatible engine with chat=True) that wraps it as the user message.
        templates: The custom preset's templates.
        top_p: Nucleus sampling mass.
        seed: Base seed; call c is sampled with seed + c, so a run is reproducible. None: fresh.
        model_name: What the simulator model is (path or served name); part of `fingerprint`.
        show_question: Show the request's question in the prompt; False keeps it out (module
            docstring). The zerosearch presets need it.
        show_answer: Show the request's gold answers in the prompt; False keeps them out
            (module docstring). The zerosearch presets need them.
        verbatim: Return `split_verbatim` pieces instead of parsed documents, for the
            "zerosearch-simulator" rendering (module docstring).
    """

    def __init__(
        self,
        generator: GenerationEngine,
        *,
        preset: Preset,
        tokenizer: PreTrainedTokenizerBase | None = None,
        temperature: float = 0.8,
        max_new_tokens: int = 600,
        chat: bool = False,
        templates: PromptTemplates | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        model_name: str = "",
        show_question: bool = True,
        show_answer: bool = True,
        verbatim: bool = False,
    ) -> None:
        if preset not in PRESETS:
            raise ValueError(f"preset={preset!r} is not one of {', '.join(PRESETS)}")
        for name, shown in (("show_question", show_question), ("show_answer", show_answer)):
            if not shown and PRESETS[preset].always_shows_context:
                raise ValueError(
                    f"{name}=False: preset={preset!r} always shows the question and the answer; use simsearch or custom"
                )
        if templates is not None:
            check_templates(templates)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
        self.generator = generator
        self.preset = preset
        self.tokenizer = tokenizer
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.chat = chat
        self.templates = templates
        self.top_p = top_p
        self.seed = seed
        self.model_name = model_name
        self.show_question = show_question
        self.show_answer = show_answer
        self.verbatim = verbatim
        self.stats: Counter[str] = Counter()
        """Cumulative parse counts: `simulator/sets` parsed, `simulator/valid`, `/padded`,
        `/trimmed`, `/unparsed`, and `simulator/calls` (generate calls)."""

    def fingerprint(self) -> str:
        """A stable string naming everything that shapes this engine's answers (for cache keys).

        Per-request fields (query, top_k, num_noisy, question, answers) are not part of it.
        """
        return json.dumps(
            {
                "engine": "simulator",
                "model": self.model_name,
                "preset": self.preset,
                "templates": [self.templates.useful, self.templates.noisy] if self.templates else None,
                "chat": self.chat,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "max_new_tokens": self.max_new_tokens,
                "seed": self.seed,
                "show_question": self.show_question,
                "show_answer": self.show_answer,
                "verbatim": self.verbatim,
            },
            sort_keys=True,
        )

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Writes `top_k` documents for each request, with one generate call for the batch.

        Args:
            requests: The batch; each request's `num_noisy` in [0, top_k] picks useful (0),
                noisy (top_k) or mixed documents.

        Returns:
            One list of exactly `top_k` documents per request, in order.

        Raises:
            ValueError: A request with top_k < 1 or num_noisy outside [0, top_k], or a prompt the
                preset cannot render (e.g. zerosearch without a question), naming the request.
        """
        if not requests:
            return []
        prompts: list[str] = []
        slots: list[tuple[int | None, int | None]] = []  # per request: (useful idx, noisy idx)
        for i, request in enumerate(requests):
            if request.top_k < 1 or not 0 <= request.num_noisy <= request.top_k:
                raise ValueError(
                    f"request {i} (query {request.query!r}): top_k={request.top_k} must be >= 1 and "
                    f"num_noisy={request.num_noisy} within [0, top_k]"
                )
            useful = noisy = None
            if request.num_noisy < request.top_k:
                useful = len(prompts)
                prompts.append(self._prompt(request, noisy=False))
            if request.num_noisy > 0:
                noisy = len(prompts)
                prompts.append(self._prompt(request, noisy=True))
            slots.append((useful, noisy))

        params = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=None if self.seed is None else self.seed + self.stats["simulator/calls"],
        )
        inputs = self._encode(prompts)
        completions = self.generator.generate(inputs, params)
        self.stats["simulator/calls"] += 1
        if len(completions) != len(prompts):
            raise RuntimeError(
                f"the simulator's generator returned {len(completions)} completions for {len(prompts)} prompts"
            )
        results: list[list[Document]] = []
        for request, (useful, noisy) in zip(requests, slots):
            sets = {
                kind: self._parse(completions[idx].text, request.top_k)
                for kind, idx in (("useful", useful), ("noisy", noisy))
                if idx is not None
            }
            for doc in sets.get("noisy", []):
                doc.noisy = True  # so trajectories and the viewer can mark what was made noisy
            if len(sets) == 1:
                results.append(next(iter(sets.values())))
                continue
            chosen = set(noisy_positions(request.query, request.top_k, request.num_noisy))
            results.append([sets["noisy" if p in chosen else "useful"][p] for p in range(request.top_k)])
        return results

    def _prompt(self, request: SearchRequest, *, noisy: bool) -> str:
        return render(
            self.preset,
            query=request.query,
            question=request.question if self.show_question else None,
            golden_answers=list(request.golden_answers) if self.show_answer else [],
            noisy=noisy,
            top_k=request.top_k,
            templates=self.templates,
        )

    def _encode(self, prompts: list[str]) -> list[str] | list[list[int]]:
        if not (self.chat and self.tokenizer is not None):
            return prompts
        # The chat template already wrote any special tokens (e.g. a BOS); adding them again would
        # double them.
        texts = [as_chat(p, self.tokenizer) for p in prompts]
        return [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def _parse(self, text: str, top_k: int) -> list[Document]:
        result = parse_documents(text, top_k)
        self.stats["simulator/sets"] += 1
        self.stats["simulator/valid"] += int(result.valid)
        self.stats["simulator/padded"] += int(result.padded > 0)
        self.stats["simulator/trimmed"] += int(result.trimmed > 0)
        self.stats["simulator/unparsed"] += int(result.method == "empty")
        # The parse still feeds the format statistics in verbatim mode.
        return split_verbatim(text, top_k) if self.verbatim else result.documents
