"""The simulated search engine: an LLM prompted (or fine-tuned) to write search results.

`SimulatedSearchEngine` implements `SearchEngine` over any `GenerationEngine`, one `generate`
call per `search` batch. Each request says how many of its `top_k` documents must be noisy
(`SearchRequest.num_noisy`); a mixed request generates a useful and a noisy set and takes the
`noisy_positions` from the noisy one. Under `noisy_answers="redact"` no noisy document shows a
gold answer (`redact_answers`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from simsearch.eval.metrics import has_gold_answer, normalize_answer, substring_exact_match
from simsearch.generation.base import GenerationEngine
from simsearch.simulator.prompts import (
    PRESETS,
    Preset,
    PromptTemplates,
    as_chat,
    check_templates,
    render,
)
from simsearch.types import Completion, Document, SamplingParams, SearchRequest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PAD_TEXT = "(no result)"
"""Text of the documents that pad a short answer to `top_k`."""
TITLE_WORDS = 6
"""Words of an untitled one-line block used as its title."""
SOURCE = "simulator"
REDACTED = "___"
"""What stands in a noisy document for a gold answer it wrote, under `noisy_answers="redact"`."""
ParseMethod = Literal["numbered", "paragraphs", "lines", "empty"]
NoisyAnswers = Literal["keep", "redact"]
NOISY_ANSWERS: tuple[str, ...] = get_args(NoisyAnswers)
"""What becomes of a gold answer a noisy document holds: kept (ZeroSearch), or redacted."""

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
    """Parses a simulator output into exactly `top_k` (>= 1) documents (source "simulator"); never raises.

    Numbered `Doc i` blocks, else paragraphs or lines; extra blocks are trimmed, missing ones padded
    with `PAD_TEXT` documents. The `ParseResult` says which happened.
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
    """Drops everything from the first `Doc {top_k+1}` line marker on."""
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
    """ZeroSearch's post-processing, byte for byte: `"\\n\\n"` becomes `"\\n"`, then a plain cut at `Doc {top_k+1}`."""
    return text.replace("\n\n", "\n").split(f"Doc {top_k + 1}")[0]


def split_verbatim(text: str, top_k: int) -> list[Document]:
    """`zerosearch_postprocess(text, top_k)` as `top_k` documents (title "") whose texts concatenate to it.

    Cuts fall at lines opening `Doc 2` ... `Doc {top_k}`; missing pieces are empty.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    kept = zerosearch_postprocess(text, top_k)
    cuts = [m.start() for m in _DOC_MARKER.finditer(kept)][1:top_k]
    bounds = [0, *cuts, len(kept)]
    pieces = [kept[a:b] for a, b in itertools.pairwise(bounds)]
    pieces += [""] * (top_k - len(pieces))
    return [Document(title="", text=piece, source=SOURCE) for piece in pieces]


def redact_answers(text: str, golden_answers: list[str]) -> str:
    """`text` with every gold answer it holds (normalized containment, as the rule reward matches)
    replaced by `REDACTED`; `PAD_TEXT` when a spelling the replacement misses would still show one.
    """
    for gold in golden_answers:
        words = normalize_answer(gold).split()
        if not words:
            continue
        # The answer's letters, punctuation allowed between them and any run of spaces, punctuation
        # or articles between its words: the spellings normalization maps onto it.
        glue = r"(?:[^\w\s]|_)*"
        gap = r"(?:[\W_]+(?:(?:a|an|the)[\W_]+)*)"
        word_patterns = [glue.join(re.escape(char) for char in word) for word in words]
        text = re.sub(gap.join(word_patterns), REDACTED, text, flags=re.IGNORECASE)
    return PAD_TEXT if substring_exact_match(text, golden_answers) else text


def noisy_positions(query: str, top_k: int, num_noisy: int) -> list[int]:
    """The ascending 0-based positions that take noisy documents; seeded by the query's SHA-256."""
    if not 0 <= num_noisy <= top_k:
        raise ValueError(f"num_noisy={num_noisy} must lie in [0, top_k={top_k}]")
    seed = int.from_bytes(hashlib.sha256(query.encode("utf-8")).digest()[:8], "big")
    return sorted(random.Random(seed).sample(range(top_k), num_noisy))


