"""What a run needs besides its paths is checked before any work: each refusal one line, exit 2, nothing written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from simsearch import cli
from simsearch.commands import readiness
from simsearch.errors import DataError, SimsearchError
from tests.servers import dead_url


@pytest.fixture
def eval_args(tmp_path: Path) -> list[str]:
    """An eval recipe whose paths exist (an empty model folder: nothing loads before the checks end)."""
    (tmp_path / "model").mkdir()
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"id": "a", "question": "q?", "golden_answers": ["x"]}\n')
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(
        f"run_dir: {tmp_path / 'run'}\npolicy: {{model: {{path: {tmp_path / 'model'}}}}}\nbaselines: [direct]\n"
        f"datasets: [{{name: qa, path: {qa}}}]\n"
    )
    return ["eval", str(recipe)]


def _corpus(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(f'{{"id": "{i}", "title": "T{i}", "text": "{text}"}}\n' for i, text in enumerate(texts)))
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], run: Path) -> str:
    """The one error line of a refused run; asserts exit 2 and an untouched run directory."""
    code = cli.main(argv)
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("simsearch: error: "), err
    assert not run.exists()
    return err[0]


def test_a_backend_not_installed_is_named_with_its_key_and_fix(
    eval_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readiness, "installed", lambda module: module != "vllm")
    line = _refused([*eval_args, "policy.kind=vllm"], capsys, tmp_path / "run")
    assert "policy.kind=vllm needs vllm, which is not installed here" in line and "policy.kind=hf" in line
    monkeypatch.setattr(readiness, "installed", lambda module: module != "faiss")
    corpus = _corpus(tmp_path / "corpus.jsonl", ["a", "b"])
    dense = ["engines.d.kind=dense", f"engines.d.corpus={corpus}", "engines.d.use_faiss=true"]
    line = _refused([*eval_args, *dense], capsys, tmp_path / "run")
    assert "engines.d.use_faiss=true needs faiss" in line and "engines.d.use_faiss=false" in line


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_gpu_this_machine_lacks_is_refused(
    device: str, eval_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cuda:1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = _refused([*eval_args, f"policy.model.device={device}"], capsys, tmp_path / "run")
    assert f"policy.model.device={device!r}: this machine has " in line and "policy.model.device=cpu" in line
    assert ("1 CUDA device(s)" in line) == (device == "cuda:1")


def test_a_hub_model_with_no_network_is_refused_at_once(
    eval_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub_name = ["policy.model.path=simsearch-tests/no-such-model"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    began = time.perf_counter()
    line = _refused([*eval_args, *hub_name], capsys, tmp_path / "run")
    assert time.perf_counter() - began < 5
    assert "not in the local cache" in line and "(HF_HUB_OFFLINE=1)" in line
    assert "huggingface-cli download simsearch-tests/no-such-model" in line
    # Online in name only: one probe of the hub, refused at once, never retried.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    url = dead_url()
    monkeypatch.setenv("HF_ENDPOINT", url)
    line = _refused([*eval_args, *hub_name], capsys, tmp_path / "run")
    assert f"({url.removeprefix('http://')}: " in line


def test_an_index_built_from_another_corpus_is_refused_before_work(
    eval_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simsearch.data.corpus import JsonlCorpus
    from simsearch.retrieval.bm25 import BM25SearchEngine

    built = _corpus(tmp_path / "a.jsonl", ["alpha beta", "gamma delta"])
    other = _corpus(tmp_path / "b.jsonl", ["alpha beta", "gamma delta", "epsilon"])
    BM25SearchEngine.build(JsonlCorpus(built)).save(tmp_path / "index")
    capsys.readouterr()  # bm25s's progress bars
    engine = ["engines.b.kind=bm25", f"engines.b.index_dir={tmp_path / 'index'}"]
    line = _refused([*eval_args, *engine, f"engines.b.corpus={other}"], capsys, tmp_path / "run")
    assert f"engines.b.index_dir='{tmp_path / 'index'}': the index in" in line and "another corpus" in line
    assert cli.main([*eval_args, *engine, f"engines.b.corpus={built}", "--check"]) == 0
    # the loader's own refusal is a user error too (one line, exit 2), no traceback
    with pytest.raises(DataError, match="another corpus") as refused:
        BM25SearchEngine.load(tmp_path / "index", other)
    assert isinstance(refused.value, SimsearchError)


def test_served_endpoints_are_contacted_before_the_policy_loads(
    eval_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], serve
) -> None:
    dead = dead_url()
    line = _refused([*eval_args, "engines.web.kind=http", f"engines.web.url={dead}/retrieve"], capsys, tmp_path / "run")
    assert f"engines.web.url='{dead}/retrieve': no server answers {dead}/health" in line
    openai = ["policy.kind=openai", f"policy.base_urls=[{dead}]"]
    line = _refused([*eval_args, *openai], capsys, tmp_path / "run")
    assert f"policy.base_urls[0]='{dead}': no server answers {dead}/v1/models" in line
    served = serve(lambda seen: (200, {"data": [{"id": "served-model"}]}, {}))
    asked = ["policy.kind=openai", f"policy.base_urls=[{served.url}/v1]"]
    line = _refused([*eval_args, *asked, "policy.served_model_name=other"], capsys, tmp_path / "run")
    assert "policy.served_model_name='other'" in line and "serves served-model" in line
    assert cli.main([*eval_args, *asked, "policy.served_model_name=served-model", "--check"]) == 0
    assert "can run here" in capsys.readouterr().out and not (tmp_path / "run").exists()


def test_a_web_engine_without_its_key_is_refused(
    eval_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    line = _refused([*eval_args, "engines.google.kind=serper"], capsys, tmp_path / "run")
    assert "engines.google.api_key_env: environment variable SERPER_API_KEY is not set" in line
