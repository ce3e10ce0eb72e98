"""Property tests with arbitrary text, JSON, YAML and bytes: every input ends in a value or a
clear error of the documented kind, never another exception, a 5xx or a hang.

Each property runs a bounded number of examples (`EXAMPLES` below, derandomized so CI sees the
same inputs every run) under a per-example deadline; the file runs in well under a minute.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from simsearch.config import (
    CollectRecipe,
    EvalRecipe,
    FinetuneRecipe,
    QuickstartRecipe,
    ServeRecipe,
    TrainRecipe,
    load_recipe,
)
from simsearch.data.corpus import CorpusFormatError, corpus_fingerprint, load_passages, parse_passage
from simsearch.data.qa import QADataError, load_qa, write_qa_jsonl
from simsearch.errors import DataError, RecipeError
from simsearch.eval.metrics import (
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
    substring_exact_match,
)
from simsearch.policy.rewards import format_score
from simsearch.policy.tags import (
    Action,
    extract_queries,
    information_spans,
    parse_action,
)
from simsearch.policy.toolcalls import TOOL_CALL_FORMATS, parse_turn
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.retrieval.server import create_app
from simsearch.simulator.engine import PAD_TEXT, parse_documents
from simsearch.types import Document, Passage
from tests.servers import serve_in_thread

EXAMPLES = {"fast": 300, "medium": 150, "slow": 40}


def fuzz(kind: str, deadline_ms: int):
    """Bounded, reproducible hypothesis settings; deadlines are generous (CI has 2 busy CPUs)."""
    return settings(
        max_examples=EXAMPLES[kind],
        deadline=timedelta(milliseconds=deadline_ms),
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --------------------------------------------------------------------------- strategies

TAG_PIECES = [
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
    "<answer",
    "</search",
    "<b>",
    "<br/>",
    "<think id=1>",
    "\n",
    " ",
    "Doc 1",
    "Doc 4",
    "(Title: ",
    ")",
    "query",
    "Beijing",
]
# Characters that break naive line handling (str.splitlines splits on all of these).
AWKWARD_CHARS = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r", "\t", "\x00", "é", "\u0301"]
any_char = st.one_of(st.characters(), st.sampled_from(AWKWARD_CHARS))
any_text = st.text(any_char, max_size=40)
tag_free_text = any_text.filter(lambda t: "<" not in t and ">" not in t)
tagged_text = st.lists(st.one_of(st.sampled_from(TAG_PIECES), any_text), max_size=12).map("".join)
TOOL_CALL_PIECES = [
    "<tool_call>", "</tool_call>", '{"name": "search", "arguments": {"query": "', '"}}', '{"name": ',
    '"search"', '"lookup"', ', "parameters": {"query": ', '"top_k": ', "2", "-1", "true", '"a"', "{", "}", "[", "]",
    ", ", ": ", ";", "<|python_tag|>", "<think>", "</think>", "<answer>", "</answer>", "\\", '\\"', "null", "\n",
]  # fmt: skip
tool_call_text = st.lists(st.one_of(st.sampled_from(TOOL_CALL_PIECES), any_text), max_size=16).map("".join)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    any_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=12,
)


# --------------------------------------------------------------------------- tags


@fuzz("fast", 500)
@given(tagged_text)
def test_tag_parsers_accept_any_text(text: str) -> None:
    action = parse_action(text)
    assert action.kind in ("search", "answer", "invalid")
    assert action.payload == action.payload.strip()
    if action.kind == "search":
        assert action.payload and action.payload in text
    if action.kind == "invalid":
        assert action.payload == ""

    queries = extract_queries(text)
    assert all(q and q == q.strip() and "</search>" not in q for q in queries)
    assert len(queries) <= text.count("</search>")

    spans = information_spans(text)
    position = 0
    for start, end in spans:
        assert position <= start < end <= len(text)
        assert text.startswith("<information>", start)
        assert text.endswith("</information>", 0, end) or end == len(text)
        position = end


@fuzz("fast", 300)
@given(tool_call_text, st.booleans())
def test_tool_call_parsers_accept_any_text(text: str, allow_top_k: bool) -> None:
    for tool_format in TOOL_CALL_FORMATS:
        turn = parse_turn(text, tool_format, allow_top_k=allow_top_k)
        assert turn.kind in ("search", "answer", "invalid")
        assert (turn.kind == "search") == bool(turn.calls) or turn.kind == "answer"
        assert all(call.query and call.query == call.query.strip() for call in turn.calls)
        assert all(call.top_k is None or (allow_top_k and call.top_k >= 1) for call in turn.calls)
        assert turn.kind != "invalid" or turn.reasons  # an invalid turn always says why


@fuzz("fast", 500)
@given(tag_free_text, st.lists(tag_free_text, max_size=4), tag_free_text)
def test_tag_parsers_read_back_what_was_written(thought: str, queries: list[str], answer: str) -> None:
    searches = "".join(f"<search>{q}</search><information>Doc 1 <search>x</search></information>" for q in queries)
    text = f"<think>{thought}</think>{searches}<answer>{answer}</answer>"
    assert parse_action(text) == Action("answer", answer.strip())
    assert extract_queries(text) == [q.strip() for q in queries if q.strip()]
    assert len(information_spans(text)) == len(queries)
    if queries and queries[-1].strip():
        last_turn = f"<think>{thought}</think><search>{queries[-1]}</search>"
        assert parse_action(last_turn) == Action("search", queries[-1].strip())


# --------------------------------------------------------------------------- metrics


@fuzz("fast", 500)
@given(st.one_of(st.none(), any_text), st.lists(any_text, max_size=4))
def test_metrics_are_bounded_and_consistent(pred: str | None, golds: list[str]) -> None:
    em, sub, f1 = exact_match(pred, golds), substring_exact_match(pred, golds), f1_score(pred, golds)
    assert em in (0.0, 1.0) and sub in (0.0, 1.0)
    assert 0.0 <= f1 <= 1.0 and math.isfinite(f1)
    if em == 1.0:  # equal normalized strings: the gold is a substring and every token overlaps
        assert sub == 1.0 and f1 == 1.0
    if pred is None:
        assert em == sub == f1 == 0.0


@fuzz("fast", 500)
@given(any_text)
def test_normalization_is_idempotent_and_an_answer_matches_itself(text: str) -> None:
    normalized = normalize_answer(text)
    assert normalize_answer(normalized) == normalized
    assert normalized == normalized.strip() and "  " not in normalized
    expected = 1.0 if normalized else 0.0  # a gold that normalizes to "" never matches
    assert exact_match(text, [text]) == substring_exact_match(text, [text]) == f1_score(text, [text]) == expected
    # A gold written already normalized still matches the raw prediction.
    assert exact_match(text, [normalized]) == expected


@fuzz("fast", 500)
@given(tagged_text, tag_free_text, tagged_text)
def test_extract_answer_reads_the_last_complete_answer(prefix: str, answer: str, information: str) -> None:
    found = extract_answer(prefix)
    assert found is None or (found == found.strip() and "</answer>" not in found)
    # Whatever came before, a final answer block (then an information block, which is skipped) wins.
    assume("information>" not in information)
    response = f"{prefix}</information><answer>{answer}</answer><information>{information}</information>"
    assert extract_answer(response) == answer.strip()


# --------------------------------------------------------------------------- format reward

FORMAT_VALUES = {min(0.5 * t, 1.0) * min(t, s + 1) / max(t, s + 1) for t in range(1, 9) for s in range(0, 40)} | {0.0}


@fuzz("fast", 500)
@given(tagged_text)
def test_format_score_is_one_of_the_defined_values(text: str) -> None:
    score = format_score(text)
    assert any(math.isclose(score, v) for v in FORMAT_VALUES)
    assert any(math.isclose(format_score("<think>" + text), v) for v in FORMAT_VALUES)


@fuzz("fast", 500)
@given(
    st.lists(st.tuples(tag_free_text, tag_free_text.filter(lambda q: "\n" not in q and "\r" not in q)), max_size=3),
    tag_free_text,
)
def test_well_formed_responses_score_above_zero(turns: list[tuple[str, str]], answer: str) -> None:
    assume(all(t.strip() and q.strip() and q.strip().lower() != "query" for t, q in turns))
    assume(answer.strip() and answer.strip().lower() != "beijing")
    body = "".join(f"<think>{t}</think><search>{q}</search><information>Doc 1 x</information>" for t, q in turns)
    response = f"{body}<think>so</think><answer>{answer}</answer>"
    # T = S + 1 think blocks: balance 1, and min(0.5 T, 1) is 0.5 for T = 1, else 1.
    assert format_score(response) == (0.5 if not turns else 1.0)


# --------------------------------------------------------------------------- simulator output


@fuzz("fast", 500)
@given(
    st.lists(
        st.one_of(st.sampled_from(["Doc 1", "Doc 2:", "**Doc 3**", "Document 4.", "\n\n", "(Title: ", ")"]), any_text),
        max_size=15,
    ).map("".join),
    st.integers(min_value=1, max_value=8),
)
def test_parse_documents_always_returns_exactly_top_k(text: str, top_k: int) -> None:
    result = parse_documents(text, top_k)
    assert len(result.documents) == top_k
    assert all(
        isinstance(d.title, str) and isinstance(d.text, str) and d.source == "simulator" for d in result.documents
    )
    assert result.padded == top_k - min(result.found, top_k)
    assert result.trimmed == max(0, result.found - top_k)
    assert [d.text for d in result.documents[top_k - result.padded :]] == [PAD_TEXT] * result.padded


# --------------------------------------------------------------------------- recipes

SCHEMAS = [TrainRecipe, EvalRecipe, CollectRecipe, FinetuneRecipe, ServeRecipe, QuickstartRecipe]


def _keys(node, prefix: str = "") -> list[str]:
    keys = []
    for key in node:
        value = node._get_node(key)
        full = f"{prefix}{key}"
        keys.append(full)
        if OmegaConf.is_dict(value) and not value._is_none():
            keys.extend(_keys(value, full + "."))
    return keys


SCHEMA_KEYS = {schema: _keys(OmegaConf.structured(schema)) for schema in SCHEMAS}
AWKWARD_VALUES = [
    "",
    "null",
    "???",
    "[1",
    "{",
    "}",
    "${run_dir}",
    "${oc.env:SIMSEARCH_FUZZ_UNSET}",
    "${nope}",
    "1e999",
    "-1",
    "0",
    "nan",
    ".inf",
    "true",
    "[a, b]",
    "{a: 1}",
    "'quoted'",
    "!!binary aGk=",
    "&a [*a]",
    "a: b",
    "- 1",
    "[{name: x, path: y}]",
    "{f1: 1.0, em: x}",
    "3",
    "openai",
    "simulator",
    "custom",
    "bm25",
    "http",
]
override_values = st.one_of(st.sampled_from(AWKWARD_VALUES), any_text.filter(lambda v: "\x00" not in v))


@st.composite
def overrides_for(draw, schema):
    keys = st.one_of(
        st.sampled_from(SCHEMA_KEYS[schema]), st.sampled_from(["", "a..b", "x", "search.nope", "=", "run_dir.x"])
    )
    items = draw(st.lists(st.tuples(keys, override_values), max_size=4))
    return [f"{k}={v}" for k, v in items] + draw(st.lists(st.sampled_from(["noequals", "a b"]), max_size=1))


@st.composite
def yaml_documents(draw, schema):
    """Either arbitrary text, or a YAML mapping over the schema's keys with arbitrary values."""
    if draw(st.booleans()):
        return draw(st.text(any_char, max_size=80))
    keys = draw(st.lists(st.sampled_from(SCHEMA_KEYS[schema]), max_size=5))
    tree: dict = {}
    for key in keys:
        node = tree
        *parents, leaf = key.split(".")
        for parent in parents:
            child = node.get(parent)
            if not isinstance(child, dict):  # a value drawn earlier for this key gives way to the section
                child = node[parent] = {}
            node = child
        node[leaf] = draw(st.one_of(json_values, st.sampled_from(AWKWARD_VALUES)))
    return yaml.safe_dump(tree, allow_unicode=True)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
