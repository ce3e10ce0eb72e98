"""`simsearch eval`: one call, several engines and baselines, files that agree, resume, clear errors.

The end-to-end test evaluates a tiny Qwen2 checkpoint built in-process against an LLM simulator
(the same tiny model), BM25 and dense retrieval over a tiny world, plus the direct and RAG
baselines. The other tests swap the policy for `ScriptedPolicy`, which answers from a lookup
table in a known pattern and counts its generate calls, so numbers and calls can be checked
exactly; their simulator is `SimulatedSearchEngine` over a scripted generator.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

from simsearch.commands import evaluate
from simsearch.config import EvalRecipe, load_recipe
from simsearch.data.corpus import load_passages
from simsearch.data.qa import QADataError, load_qa
from simsearch.data.templates import DIRECT_TEMPLATE, RAG_TEMPLATE, SEARCH_R1_TEMPLATE, render_prompt
from simsearch.errors import DataError, RecipeError, ServiceError
from simsearch.eval.metrics import exact_match, f1_score, substring_exact_match
from simsearch.factory import build
from simsearch.models import build_tiny_model, save_tiny, train_tokenizer
from simsearch.policy import rag
from simsearch.retrieval.bm25 import BM25SearchEngine
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.tinyworld.world import build_world
from simsearch.training.runlog import RunLogger
from simsearch.types import Completion, QAExample, SamplingParams, SearchRequest
from tests.servers import free_port

METRIC_FUNCTIONS = {"substring_em": substring_exact_match, "em": exact_match, "f1": f1_score}


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny world on disk: corpus.jsonl, train.jsonl, test.jsonl."""
    built = build_world(seed=0, n_entities=12, n_train_entities=8, n_cities=5)
    paths = built.write(tmp_path_factory.mktemp("world"))
    return built, paths


@pytest.fixture(scope="module")
def tokenizer(world):
    built, _ = world
    texts = built.texts_for_tokenizer(200) + [SEARCH_R1_TEMPLATE, RAG_TEMPLATE, DIRECT_TEMPLATE] * 5
    return train_tokenizer(texts, vocab_size=400)


@pytest.fixture(scope="module")
def checkpoint(tokenizer, tmp_path_factory):
    """A randomly initialised tiny Qwen2 saved as a Hugging Face checkpoint."""
    model = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64)
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("policy"))


def _engines_via_build(monkeypatch, tmp_path, simulator=None):
    """Builds engines through build.py, except a scripted simulator when one is given."""
    real = build.build_search_engine

    def patched(cfg, *, seed=0):
        if cfg.kind == "simulator" and simulator is not None:
            return simulator
        return real(cfg, seed=seed)

    monkeypatch.setattr(evaluate, "build_search_engine", patched)


# --------------------------------------------------------------------------- test doubles


def _question(context: str) -> str:
    # Every template ends with "Question: {question}\n".
    return context[context.rindex("Question: ") + len("Question: ") :].split("\n", 1)[0].strip()


