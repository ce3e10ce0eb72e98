"""simsearch's verl tool on the real verl package, called as verl's tool agent loop calls it, against
`simsearch serve` with a tiny simulator: p_noise follows the schedule by the step verl's rollout
tracing holds, and the ZeroSearch-style preset receives each row's question and answers.

verl pins transformers < 5.11, so it is installed without its dependencies into a side directory
that this test appends to sys.path (`SIMSEARCH_VERL_PATH`, default `verl-side/` in the virtual
environment's folder, which git ignores):

    pip install --no-deps --target "$VIRTUAL_ENV/verl-side" verl==0.9.1 ray==2.60.0 tensordict==0.10.0 \
        hydra-core==1.3.2 antlr4-python3-runtime==4.9.3 codetiming orjson cachetools pyvers requests \
        urllib3 jsonschema jsonschema-specifications referencing rpds-py attrs

Without them the test skips, saying which import failed (fails, where SIMSEARCH_REQUIRE_VERL=1, as in CI).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from simsearch.commands import serve
from simsearch.config import ServeRecipe, load_recipe
from simsearch.curriculum.schedules import exponential
from simsearch.integrations.verl_data import write_verl_parquet
from simsearch.models import build_tiny_model, save_tiny, train_tokenizer
from simsearch.retrieval.accounting import Ledger
from simsearch.simulator.engine import SimulatedSearchEngine
from simsearch.types import QAExample
from tests.servers import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(os.environ.get("SIMSEARCH_VERL_PATH", Path(sys.prefix) / "verl-side"))
TOOL_CONFIG = ROOT / "integrations" / "verl" / "search_tool.yaml"
CURVE = {"p_start": 0.1, "p_end": 0.5, "total_steps": 10, "base": 4.0}


def _verl() -> SimpleNamespace:
    """verl's modules this test drives, from the side directory; skips with the reason when absent."""
    if str(SIDE) not in sys.path:
        sys.path.append(str(SIDE))  # last: the project's own packages win
    names = {
        "loop": "verl.experimental.agent_loop.tool_agent_loop",
        "parser": "verl.experimental.agent_loop.tool_parser",
        "registry": "verl.tools.tool_registry",
        "dataset": "verl.utils.dataset.rl_dataset",
        "trace": "verl.utils.rollout_trace",
    }
    try:
        return SimpleNamespace(**{key: importlib.import_module(name) for key, name in names.items()})
    except ImportError as err:
        reason = f"verl is not importable from {SIDE} ({err}); install it there as this module's docstring says"
        if os.environ.get("SIMSEARCH_REQUIRE_VERL") == "1":  # CI installs it: a failure there must not skip
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def simulator_dir(tmp_path_factory) -> Path:
    tokenizer = train_tokenizer(["Doc 1 (Title: Paris) Paris is the capital of France."] * 20, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64)
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("simulator"))


def _recipe(simulator_dir: Path) -> ServeRecipe:
    overrides = [
        "search.kind=simulator",
        "search.top_k=2",
        "search.simulator.preset=zerosearch-prompt",  # needs each query's question and gold answer
        "search.simulator.max_new_tokens=4",
        "search.simulator.generation.kind=hf",
        f"search.simulator.generation.model.path={simulator_dir}",
        "curriculum.kind=exponential",
        *(f"curriculum.{key}={value}" for key, value in CURVE.items()),
    ]
    return load_recipe(ServeRecipe, None, overrides)


def _rows(verl: SimpleNamespace, tmp_path: Path, monkeypatch) -> list[dict]:
    """Our export read back by verl's own dataset class, as its trainer reads it."""
    examples = [QAExample("0", "Where was Ada Vance born?", ["Lyon"], "nq"), QAExample("1", "Who?", ["Bo"], "x")]
    write_verl_parquet(examples, tmp_path / "train.parquet", split="train")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    config = {"cache_dir": str(tmp_path / "cache"), "filter_overlong_prompts": False}
    dataset = verl.dataset.RLHFDataset(str(tmp_path / "train.parquet"), tokenizer=None, config=config)
    return [dataset[i] for i in range(len(dataset))]