def test_load_recipe_ends_in_a_recipe_or_a_recipe_error(schema) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="fuzz-recipe-"))

    @fuzz("slow", 3000)
    @given(st.one_of(st.none(), yaml_documents(schema)), overrides_for(schema), st.booleans())
    def check(document: str | None, overrides: list[str], raw_bytes: bool) -> None:
        path = None
        if document is not None:
            path = workdir / "recipe.yaml"
            # Sometimes bytes that are not UTF-8 at all.
            path.write_bytes(document.encode("utf-8", "surrogatepass") + (b"\xff\xfe" if raw_bytes else b""))
        try:
            recipe = load_recipe(schema, path, overrides)
        except RecipeError as err:
            assert str(err).strip(), "a RecipeError must say what is wrong"
            if path is not None:
                assert str(path) in str(err)
        else:
            assert isinstance(recipe, schema)

    check()


# --------------------------------------------------------------------------- the /retrieve server


@pytest.fixture(scope="module")
def retrieve_url():
    passages = [Passage(str(i), f"Title {i}", f"alpha beta gamma word{i} {'delta ' * i}") for i in range(6)]
    engine = BM25SearchEngine.build(passages, show_progress=False)
    app = create_app(engine, max_body_bytes=20_000, max_queries_per_request=8)
    with serve_in_thread(app) as url, httpx.Client(timeout=10) as client:
        yield url, client


