"""Fuzzing at scale: generated bad input ends in a value or a clear user error, never a traceback or a 5xx.

    python -m benchmarks.fuzz                 # >= 10,000 cases (docs/reliability.md)
    python -m benchmarks.fuzz --tiny          # a few hundred cases in seconds (the test suite's)

The generators are those of `tests/reliability/test_fuzz.py` (hypothesis strategies, seeded),
drawn first and then run outside hypothesis, so a failing case is counted rather than shrunk:

- `tags`: tag parsing, answer extraction and the format reward on tagged text;
- `tool_calls`: the hermes and llama3 tool-call parsers on call soups (`policy.toolcalls.parse_turn`);
- `recipes`: recipe YAML (or bytes that are not UTF-8) and command-line overrides, every schema;
- `qa_jsonl`, `qa_parquet`: QA files in JSONL, and in Parquet (the rows as pyarrow takes them,
  else as text; or bytes that are not Parquet at all);
- `corpus`: corpus lines (`parse_passage`) and whole corpus files (`load_passages`);
- `retrieve`: `POST /retrieve` bodies and content types against a BM25 server on 127.0.0.1
  (one request at a time, 10 s each at most);
- `tokenizer`: questions, observations and self-search masks of tagged and awkward text under
  two tiny byte-level tokenizers (tags as single tokens, and spelled in pieces).

A case ends in a value, in a user error (`RecipeError`, `DataError`: the CLI prints their
message without a traceback), or in any other exception: a raw traceback. A `/retrieve` answer
with status >= 500, or no answer, counts in `server_5xx`; one that is not JSON in `tracebacks`.
Each target stops drawing after `--max-s` seconds. The table on stdout; as the last line one
JSON object: `cases`, `tracebacks`, `server_5xx`, `per_target`, `examples` (the first few
failures, each with its target and exception), `command`, `provenance`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from benchmarks.benchlib import provenance
from simsearch.config import load_recipe
from simsearch.data.corpus import load_passages, parse_passage
from simsearch.data.qa import load_qa
from simsearch.data.templates import SEARCH_R1_TEMPLATE, SELF_SEARCH_TEMPLATE, encode_prompt
from simsearch.errors import DataError, RecipeError
from simsearch.eval.metrics import extract_answer
from simsearch.models import EOS_TOKEN, PAD_TOKEN, train_tokenizer
from simsearch.policy.protocol import TokenCache
from simsearch.policy.rewards import format_score
from simsearch.policy.selfsearch import self_search_mask
from simsearch.policy.tags import TagProtocol, extract_queries, information_spans, observation_ids, parse_action
from simsearch.policy.toolcalls import TOOL_CALL_FORMATS, parse_turn
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.retrieval.server import create_app
from simsearch.types import Passage
from tests.reliability import test_fuzz as gen
from tests.servers import serve_in_thread

FULL = {"tags": 2000, "tool_calls": 1000, "recipes": 1500, "qa_jsonl": 1500, "qa_parquet": 1000, "corpus": 1500,
        "retrieve": 1500, "tokenizer": 1000}  # fmt: skip
TINY = {name: 40 for name in FULL}
EXAMPLES_KEPT = 5


@dataclass
class Tally:
    """What the cases of one target ended in."""

    cases: int = 0
    values: int = 0
    user_errors: int = 0
    tracebacks: int = 0
    server_5xx: int = 0
    examples: list[str] = field(default_factory=list)


class Server5xx(Exception):
    """A `/retrieve` answer with status >= 500, or none."""


class Refused(Exception):
    """A `/retrieve` answer with a 4xx status: the server's user error."""


USER_ERRORS = (RecipeError, DataError, Refused)


# --------------------------------------------------------------------------- drawing