def _tool(verl: SimpleNamespace, url: str, tmp_path: Path):
    """The shipped tool config, pointed at `url`, loaded by verl's tool registry."""
    config = tmp_path / "tools.yaml"
    config.write_text(TOOL_CONFIG.read_text().replace("http://127.0.0.1:8000/retrieve", f"{url}/retrieve"))
    (tool,) = verl.registry.initialize_tools_from_config(str(config))
    return tool


async def _call(verl: SimpleNamespace, tool, query: str, tools_kwargs: dict, step: int | None):
    """One tool call through verl's `ToolAgentLoop._call_tool` (create, execute, release), inside the
    rollout-trace attributes verl sets around each trajectory of training step `step`."""
    loop = SimpleNamespace(tools={"search": tool}, max_tool_response_length=4096, tool_response_truncate_side="middle")
    agent_data = SimpleNamespace(tools_kwargs=tools_kwargs)
    call = verl.parser.FunctionCall(name="search", arguments=json.dumps({"query": query}))
    with verl.trace.rollout_trace_attr(step=step, sample_index=0, rollout_n=0):
        return await verl.loop.ToolAgentLoop._call_tool(loop, call, tools_kwargs, agent_data)


@pytest.mark.slow  # ~40 s: verl and ray import, a tiny simulator answers over HTTP
def test_verl_tool_sends_the_step_and_the_rows_question_and_answers(simulator_dir, tmp_path, monkeypatch) -> None:
    verl = _verl()
    seen: list[tuple[str | None, list[str], bool, str]] = []  # what the simulator's prompts were built from
    real_prompt = SimulatedSearchEngine._prompt

    def recording_prompt(self, request, *, noisy: bool) -> str:
        seen.append((request.question, request.golden_answers, noisy, real_prompt(self, request, noisy=noisy)))
        return seen[-1][3]

    monkeypatch.setattr(SimulatedSearchEngine, "_prompt", recording_prompt)
    rows = _rows(verl, tmp_path, monkeypatch)
    assert rows[0]["data_source"] == "searchR1_nq" and rows[1]["data_source"] == "x"
    verl.trace.RolloutTraceConfig.init("simsearch", "test", backend="simsearch")  # attributes only, no tracer
    try:
        with serve_in_thread(serve.build_app(_recipe(simulator_dir), Ledger())) as url:
            tool = _tool(verl, url, tmp_path)
            kwargs = rows[0]["tools_kwargs"]
            answers = [asyncio.run(_call(verl, tool, "ada vance birthplace", kwargs, s)) for s in (0, 5, 10)]
            bare = asyncio.run(_call(verl, tool, "ada vance", {}, 5))
    finally:
        verl.trace.RolloutTraceConfig.reset()
    # p_i = 0.1 + (4^(i/10) - 1)/3 * 0.4: 0.1, 0.1 + 0.4/3, 0.5, exactly the schedule function's values.
    assert [metrics for _, _, metrics in answers] == [
        {"p_noise": exponential(s, **CURVE), "step": s} for s in (0, 5, 10)
    ]
    assert answers[1][2]["p_noise"] == pytest.approx(0.1 + 0.4 / 3, abs=1e-12)
    assert all(response.text.startswith("Doc 1(Title: ") for response, _, _ in answers)
    assert seen and all(q == "Where was Ada Vance born?" and a == ["Lyon"] for q, a, _, _ in seen)
    useful = [prompt for _, _, noisy, prompt in seen if not noisy]  # the preset's useful prompt shows both
    assert useful and all("Question: Where was Ada Vance born?\nAnswer: Lyon\n" in prompt for prompt in useful)
    # A row without the question: the server refuses it (422) and verl shows the model why.
    assert "came without 'question' or 'golden_answers'" in bare[0].text