FIELDS = ["queries", "topk", "return_scores", "question", "golden_answers", "noisy", "p_noise"]
plausible = {
    "queries": st.lists(st.one_of(any_text, st.sampled_from(["alpha", "word3 delta", ""])), max_size=10),
    "topk": st.one_of(
        st.none(), st.integers(min_value=-3, max_value=10), st.integers(min_value=-(2**70), max_value=2**70)
    ),
    "return_scores": st.one_of(st.booleans(), json_scalars),
    "question": st.lists(st.one_of(st.none(), any_text), max_size=4),
    "golden_answers": st.lists(st.lists(any_text, max_size=2), max_size=4),
    "noisy": st.lists(st.one_of(st.booleans(), st.integers(min_value=-2, max_value=12)), max_size=4),
    "p_noise": st.one_of(st.floats(allow_nan=False, allow_infinity=False), json_scalars),
}


@st.composite
def valid_bodies(draw) -> dict:
    """Requests the server must accept, with aligned optional fields: odd but legal input for the engine."""
    queries = draw(st.lists(st.one_of(any_text, st.sampled_from(["alpha", "word3 delta"])), min_size=1, max_size=5))
    n = len(queries)
    body: dict = {"queries": queries}
    if draw(st.booleans()):
        body["topk"] = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=12)))  # the corpus has 6
    if draw(st.booleans()):
        body["return_scores"] = draw(st.booleans())
    if draw(st.booleans()):
        body["question"] = draw(st.lists(st.one_of(st.none(), any_text), min_size=n, max_size=n))
    if draw(st.booleans()):
        body["golden_answers"] = draw(st.lists(st.lists(any_text, max_size=2), min_size=n, max_size=n))
    if draw(st.booleans()):
        body["noisy"] = draw(
            st.lists(st.one_of(st.booleans(), st.integers(min_value=0, max_value=3)), min_size=n, max_size=n)
        )
    elif draw(st.booleans()):
        body["p_noise"] = draw(st.floats(min_value=0.0, max_value=1.0))
    return body