@dataclass
class ScriptedPolicy:
    """A GenerationEngine that answers from a lookup table, in a fixed pattern per question.

    Question k of `golds` (in order): k % 3 == 0 answers the gold exactly, k % 3 == 1 wraps it in
    other words (substring EM 1, EM 0), k % 3 == 2 answers wrongly. With the search-r1 template
    it first searches for the question, then answers; with the direct template it always tries
    to search. With n > 1 samples only sample 0 follows the pattern; the others answer wrongly at
    once.
    """

    tokenizer: object
    golds: dict[str, tuple[int, str]]
    fail_on_call: int | None = None  # raise at this call number (simulates an interrupted run)
    calls: list[tuple[list[str], SamplingParams]] = field(default_factory=list)

    def generate(self, prompts, params):
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise KeyboardInterrupt("interrupted by the test")
        contexts = [self.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        self.calls.append((contexts, params))
        out = []
        for context in contexts:
            for sample in range(params.n):
                out.append(self._complete(self._script(context, sample), params))
        return out

    def answer(self, question: str, sample: int = 0) -> str:
        index, gold = self.golds[question]
        if sample > 0 or index % 3 == 2:
            return "nobody knows"
        return gold if index % 3 == 0 else f"it is {gold} I think"

    def _script(self, context: str, sample: int) -> str:
        question = _question(context)
        if context.startswith(DIRECT_TEMPLATE[:40]):
            return f"<search> {question} </search>"
        searched = "<information>" in context[context.rindex("Question: ") :]  # the prompt names the tag too
        if context.startswith(RAG_TEMPLATE[:40]) or searched:
            return f"<think> done </think> <answer> {self.answer(question, sample)} </answer>"
        if sample > 0:  # the rollout asks for n samples in the first turn only
            return f"<answer> {self.answer(question, sample)} </answer>"
        return f"<think> look it up </think> <search> {question} </search>"

    def _complete(self, text, params):
        hits = [(text.find(s) + len(s), s) for s in params.stop if s in text]
        stop = None
        if hits:
            end, stop = min(hits)
            text = text[:end]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Completion(ids, text, "stop" if stop else "length", stop)

    def questions_seen(self) -> list[str]:
        return [_question(context) for contexts, _ in self.calls for context in contexts]


@dataclass
class ScriptedSimulatorLM:
    """The simulator's generator: useful prompts get the answer, noisy prompts do not."""

    calls: int = 0

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for prompt in prompts:
            useful = "Useful Output:" in prompt
            answer = re.search(r"whose answer is (.*)\.\n", prompt).group(1)
            fact = f"the answer is {answer}" if useful else "nothing relevant here"
            text = "\n".join(f"Doc {i} (Title: Page {i}) {fact}, note {i}." for i in (1, 2, 3))
            out.append(Completion([], text, "stop"))
        return out


@dataclass
class RecordingEngine:
    """A SearchEngine that forwards to `inner` and keeps every query it was sent."""

    inner: object
    queries: list[str] = field(default_factory=list)

    def search(self, requests):
        self.queries.extend(request.query for request in requests)
        return self.inner.search(requests)


def _record_engines(monkeypatch) -> dict[str, RecordingEngine]:
    """Builds engines through build.py, each real one wrapped in a RecordingEngine (by kind)."""
    recorders: dict[str, RecordingEngine] = {}

    def patched(cfg, *, seed=0):
        engine = build.build_search_engine(cfg, seed=seed)
        if engine is None:  # kind=self: no engine object at all
            return None
        recorders[cfg.kind] = RecordingEngine(engine)
        return recorders[cfg.kind]

    monkeypatch.setattr(evaluate, "build_search_engine", patched)
    return recorders


def _install_policy(monkeypatch, policy, tokenizer):
    monkeypatch.setattr(evaluate, "build_generation_engine", lambda cfg, **_: (policy, tokenizer, None))


def _golds(world_paths, *names) -> dict[str, tuple[int, str]]:
    table = {}
    for name in names:
        for index, line in enumerate(Path(world_paths[name]).read_text().splitlines()):
            row = json.loads(line)
            table[row["question"]] = (index, row["golden_answers"][0])
    return table


def _overrides(tmp_path, world_paths, *extra: str) -> list[str]:
    return [
        f"run_dir={tmp_path / 'run'}",
        "policy.model.path=scripted",
        "sampling.max_new_tokens=64",
        "chunk_size=2",
        f"datasets=[{{name: heldout, path: {world_paths['test']}, limit: 5}}]",
        "engines.bm25.kind=bm25",
        f"engines.bm25.corpus={world_paths['corpus']}",
        *extra,
    ]


def _recipe(tmp_path, world_paths, *extra: str) -> EvalRecipe:
    return load_recipe(EvalRecipe, None, _overrides(tmp_path, world_paths, *extra))


def _first_question(world_paths) -> QAExample:
    """The first question of the tiny world's test set."""
    return load_qa(world_paths["test"])[0]


def _markdown_tables(text: str) -> dict[str, dict[str, list[str]]]:
    """Section title -> method -> cells, from table.md."""
    tables: dict[str, dict[str, list[str]]] = {}
    title = ""
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
            tables[title] = {}
        elif line.startswith("| ") and not line.startswith(("| Method", "| Simulator")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            tables[title][cells[0]] = cells[2:]
    return tables


def _read(run: Path, method: str, dataset: str) -> list[dict]:
    """The per-example rows of (method, dataset)."""
    return [json.loads(line) for line in (run / "examples" / method / f"{dataset}.jsonl").read_text().splitlines()]


def _png(path: Path) -> Image.Image:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return Image.open(path).convert("RGB")


# --------------------------------------------------------------------------- end to end


def test_eval_checkpoint_against_simulator_bm25_dense_and_baselines(world, checkpoint, tmp_path, monkeypatch, capsys):
    _, paths = world
    _engines_via_build(monkeypatch, tmp_path)
    training_run = tmp_path / "train_run"
    logger = RunLogger(training_run)
    for step in range(1, 4):  # a few logged training steps for the curves
        logger.log(
            step,
            {
                "reward/mean": 0.1 * step,
                "reward/f1": 0.1 * step,
                "search/calls_per_traj": 1.0,
                "rollout/response_len": 40.0 + step,
                "curriculum/p_noise": 0.05 * step,
            },
        )
    logger.close()
    recipe = load_recipe(
        EvalRecipe,
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            f"policy.model.path={checkpoint}",
            "sampling.max_new_tokens=4",
            "rollout.max_turns=1",
            "chunk_size=2",
            f"datasets=[{{name: heldout, path: {paths['test']}, limit: 3}}, "
            f"{{name: train, path: {paths['train']}, limit: 2}}]",
            "engines.sim.kind=simulator",
            f"engines.sim.simulator.generation.model.path={checkpoint}",
            "engines.sim.simulator.max_new_tokens=6",
            "engines.bm25.kind=bm25",
            f"engines.bm25.corpus={paths['corpus']}",
            "engines.dense.kind=dense",
            f"engines.dense.corpus={paths['corpus']}",
            "baselines=[direct, rag]",
            "rag_engine=bm25",
            f"training_run={training_run}",
            "fidelity_size=2",
        ],
    )
    summary = evaluate.main(recipe)

    run = tmp_path / "run"
    assert list(summary["rows"]) == ["direct", "rag", "sim", "bm25", "dense"]
    ids = {"heldout": ["test_0", "test_1", "test_2"], "train": ["train_0", "train_1"]}
    for method in summary["rows"]:
        for dataset, expected in ids.items():
            rows = _read(run, method, dataset)
            # every question, the incomplete last chunk included (3 questions, chunks of 2)
            assert [row["id"] for row in rows] == expected
            assert all(len(row["samples"]) == 1 and row["samples"][0]["turns"] for row in rows)
    rag = _read(run, "rag", "heldout")
    assert all(len(row["retrieval"]["documents"]) == 3 for row in rag)
    assert {doc["source"] for row in rag for doc in row["retrieval"]["documents"]} == {"bm25"}

    table = (run / "table.md").read_text()
    assert "| Method | Search | heldout | train | Avg. |" in table
    assert {(e["simulator"], e["reference"], e["dataset"]) for e in summary["fidelity"]} == {
        ("sim", ref, ds) for ref in ("bm25", "dense") for ds in ("heldout", "train")
    }
    assert all(e["fidelity/examples"] == 2.0 for e in summary["fidelity"])  # fidelity_size
    assert "## Simulator fidelity" in table
    assert json.loads((run / "summary.json").read_text()) == summary
    assert load_recipe(EvalRecipe, run / "recipe.yaml").policy.model.path == str(checkpoint)
    assert (run / "command.txt").read_text().startswith("# ")  # a time stamp, then the command line
    bars, curves = _png(run / "bars.png"), _png(run / "curves.png")
    assert bars.size == (1200, 600) and curves.size == (1500, 800)
    for image in (bars, curves):
        assert len(image.getcolors(maxcolors=1 << 20)) > 10  # something was drawn
    page = (run / "view.html").read_text()
    assert "test_2" in page and "train_1" in page  # every question's trajectories, on one page
    last = capsys.readouterr().out.strip().splitlines()[-1]
    results, trajectories = run / "table.md", run / "view.html"
    assert last == f"simsearch eval: results in {results} (summary.json, bars.png; trajectories: {trajectories})"


# --------------------------------------------------------------------------- numbers


def test_table_matches_per_example_files(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    policy = ScriptedPolicy(tokenizer, _golds(paths, "test", "train"))
    _install_policy(monkeypatch, policy, tokenizer)
    recipe = _recipe(
        tmp_path,
        paths,
        f"datasets=[{{name: heldout, path: {paths['test']}, limit: 5}}, "
        f"{{name: train, path: {paths['train']}, limit: 4}}]",
        "baselines=[direct, rag]",
    )
    summary = evaluate.main(recipe)
    run = tmp_path / "run"
    tables = _markdown_tables((run / "table.md").read_text())

    for method in ("direct", "rag", "bm25"):
        per_dataset = {}
        for dataset in ("heldout", "train"):
            rows = _read(run, method, dataset)
            per_dataset[dataset] = {
                metric: sum(fn(row["samples"][0]["answer"], row["golden_answers"]) for row in rows) / len(rows)
                for metric, fn in METRIC_FUNCTIONS.items()
            }
        for metric, title in (("substring_em", "Substring EM"), ("em", "Exact match"), ("f1", "Token F1")):
            section = next(name for name in tables if name.startswith(title))
            cells = [float(c) for c in tables[section][method]]
            expected = [100 * per_dataset[d][metric] for d in ("heldout", "train")]
            expected.append(sum(expected) / 2)  # the papers' Avg.: unweighted over datasets
            assert cells == pytest.approx(expected, abs=0.005)

    # The scripted pattern, recomputed by hand for heldout (5 questions: k%3 = 0,1,2,0,1):
    # exact on 2, substring-only on 2, wrong on 1 -> substring EM 4/5, EM 2/5.
    bm25 = summary["rows"]["bm25"]["results"]["heldout"]
    assert bm25["substring_em"] == pytest.approx(0.8) and bm25["em"] == pytest.approx(0.4)
    assert bm25["searches_per_question"] == 1.0 and bm25["answer_rate"] == 1.0
    # direct: its one turn tries to search; nothing is run and no answer is given
    direct = summary["rows"]["direct"]["results"]["heldout"]
    assert direct["searches_per_question"] == 0.0 and direct["answer_rate"] == 0.0 and direct["substring_em"] == 0.0
    assert summary["rows"]["rag"]["results"]["heldout"]["searches_per_question"] == 1.0


def test_rag_prompt_holds_the_retrieved_documents(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    policy = ScriptedPolicy(tokenizer, _golds(paths, "test"))
    _install_policy(monkeypatch, policy, tokenizer)
    recipe = _recipe(tmp_path, paths, "baselines=[rag]", "engines.bm25.top_k=2")
    evaluate.main(recipe)

    rows = _read(tmp_path / "run", "rag", "heldout")
    bm25 = BM25SearchEngine.build(load_passages(paths["corpus"]))
    rag_contexts = [c for contexts, _ in policy.calls for c in contexts if c.startswith(RAG_TEMPLATE[:40])]
    assert len(rag_contexts) == 5
    for row, context in zip(rows, rag_contexts):
        docs = bm25.search([SearchRequest(query=row["question"], top_k=2)])[0]
        assert [d["id"] for d in row["retrieval"]["documents"]] == [d.id for d in docs]
        assert context == render_prompt(row["question"], template="rag", documents=docs)


@dataclass
class RecordingPolicy:
    """A GenerationEngine that forwards to `inner` and keeps every prompt it was sent."""

    inner: object
    prompts: list[list[int]] = field(default_factory=list)

    def generate(self, prompts, params):
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, params)


def test_rag_prompts_over_the_context_have_their_documents_cut(world, tokenizer, checkpoint, tmp_path, monkeypatch):
    # Real lengths: the tiny checkpoint's tokenizer, BM25's documents, a context the full RAG
    # prompts do not fit in. Each prompt keeps as much document text as fits, and is counted.
    _, paths = world
    bm25 = BM25SearchEngine.build(load_passages(paths["corpus"]))
    examples = evaluate.load_dataset(load_recipe(EvalRecipe, None, _overrides(tmp_path, paths)).datasets[0])
    docs = [bm25.search([SearchRequest(query=ex.question, top_k=3)])[0] for ex in examples]
    full = [
        len(tokenizer.encode(render_prompt(ex.question, template="rag", documents=d))) for ex, d in zip(examples, docs)
    ]
    bare = [len(tokenizer.encode(render_prompt(ex.question, template="rag", documents=[]))) for ex in examples]
    max_new_tokens, context = 4, min(full) - 1
    budget = context - max_new_tokens
    assert max(bare) < budget < context <= min(full)  # no full prompt fits; every question does

    def recorded(cfg, **kwargs):
        engine, tok, model = build.build_generation_engine(cfg, **kwargs)
        recorder.inner = engine
        return recorder, tok, model

    recorder = RecordingPolicy(None)
    monkeypatch.setattr(evaluate, "build_generation_engine", recorded)
    recipe = _recipe(
        tmp_path,
        paths,
        f"policy.model.path={checkpoint}",
        f"sampling.max_new_tokens={max_new_tokens}",
        f"rollout.max_context_tokens={context}",
        "rollout.template=search-r1-brief",
        "rollout.max_turns=1",
        "baselines=[rag]",
    )
    summary = evaluate.main(recipe)

    rag_prompts = [ids for ids in recorder.prompts if tokenizer.decode(ids).startswith(RAG_TEMPLATE[:40])]
    assert len(rag_prompts) == 5 and all(len(ids) <= budget for ids in rag_prompts)
    rows = _read(tmp_path / "run", "rag", "heldout")
    for row, example, documents, ids in zip(rows, examples, docs, rag_prompts):
        cut = row["retrieval"]["truncated_chars"]
        kept = sum(len(d.text) for d in documents) - cut
        assert cut > 0 and [d["id"] for d in row["retrieval"]["documents"]] == [d.id for d in documents]
        assert ids == tokenizer.encode(
            render_prompt(example.question, template="rag", documents=rag._first_chars(documents, kept))
        )
        # the most that fits: one more character of document text would not
        one_more = render_prompt(example.question, template="rag", documents=rag._first_chars(documents, kept + 1))
        assert len(tokenizer.encode(one_more)) > budget
    assert summary["rows"]["rag"]["results"]["heldout"]["rag/truncated"] == 5.0
    assert summary["header"]["RAG prompts with documents cut to fit"] == "5 of 5"
    assert "- RAG prompts with documents cut to fit: 5 of 5" in (tmp_path / "run" / "table.md").read_text()


def test_rag_prompt_keeps_every_document_when_it_fits(world, tokenizer):
    _, paths = world
    bm25 = BM25SearchEngine.build(load_passages(paths["corpus"]))
    example = _first_question(paths)
    docs = bm25.search([SearchRequest(query=example.question, top_k=3)])[0]
    ids = tokenizer.encode(render_prompt(example.question, template="rag", documents=docs))
    assert rag.rag_prompt(example, docs, tokenizer, len(ids)) == (ids, 0)
    bare = len(tokenizer.encode(render_prompt(example.question, template="rag", documents=[])))
    with pytest.raises(DataError, match=rf"example '{example.id}': without any document text it takes {bare} tokens"):
        rag.rag_prompt(example, docs, tokenizer, bare - 1)


def test_rag_without_room_for_a_prompt_is_refused(world, tmp_path):
    _, paths = world
    with pytest.raises(RecipeError, match=r"sampling.max_new_tokens=64 leaves no room for the RAG prompt"):
        _recipe(tmp_path, paths, "baselines=[rag]", "rollout.max_context_tokens=64")  # max_new_tokens=64


def test_simulator_obeys_noisy_share_and_fidelity_uses_policy_queries(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    policy = ScriptedPolicy(tokenizer, _golds(paths, "test"))
    _install_policy(monkeypatch, policy, tokenizer)
    simulator = SimulatedSearchEngine(ScriptedSimulatorLM(), preset="zerosearch")
    _engines_via_build(monkeypatch, tmp_path, simulator=simulator)
    recipe = _recipe(
        tmp_path,
        paths,
        "engines.sim.kind=simulator",
        "engines.sim.simulator.preset=zerosearch",
        "engines.sim.simulator.chat=true",
        "engines.sim.simulator.generation.model.path=scripted",
        "noisy_share=1.0",
        "fidelity_size=4",
    )
    summary = evaluate.main(recipe)

    rows = _read(tmp_path / "run", "sim", "heldout")
    searches = [t for row in rows for t in row["samples"][0]["turns"] if t["executed"]]
    assert len(searches) == 5 and all(t["num_noisy"] == 3 for t in searches)  # noisy_share 1: all noisy
    assert all("nothing relevant" in d["text"] for t in searches for d in t["documents"])
    (entry,) = summary["fidelity"]
    # 4 questions, each with the query the policy sent to bm25 (the question text, by the script)
    assert entry["policy_queries"] == 4 and entry["question_queries"] == 0
    assert entry["fidelity/useful_contains_answer"] == 1.0 and entry["fidelity/noisy_contains_answer"] == 0.0
    assert entry["fidelity/examples"] == 4.0


def test_pass_at_n_takes_the_best_sample(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    policy = ScriptedPolicy(tokenizer, _golds(paths, "test"))
    _install_policy(monkeypatch, policy, tokenizer)
    recipe = _recipe(tmp_path, paths, "n=2", "sampling.temperature=1.0")
    summary = evaluate.main(recipe)

    rows = _read(tmp_path / "run", "bm25", "heldout")
    assert [len(row["samples"]) for row in rows] == [2] * 5
    assert [row["samples"][1]["scores"]["substring_em"] for row in rows] == [0.0] * 5  # sample 1 always wrong
    # pass@2 = sample 0's pattern: substring EM 4/5
    assert summary["rows"]["bm25"]["results"]["heldout"]["substring_em"] == pytest.approx(0.8)
    assert "pass@2" in (tmp_path / "run" / "table.md").read_text()


# --------------------------------------------------------------------------- self-search: sim-to-real


def test_self_search_policy_sends_its_searches_to_a_real_engine(world, tokenizer, tmp_path, monkeypatch):
    # SSRL's sim-to-real: on a real engine each generation is cut at </search> and that engine's
    # results are inserted; on kind=self the policy writes its own information.
    _, paths = world
    golds = _golds(paths, "test")
    policy = ScriptedPolicy(tokenizer, golds)
    _install_policy(monkeypatch, policy, tokenizer)
    recorders = _record_engines(monkeypatch)
    recipe = _recipe(tmp_path, paths, "rollout.template=self-search", "engines.own.kind=self")
    summary = evaluate.main(recipe)

    questions = [q for q, (i, _) in sorted(golds.items(), key=lambda item: item[1][0]) if i < 5]
    assert recorders["bm25"].queries == questions  # one search per question, the scripted query
    rows = _read(tmp_path / "run", "bm25", "heldout")
    first_turns = [row["samples"][0]["turns"][0] for row in rows]
    assert all(t["executed"] and t["query"] == q for t, q in zip(first_turns, questions))
    assert all(d["source"] == "bm25" for t in first_turns for d in t["documents"])
    # answered from the inserted results, in the script's pattern: substring EM 4/5, EM 2/5
    bm25 = summary["rows"]["bm25"]["results"]["heldout"]
    assert (bm25["substring_em"], bm25["em"], bm25["searches_per_question"]) == pytest.approx((0.8, 0.4, 1.0))
    # kind=self ran no search anywhere: its turns never executed one
    own = _read(tmp_path / "run", "own", "heldout")
    assert not any(t["executed"] for row in own for t in row["samples"][0]["turns"])


def test_row_whose_engine_could_never_be_called_is_refused(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    builds = []
    monkeypatch.setattr(evaluate, "build_generation_engine", lambda cfg, **_: builds.append(cfg))
    with pytest.raises(RecipeError, match=r"engines.bm25: rollout.max_turns=0 never runs a search, so row 'bm25'"):
        _recipe(tmp_path, paths, "rollout.template=self-search", "rollout.max_turns=0")
    assert builds == [] and not (tmp_path / "run").exists()  # refused before any work
    # max_turns=0 is SSRL's single generation when the policy is its own engine
    own = load_recipe(
        EvalRecipe,
        None,
        [
            f"run_dir={tmp_path / 'run'}",
            "policy.model.path=scripted",
            f"datasets=[{{name: heldout, path: {paths['test']}}}]",
            "engines.own.kind=self",
            "rollout.template=self-search",
            "rollout.max_turns=0",
        ],
    )
    assert [method.name for method in evaluate.plan_methods(own)] == ["own"]


def test_self_search_real_share_is_decided_by_the_engine_in_eval(world, tmp_path):
    _, paths = world
    with pytest.raises(RecipeError, match=r"rollout.self_search_real_share=0.5 is a training setting"):
        _recipe(tmp_path, paths, "rollout.template=self-search", "rollout.self_search_real_share=0.5")
    with pytest.raises(RecipeError, match=r"rollout.self_search_real_share=1 only applies to rollout.template=self"):
        _recipe(tmp_path, paths, "rollout.self_search_real_share=1.0")


def test_self_search_rows_of_the_old_protocol_are_not_resumed(world, tokenizer, tmp_path, monkeypatch):
    # Rows written when a self-search policy never searched its engine (share 0) must not be
    # taken for rows of the engine: their fingerprint differs, so the resume refuses them.
    _, paths = world
    _install_policy(monkeypatch, ScriptedPolicy(tokenizer, _golds(paths, "test")), tokenizer)
    with monkeypatch.context() as old:
        old.setattr(evaluate, "real_search_share", lambda template, kind: 0.0)
        evaluate.main(_recipe(tmp_path, paths, "rollout.template=self-search"))
    with pytest.raises(RecipeError, match=r"bm25/heldout.jsonl holds results of a different recipe"):
        evaluate.main(_recipe(tmp_path, paths, "rollout.template=self-search"))


# --------------------------------------------------------------------------- resume


def test_resume_skips_finished_examples(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    golds = _golds(paths, "test")
    _engines_via_build(monkeypatch, tmp_path)

    # Reference: one uninterrupted run.
    reference = ScriptedPolicy(tokenizer, golds)
    _install_policy(monkeypatch, reference, tokenizer)
    evaluate.main(_recipe(tmp_path / "a", paths, "baselines=[direct]"))

    # Interrupted run: direct (3 chunks of <= 2 questions, 1 call each) finishes, then bm25
    # (2 calls per chunk) is interrupted at its second chunk's first call.
    first = ScriptedPolicy(tokenizer, golds, fail_on_call=5)
    _install_policy(monkeypatch, first, tokenizer)
    with pytest.raises(KeyboardInterrupt):
        evaluate.main(_recipe(tmp_path / "b", paths, "baselines=[direct]"))
    bm25_file = tmp_path / "b" / "run" / "examples" / "bm25" / "heldout.jsonl"
    assert [json.loads(line)["id"] for line in bm25_file.read_text().splitlines()] == ["test_0", "test_1"]
    with bm25_file.open("a") as handle:  # a kill in the middle of a write leaves half a line
        handle.write('{"id": "test_2", "quest')

    second = ScriptedPolicy(tokenizer, golds)
    _install_policy(monkeypatch, second, tokenizer)
    evaluate.main(_recipe(tmp_path / "b", paths, "baselines=[direct]"))
    # Only bm25's last 3 questions were run: chunks [test_2, test_3] and [test_4], 2 calls each.
    assert len(second.calls) == 4
    assert set(second.questions_seen()) == {q for q, (i, _) in golds.items() if i in (2, 3, 4)}

    for method in ("direct", "bm25"):

        def rows(root, method=method):
            lines = (root / "run" / "examples" / method / "heldout.jsonl").read_text().splitlines()
            return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in lines]

        assert rows(tmp_path / "b") == rows(tmp_path / "a")  # same results, each id once

    third = ScriptedPolicy(tokenizer, golds)
    _install_policy(monkeypatch, third, tokenizer)
    summary = evaluate.main(_recipe(tmp_path / "b", paths, "baselines=[direct]"))
    assert third.calls == [] and summary["rows"]["bm25"]["results"]["heldout"]["questions"] == 5


def test_a_sigterm_ends_the_chunk_in_flight_keeps_its_rows_and_exits_143(
    world, tokenizer, tmp_path, monkeypatch, capsys
):
    import signal

    from simsearch.training.preempt import STOP_STATUS

    _, paths = world
    golds = _golds(paths, "test")
    _engines_via_build(monkeypatch, tmp_path)
    policy = ScriptedPolicy(tokenizer, golds)
    real_generate = policy.generate

    def generate_then_sigterm(prompts, params):  # the signal comes during direct's second chunk
        if len(policy.calls) == 1:
            signal.raise_signal(signal.SIGTERM)
        return real_generate(prompts, params)

    policy.generate = generate_then_sigterm
    _install_policy(monkeypatch, policy, tokenizer)
    with pytest.raises(SystemExit) as stopped:
        evaluate.main(_recipe(tmp_path, paths, "baselines=[direct]"))
    assert stopped.value.code == STOP_STATUS
    run = tmp_path / "run"
    assert [row["id"] for row in _read(run, "direct", "heldout")] == ["test_0", "test_1", "test_2", "test_3"]
    line = [x for x in capsys.readouterr().err.splitlines() if "stopped by SIGTERM" in x]
    assert len(line) == 1 and f"resume: simsearch eval {run / 'recipe.yaml'}" in line[0]

    resumed = ScriptedPolicy(tokenizer, golds)
    _install_policy(monkeypatch, resumed, tokenizer)
    summary = evaluate.main(_recipe(tmp_path, paths, "baselines=[direct]"))
    assert summary["rows"]["direct"]["results"]["heldout"]["questions"] == 5
    assert [row["id"] for row in _read(run, "direct", "heldout")] == [f"test_{i}" for i in range(5)]


def test_resume_refuses_results_of_another_recipe(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    _install_policy(monkeypatch, ScriptedPolicy(tokenizer, _golds(paths, "test")), tokenizer)
    evaluate.main(_recipe(tmp_path, paths))
    builds = []
    monkeypatch.setattr(evaluate, "build_generation_engine", lambda cfg, **_: builds.append(cfg))
    with pytest.raises(RecipeError, match=r"bm25/heldout.jsonl holds results of a different recipe"):
        evaluate.main(_recipe(tmp_path, paths, "sampling.max_new_tokens=32"))
    assert builds == []  # refused before loading the policy


# --------------------------------------------------------------------------- errors


def test_row_without_golden_answers_names_file_and_line(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    policy = ScriptedPolicy(tokenizer, {})
    _install_policy(monkeypatch, policy, tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "question": "q?", "golden_answers": ["x"]}\n{"id": "b", "question": "r?", "golden_answers": []}\n'
    )
    with pytest.raises(QADataError, match=r"bad.jsonl: line 2: .*no golden answers"):
        evaluate.main(_recipe(tmp_path, paths, f"datasets=[{{name: bad, path: {bad}}}]"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(QADataError, match=r"empty.jsonl: the file holds no rows"):
        evaluate.main(_recipe(tmp_path, paths, f"datasets=[{{name: empty, path: {empty}}}]"))
    assert policy.calls == []


def test_unreachable_engine_names_its_url(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    _install_policy(monkeypatch, ScriptedPolicy(tokenizer, _golds(paths, "test")), tokenizer)
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    recipe = _recipe(
        tmp_path,
        paths,
        "engines.remote.kind=http",
        f"engines.remote.url={url}",
        "engines.remote.max_retries=0",
        "engines.remote.timeout_s=2",
    )
    with pytest.raises(ServiceError, match=re.escape(url)):
        evaluate.main(recipe)


def test_engine_named_like_a_baseline_is_refused(world, tmp_path):
    _, paths = world
    with pytest.raises(RecipeError, match=r"engines.rag: 'rag' is the name of a baseline"):
        _recipe(tmp_path, paths, "engines.rag.kind=bm25", f"engines.rag.corpus={paths['corpus']}")


def test_n_above_one_needs_sampling(world, tmp_path):
    _, paths = world
    with pytest.raises(RecipeError, match=r"n=4 with sampling.temperature=0"):
        _recipe(tmp_path, paths, "n=4")


def test_training_run_without_metrics_fails_before_any_work(world, tokenizer, tmp_path, monkeypatch):
    _, paths = world
    policy = ScriptedPolicy(tokenizer, _golds(paths, "test"))
    _install_policy(monkeypatch, policy, tokenizer)
    with pytest.raises(RecipeError, match=r"training_run=.*no such directory"):
        evaluate.main(_recipe(tmp_path, paths, f"training_run={tmp_path / 'nowhere'}"))
    (tmp_path / "untrained").mkdir()
    with pytest.raises(RecipeError, match=r"training_run=.*no metrics.jsonl"):
        evaluate.main(_recipe(tmp_path, paths, f"training_run={tmp_path / 'untrained'}"))
    assert policy.calls == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "reason", "finish"),
    [
        ("<answer> paris </answer>", "stop", "answer"),
        ("<think> I do not know </think>", "stop", "gave_up"),  # stopped with no answer: a give-up
        ("<think> long", "length", "length"),
    ],
)
def test_rag_sample_finishes(text: str, reason: str, finish: str) -> None:
    sample = rag._rag_sample(Completion([1, 2], text, reason, None))  # type: ignore[arg-type]
    assert sample["finish"] == finish and sample["num_invalid"] == int(finish != "answer")