def draw(strategy: st.SearchStrategy, count: int, start_seed: int) -> list[Any]:
    """`count` examples of `strategy`, reproducible from `start_seed` (more seeds while hypothesis stops short)."""
    cases: list[Any] = []
    for offset in range(5):

        @seed(start_seed + offset)
        @settings(max_examples=count - len(cases), database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(strategy)
        def collect(case: Any) -> None:
            cases.append(case)

        collect()
        if len(cases) >= count:
            break
    return cases[:count]


# --------------------------------------------------------------------------- targets


def run_tags(text: str) -> None:
    parse_action(text), extract_queries(text), information_spans(text), extract_answer(text), format_score(text)


def run_tool_calls(case: tuple[str, bool]) -> None:
    text, allow_top_k = case
    for tool_format in TOOL_CALL_FORMATS:
        parse_turn(text, tool_format, allow_top_k=allow_top_k)


def recipe_cases() -> st.SearchStrategy:
    return st.sampled_from(gen.SCHEMAS).flatmap(
        lambda schema: st.tuples(
            st.just(schema), st.one_of(st.none(), gen.yaml_documents(schema)), gen.overrides_for(schema), st.booleans()
        )
    )


def run_recipe(workdir: Path, case: tuple) -> None:
    schema, document, overrides, raw_bytes = case
    path = None
    if document is not None:
        path = workdir / "recipe.yaml"
        path.write_bytes(document.encode("utf-8", "surrogatepass") + (b"\xff\xfe" if raw_bytes else b""))
    load_recipe(schema, path, overrides)


def qa_jsonl_cases() -> st.SearchStrategy:
    special = st.sampled_from([gen.LONE_SURROGATE, gen.HUGE_INTEGER, gen.DEEP_NESTING, gen.RAW_LINE_SEPARATOR])
    return st.lists(st.one_of(gen.jsonl_lines, special), min_size=1, max_size=4)


def run_qa_jsonl(workdir: Path, lines: list[str]) -> None:
    path = workdir / "qa.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
    load_qa(path)


def qa_parquet_cases() -> st.SearchStrategy:
    return st.one_of(st.lists(gen.plausible_rows, min_size=1, max_size=4), st.binary(max_size=200))


def run_qa_parquet(workdir: Path, case: list[dict] | bytes) -> None:
    path = workdir / "qa.parquet"
    if isinstance(case, bytes):
        path.write_bytes(case)
    else:
        frame = pd.DataFrame(case)
        try:
            frame.to_parquet(path)
        except Exception:  # mixed types per column (or lone surrogates): the rows as text instead
            text = frame.map(lambda v: json.dumps(v, ensure_ascii=True))
            text.to_parquet(path)
    load_qa(path)


def corpus_cases() -> st.SearchStrategy:
    return st.lists(st.one_of(gen.jsonl_lines, st.sampled_from([gen.LONE_SURROGATE, gen.HUGE_INTEGER])), min_size=1,
                    max_size=4)  # fmt: skip


def run_corpus(workdir: Path, lines: list[str]) -> None:
    for number, line in enumerate(lines, 1):
        with suppress(DataError):  # a refused line; the file below is still read as a whole
            parse_passage(line.encode("utf-8", "surrogatepass"), path="corpus.jsonl", line_no=number)
    path = workdir / "corpus.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
    load_passages(path)


def retrieve_cases() -> st.SearchStrategy:
    return st.tuples(gen.retrieve_bodies, st.sampled_from(["application/json", "text/plain", ""]))


def run_retrieve(client: httpx.Client, url: str, case: tuple[bytes, str]) -> None:
    body, content_type = case
    try:
        response = client.post(f"{url}/retrieve", content=body, headers={"content-type": content_type})
    except httpx.HTTPError as err:
        raise Server5xx(f"no answer: {err!r}") from err
    if response.status_code >= 500:
        raise Server5xx(f"status {response.status_code}: {response.text[:200]}")
    payload = response.json()  # not JSON: a raw traceback counted as such
    if 400 <= response.status_code < 500:
        raise Refused(payload["error"])


def tokenizer_cases() -> st.SearchStrategy:
    budgets = st.integers(min_value=24, max_value=96)  # observation budgets that hold the tags (a setting, not input)
    return st.tuples(st.one_of(gen.tagged_text, gen.any_text), st.booleans(), budgets)


def run_tokenizer(tokenizers: list[Any], case: tuple[str, bool, int]) -> None:
    text, plain, max_obs = case
    tokenizer = tokenizers[plain]
    for template in ("search-r1", "self-search"):
        encode_prompt(text, template=template, tokenizer=tokenizer)
    cache = TokenCache(tokenizer, max_obs)
    self_search_mask(cache, cache.encode(text), TagProtocol.own_results)
    observation_ids(cache, [text])


@contextmanager
def retrieve_server() -> Iterator[tuple[httpx.Client, str]]:
    """A BM25 `/retrieve` server on 127.0.0.1 over 6 passages, and a client with a 10 s timeout."""
    passages = [Passage(str(i), f"Title {i}", f"alpha beta gamma word{i} {'delta ' * i}") for i in range(6)]
    engine = BM25SearchEngine.build(passages, show_progress=False)
    app = create_app(engine, max_body_bytes=20_000, max_queries_per_request=8)
    with serve_in_thread(app) as url, httpx.Client(timeout=10) as client:
        yield client, url


def tiny_tokenizers() -> list[Any]:
    """[tags as single tokens, tags spelled in pieces]: two byte-level BPE tokenizers trained in-process."""
    texts = [SEARCH_R1_TEMPLATE.format(question="who?"), SELF_SEARCH_TEMPLATE.format(question="who?")] * 5
    return [train_tokenizer(texts, vocab_size=300), train_tokenizer(texts, vocab_size=300,
                                                                   special_tokens=(PAD_TOKEN, EOS_TOKEN))]  # fmt: skip


# --------------------------------------------------------------------------- running


def run_cases(cases: list[Any], check: Callable[[Any], None], max_s: float) -> Tally:
    """Runs `check` on each case until `max_s` seconds have passed; tallies how each ended."""
    tally, began = Tally(), time.perf_counter()
    for case in cases:
        if time.perf_counter() - began > max_s:
            break
        tally.cases += 1
        try:
            check(case)
        except USER_ERRORS:
            tally.user_errors += 1
        except Server5xx as err:
            tally.server_5xx += 1
            _keep(tally, f"{err}  <- {case!r:.200}")
        except Exception as err:  # a raw traceback: what this benchmark counts
            tally.tracebacks += 1
            last = traceback.extract_tb(err.__traceback__)[-1]
            _keep(tally, f"{type(err).__name__}: {err!s:.200} at {last.filename}:{last.lineno}  <- {case!r:.200}")
        else:
            tally.values += 1
    return tally


def _keep(tally: Tally, example: str) -> None:
    if len(tally.examples) < EXAMPLES_KEPT:
        tally.examples.append(example)


def run_targets(counts: dict[str, int], start_seed: int, max_s: float, workdir: Path) -> dict[str, Tally]:
    """Every target's cases drawn and run, in `FULL`'s order."""
    tokenizers = tiny_tokenizers()
    with retrieve_server() as (client, url):
        targets: dict[str, tuple[st.SearchStrategy, Callable[[Any], None]]] = {
            "tags": (gen.tagged_text, run_tags),
            "tool_calls": (st.tuples(gen.tool_call_text, st.booleans()), run_tool_calls),
            "recipes": (recipe_cases(), lambda case: run_recipe(workdir, case)),
            "qa_jsonl": (qa_jsonl_cases(), lambda case: run_qa_jsonl(workdir, case)),
            "qa_parquet": (qa_parquet_cases(), lambda case: run_qa_parquet(workdir, case)),
            "corpus": (corpus_cases(), lambda case: run_corpus(workdir, case)),
            "retrieve": (retrieve_cases(), lambda case: run_retrieve(client, url, case)),
            "tokenizer": (tokenizer_cases(), lambda case: run_tokenizer(tokenizers, case)),
        }
        tallies = {}
        for name, (strategy, check) in targets.items():
            tallies[name] = run_cases(draw(strategy, counts[name], start_seed), check, max_s)
            print(f"{name:11s} {tallies[name].cases:6d} cases", file=sys.stderr, flush=True)
    return tallies


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = _parse(argv)
    counts = TINY if args.tiny else {name: -(-n * args.cases // sum(FULL.values())) for name, n in FULL.items()}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz_") as tmp:
        tallies = run_targets(counts, args.seed, args.max_s, Path(tmp))
    print(f"{'target':11s} {'cases':>6s} {'values':>6s} {'user errors':>11s} {'tracebacks':>10s} {'server 5xx':>10s}")
    for name, t in tallies.items():
        print(f"{name:11s} {t.cases:6d} {t.values:6d} {t.user_errors:11d} {t.tracebacks:10d} {t.server_5xx:10d}")
    examples = [f"{name}: {example}" for name, t in tallies.items() for example in t.examples]
    for example in examples:
        print("  " + example)
    figures = {
        "cases": sum(t.cases for t in tallies.values()), "tracebacks": sum(t.tracebacks for t in tallies.values()),
        "server_5xx": sum(t.server_5xx for t in tallies.values()), "wall_s": round(time.perf_counter() - began, 1),
        "per_target": {name: t.cases for name, t in tallies.items()}, "examples": examples,
        "command": "python -m benchmarks.fuzz" + (" --tiny" if args.tiny else f" --cases {args.cases}"),
        "provenance": provenance(),
    }  # fmt: skip
    print(json.dumps(figures))
    return figures


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000, help="cases over all targets (default 10,000)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the generators")
    parser.add_argument("--max-s", type=float, default=600.0, help="seconds each target may run at most")
    parser.add_argument("--tiny", action="store_true", help="40 cases a target (the test suite's)")
    args = parser.parse_args(argv)
    if args.cases < 1 or args.max_s <= 0:
        parser.error("--cases must be >= 1 and --max-s > 0")
    return args


if __name__ == "__main__":
    main()