retrieve_bodies = st.one_of(
    valid_bodies().map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={k: st.one_of(plausible[k], json_values) for k in FIELDS}).map(
        lambda d: json.dumps(d).encode()
    ),
    st.binary(max_size=200),
    st.sampled_from(
        [
            b'{"queries": ["a"], "topk": NaN}',
            b'{"queries": ["\\ud800"]}',
            b"[" * 5000,
            b'{"queries": ["a"]}' + b" " * 30_000,
            b'{"queries": ["a"], "topk": 1e400}',
            b"",
            b"null",
        ]
    ),
)


@fuzz("medium", 5000)
@given(body=retrieve_bodies, content_type=st.sampled_from(["application/json", "text/plain", ""]))
@example(body=b'{"queries": ["alpha", "beta"], "topk": 9}', content_type="application/json")  # over the corpus
@example(body=b'{"queries": ["alpha"], "topk": 100000000000000000000}', content_type="application/json")
def test_retrieve_answers_any_body_with_json_and_never_5xx(retrieve_url, body: bytes, content_type: str) -> None:
    url, client = retrieve_url
    response = client.post(f"{url}/retrieve", content=body, headers={"content-type": content_type})
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
    payload = response.json()
    if response.status_code == 200:
        queries = json.loads(body)["queries"]
        assert isinstance(payload["result"], list) and len(payload["result"]) == len(queries)
    else:
        assert isinstance(payload["error"], str) and payload["error"]


# --------------------------------------------------------------------------- data files