class SimulatedSearchEngine:
    """A `SearchEngine` whose documents an LLM writes.

    Args:
        preset: Prompt preset, see `simsearch.simulator.prompts`.
        chat: Apply `tokenizer`'s chat template; without a tokenizer the generator must be a chat
            endpoint.
        seed: Base seed; call c is sampled with seed + c. None: fresh randomness.
        model_name: The simulator model (path or served name); part of `fingerprint`.
        show_question: Show the request's question in the prompt (the zerosearch presets need it).
        show_answer: Show the gold answers in the prompt (the zerosearch presets need them).
        verbatim: Return `split_verbatim` pieces, for the "zerosearch-simulator" rendering.
        noisy_answers: "redact": every gold answer in a noisy document's title and text becomes
            `REDACTED` (`redact_answers`), so noise never shows the answer; requests asking for noisy
            documents must carry their gold answers. "keep": as written (ZeroSearch).
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
        noisy_answers: NoisyAnswers = "keep",
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
        if noisy_answers not in NOISY_ANSWERS:
            raise ValueError(f"noisy_answers={noisy_answers!r} is not one of {', '.join(NOISY_ANSWERS)}")
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
        self.noisy_answers = noisy_answers
        self.stats: Counter[str] = Counter()
        """Cumulative counts: `simulator/sets` parsed, `simulator/valid`, `/padded`, `/trimmed`,
        `/unparsed`, `simulator/calls` (generate calls), and under "redact" `simulator/noisy_docs`
        returned and `/noisy_redacted` of them that held an answer."""

    def fingerprint(self) -> str:
        """A stable string naming everything but the request that shapes this engine's answers (for cache keys)."""
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
                # Only when set, so the caches of engines built before the choice keep their keys.
                **({"noisy_answers": self.noisy_answers} if self.noisy_answers != "keep" else {}),
            },
            sort_keys=True,
        )

    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        """Writes `top_k` documents for each request, with one generate call for the batch.

        Raises:
            ValueError: top_k < 1, num_noisy outside [0, top_k], a prompt the preset cannot render, or
                under "redact" noisy documents asked for without gold answers; naming the request.
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
            if self.noisy_answers == "redact" and request.num_noisy and not has_gold_answer(request.golden_answers):
                raise ValueError(
                    f"request {i} (query {request.query!r}) asks for noisy documents without gold answers: "
                    "noisy_answers=redact needs them to take the answer out (or set noisy_answers=keep)"
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
        return [self._documents(request, slot, completions) for request, slot in zip(requests, slots)]

    def _documents(
        self, request: SearchRequest, slot: tuple[int | None, int | None], completions: list[Completion]
    ) -> list[Document]:
        """One request's documents from its useful and noisy completions (`slot`: their indexes)."""
        sets = {
            kind: self._parse(completions[idx].text, request.top_k)
            for kind, idx in zip(("useful", "noisy"), slot)
            if idx is not None
        }
        for doc in sets.get("noisy", []):
            doc.noisy = True  # so trajectories and the viewer can mark what was made noisy
        if len(sets) == 1:
            chosen = next(iter(sets.values()))
        else:
            noisy_at = set(noisy_positions(request.query, request.top_k, request.num_noisy))
            chosen = [sets["noisy" if p in noisy_at else "useful"][p] for p in range(request.top_k)]
        if self.noisy_answers == "redact":
            self._redact([doc for doc in chosen if doc.noisy], request.golden_answers)
        return chosen

    def _redact(self, documents: list[Document], golden_answers: list[str]) -> None:
        for doc in documents:
            title, text = redact_answers(doc.title, golden_answers), redact_answers(doc.text, golden_answers)
            self.stats["simulator/noisy_docs"] += 1
            self.stats["simulator/noisy_redacted"] += int((title, text) != (doc.title, doc.text))
            doc.title, doc.text = title, text

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