row_keys = [
    "id",
    "question",
    "golden_answers",
    "contents",
    "title",
    "text",
    "prompt",
    "reward_model",
    "extra_info",
    "data_source",
]
plausible_rows = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(any_text, st.integers(), json_values),
        "question": st.one_of(any_text, json_values),
        "golden_answers": st.one_of(st.lists(any_text, max_size=3), any_text, json_values),
        "contents": st.one_of(any_text, json_values),
        "title": st.one_of(any_text, json_values),
        "text": st.one_of(any_text, json_values),
        "prompt": st.one_of(
            any_text,
            st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": any_text}), max_size=2),
            json_values,
        ),
        "reward_model": st.one_of(
            st.fixed_dictionaries({"ground_truth": st.fixed_dictionaries({"target": st.lists(any_text, max_size=2)})}),
            json_values,
        ),
        "extra_info": st.one_of(st.fixed_dictionaries({}, optional={"index": json_scalars}), json_values),
        "data_source": st.one_of(any_text, json_values),
    },
)
# Lines that json.loads turns into something other than a JSONDecodeError or a clean value.
LONE_SURROGATE = '{"id": "1", "question": "q\\ud83d", "golden_answers": ["a"], "contents": "\\ud83d"}'
HUGE_INTEGER = '{"id": ' + "7" * 5000 + ', "question": "q", "golden_answers": ["a"], "contents": "x"}'
DEEP_NESTING = "[" * 3000
# Valid JSON holding U+2028 raw (json.dumps(ensure_ascii=False) writes it so): one row, one line.
RAW_LINE_SEPARATOR = '{"id": "1", "question": "a\u2028b\x85c\x1cd?", "golden_answers": ["x"]}'
jsonl_lines = st.one_of(
    plausible_rows.map(lambda row: json.dumps(row, ensure_ascii=False)),
    plausible_rows.map(json.dumps),
    json_values.map(json.dumps),
    st.text(any_char, max_size=60).filter(lambda t: "\n" not in t),
)


@fuzz("medium", 3000)
@given(
    st.lists(
        st.one_of(jsonl_lines, st.sampled_from([LONE_SURROGATE, HUGE_INTEGER, DEEP_NESTING])), min_size=1, max_size=4
    )
)
@example([RAW_LINE_SEPARATOR])
@example([RAW_LINE_SEPARATOR, LONE_SURROGATE])
@example([HUGE_INTEGER])
@example([DEEP_NESTING])
def test_qa_loader_gives_examples_or_an_error_naming_file_and_line(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qa.jsonl"
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n")
        try:
            examples = load_qa(path)
        except QADataError as err:
            message = str(err)
            assert str(path) in message
            assert "line " in message or "holds no rows" in message, message
            return
        assert examples
        # What was read can be written and read back unchanged.
        copy = Path(tmp) / "copy.jsonl"
        write_qa_jsonl(examples, copy)
        assert load_qa(copy, data_source=examples[0].data_source) == examples


@fuzz("medium", 3000)
@given(st.lists(jsonl_lines, min_size=1, max_size=4))
def test_corpus_lines_give_passages_or_an_error_naming_file_and_line(lines: list[str]) -> None:
    path = "corpus.jsonl"
    for number, line in enumerate(lines, 1):
        try:
            passage = parse_passage(line.encode("utf-8", "surrogatepass"), path=path, line_no=number)
        except CorpusFormatError as err:
            assert f"{path}:{number}:" in str(err)
        else:
            assert isinstance(passage, Passage) and isinstance(passage.id, str)


@fuzz("medium", 3000)
@given(
    st.lists(st.tuples(st.one_of(any_text, st.integers()), any_text, any_text), min_size=1, max_size=4), st.booleans()
)
def test_corpus_rows_read_back_as_written(rows: list[tuple], wiki18: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for pid, title, text in rows:
                title = title.replace("\n", " ")
                row = (
                    {"id": pid, "contents": f"{title}\n{text}"} if wiki18 else {"id": pid, "title": title, "text": text}
                )
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        passages = load_passages(path)
    expected = [(str(pid), title.replace("\n", " "), text) for pid, title, text in rows]
    assert [(p.id, p.title, p.text) for p in passages] == expected


def test_qa_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(
        b'{"question": "q?", "golden_answers": ["a"]}\n{"question": "caf\xe9?", "golden_answers": ["a"]}\n'
    )
    with pytest.raises(QADataError, match=r"latin1.jsonl: line 2: not UTF-8"):
        load_qa(path)


# --------------------------------------------------------------------------- corpus bugs the fuzzers found


def test_corpus_line_nested_too_deeply_is_a_format_error() -> None:
    with pytest.raises(CorpusFormatError, match=r"corpus.jsonl:3:"):
        parse_passage(DEEP_NESTING, path="corpus.jsonl", line_no=3)


def test_corpus_line_with_a_huge_integer_names_file_and_line() -> None:
    with pytest.raises(CorpusFormatError, match=r"corpus.jsonl:3:"):
        parse_passage(HUGE_INTEGER, path="corpus.jsonl", line_no=3)


def test_corpus_line_with_a_lone_surrogate_is_refused_or_usable(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "0", "contents": "ok\\nfine"}\n' + LONE_SURROGATE + "\n")
    try:
        passages = load_passages(path)
    except CorpusFormatError as err:
        assert "corpus.jsonl:2:" in str(err)
        return
    corpus_fingerprint(passages)  # must not raise


def test_corpus_format_error_is_a_data_error() -> None:
    assert issubclass(CorpusFormatError, DataError)
    assert issubclass(QADataError, DataError)


# --------------------------------------------------------------------------- regressions found by the fuzzers


@pytest.mark.parametrize(
    ("document", "overrides", "fragment"),
    [
        ("a: [", [], "not valid YAML"),
        ("\tsteps: 1", [], "not valid YAML"),
        ("- 1\n- 2", [], "not a list"),
        ("5", [], "not a single value"),
        ("!!python/object/apply:os.system ['true']", [], "not valid YAML"),
        ("x: 1\nx: 2", [], "duplicate key"),
        ("\x00", [], "not valid YAML"),
        (b"host: caf\xe9", [], "not UTF-8"),
        (None, ["search.top_k=[1"], "override 'search.top_k=[1'"),
        (None, ["host=${host}"], "Recursive interpolation"),
    ],
)
def test_recipe_text_that_cannot_be_a_recipe_is_a_recipe_error(tmp_path: Path, document, overrides, fragment) -> None:
    path = None
    if document is not None:
        path = tmp_path / "serve.yaml"
        path.write_bytes(document if isinstance(document, bytes) else document.encode())
    with pytest.raises(RecipeError, match=re.escape(fragment)):
        load_recipe(ServeRecipe, path, overrides)


class SlowEngine:
    """Answers `top_k` documents; refuses top_k > 3; the query "hold" takes a second."""

    def __init__(self, score: float = 1.0, title: str = "T") -> None:
        self.calls: list[list[int]] = []  # the top_k of each request, per call
        self.score, self.title = score, title

    def search(self, requests):
        self.calls.append([r.top_k for r in requests])
        if any(r.top_k > 3 for r in requests):
            raise ValueError("top_k must be between 1 and the corpus size, 3")
        time.sleep(1.0 if any(r.query == "hold" for r in requests) else 0.0)
        return [
            [Document(self.title, f"{r.query} {i}", score=self.score, id=str(i)) for i in range(r.top_k)]
            for r in requests
        ]


def test_a_request_the_engine_refuses_gets_422_and_does_not_fail_the_requests_coalesced_with_it() -> None:
    engine = SlowEngine()
    with serve_in_thread(create_app(engine)) as url:

        def post(topk: int, query: str = "q") -> httpx.Response:
            return httpx.post(f"{url}/retrieve", json={"queries": [query], "topk": topk}, timeout=10)

        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(post, 1, "hold")  # holds the engine, so the next five queue and coalesce
            time.sleep(0.3)
            responses = list(pool.map(post, [2, 3, 9, 1, 2]))
        first = first.result()
    assert first.status_code == 200
    assert [r.status_code for r in responses] == [200, 200, 422, 200, 200]
    assert "corpus size" in responses[2].json()["error"]
    assert [len(docs) for r in responses if r.status_code == 200 for docs in r.json()["result"]] == [2, 3, 1, 2]
    # The refused request was coalesced with others, and that call was re-run one request at a time.
    assert any(9 in call and len(call) > 1 for call in engine.calls) and [9] in engine.calls


@pytest.mark.parametrize("score", [float("nan"), float("inf")])
def test_non_finite_scores_and_lone_surrogates_still_make_a_json_answer(score: float) -> None:
    engine = SlowEngine(score=score, title="half an emoji \ud83d")
    with serve_in_thread(create_app(engine)) as url:
        response = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 1, "return_scores": True}, timeout=10)
    assert response.status_code == 200
    (entry,) = response.json()["result"][0]
    assert entry["score"] is None
    assert entry["document"]["contents"] == "half an emoji \ud83d\na 0"


def test_topk_over_the_server_limit_is_422_before_the_engine_sees_it() -> None:
    engine = SlowEngine()
    with serve_in_thread(create_app(engine, max_top_k=50)) as url:
        response = httpx.post(f"{url}/retrieve", json={"queries": ["a"], "topk": 10**9}, timeout=10)
    assert response.status_code == 422 and "limit of 50" in response.json()["error"]
    assert engine.calls == []
