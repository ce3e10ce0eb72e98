"""Security defaults: loopback binds, bearer tokens, secrets kept out of sight, no pickle, no shell.

- Servers bind 127.0.0.1 unless a recipe says otherwise, and `simsearch serve` warns when it does.
- `/retrieve` can require a bearer token, read from the environment, never echoed.
- API keys come only from environment variables (recipes hold variable names), and appear in no
  repr, error message, traceback, log record or run directory, whatever a server answers.
- Trainer state is loaded without executing pickled code; a crafted pickle is refused.
- No module of the package builds a shell command or evaluates strings.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import traceback
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from simsearch import config
from simsearch.commands import serve
from simsearch.config import EvalRecipe, ServeRecipe, load_recipe, save_recipe
from simsearch.errors import RecipeError, ServiceError
from simsearch.generation.openai import OpenAIEngine
from simsearch.retrieval.http import HTTPSearchEngine
from simsearch.retrieval.server import create_app
from simsearch.retrieval.web import SerpAPISearchEngine, SerperSearchEngine
from simsearch.training.checkpoint import STATE_FILE, CheckpointError, load_state, save_checkpoint
from simsearch.types import Document, SamplingParams, SearchRequest
from tests.servers import FakeServer, Seen

PACKAGE = Path(__file__).resolve().parents[2] / "simsearch"
SECRET = "sk-live-0123456789abcdef-SECRET"
KEY_ENV = "SIMSEARCH_TEST_SECRET_KEY"


# --------------------------------------------------------------------------- binds


class EchoEngine:
    def search(self, requests: list[SearchRequest]) -> list[list[Document]]:
        return [[Document("t", r.query)] for r in requests]


def test_recipes_bind_loopback_by_default() -> None:
    assert ServeRecipe().host == "127.0.0.1"
    assert load_recipe(ServeRecipe, None, ["search.corpus=c.jsonl"]).host == "127.0.0.1"


@pytest.fixture
def served(monkeypatch):
    """Runs `serve.main` without a network: captures the app and the host instead."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr(serve, "build_search_engine", lambda cfg: EchoEngine())
    monkeypatch.setattr(serve.preflight, "check_paths", lambda recipe: None)  # no corpus: the engine is echo
    monkeypatch.setattr(serve, "check_port", lambda host, port: None)  # nothing binds: uvicorn.run is captured
    monkeypatch.setattr(
        serve.uvicorn, "run", lambda app, host, port, **_: captured.update(app=app, host=host, port=port)
    )
    return captured


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.org"])
def test_serve_warns_when_bound_beyond_loopback(served, host: str) -> None:
    recipe = load_recipe(ServeRecipe, None, ["search.corpus=c.jsonl", f"host='{host}'"])
    with pytest.warns(UserWarning, match=f"serving on {host}: reachable from other machines; set token_env"):
        serve.main(recipe)
    assert served["host"] == host


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_serve_is_quiet_on_loopback(served, host: str) -> None:
    recipe = load_recipe(ServeRecipe, None, ["search.corpus=c.jsonl", f"host='{host}'"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        serve.main(recipe)
    assert served["host"] == host


def test_serve_with_a_token_from_the_environment_requires_it(served, monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    recipe = load_recipe(ServeRecipe, None, ["search.corpus=c.jsonl", "host=0.0.0.0", f"token_env={KEY_ENV}"])
    with pytest.warns(UserWarning) as record:
        serve.main(recipe)
    assert "token_env" not in str(record[0].message)  # a token is set: no advice to set one
    with TestClient(served["app"]) as client:
        body = {"queries": ["q"]}
        denied = client.post("/retrieve", json=body)
        wrong = client.post("/retrieve", json=body, headers={"Authorization": f"Bearer {SECRET[:-1]}"})
        lower = client.post("/retrieve", json=body, headers={"Authorization": f"bearer{SECRET}"})
        oversize = client.post("/retrieve", content=b"x" * 2_000_000)  # refused before its size is judged
        allowed = client.post("/retrieve", json=body, headers={"Authorization": f"Bearer {SECRET}"})
        health = client.get("/health")
    assert [r.status_code for r in (denied, wrong, lower, oversize, allowed)] == [401, 401, 401, 401, 200]
    assert health.status_code == 200
    assert all(SECRET not in r.text for r in (denied, wrong, lower, oversize, allowed, health))


def test_serve_token_variable_unset_is_a_recipe_error_naming_the_variable(served, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    recipe = load_recipe(ServeRecipe, None, ["search.corpus=c.jsonl", f"token_env={KEY_ENV}"])
    with pytest.raises(RecipeError, match=KEY_ENV):
        serve.main(recipe)
    assert "app" not in served


# --------------------------------------------------------------------------- secrets


def echo_server(reply: Callable[[str], tuple[int, bytes]]) -> FakeServer:
    """A local server answering every request with `reply(credentials)`, where `credentials` is
    every place a client could have put its key (Authorization, X-API-KEY, the query string)."""

    def answer(seen: Seen) -> tuple[int, bytes, dict[str, str]]:
        query = "&".join(f"{k}={v}" for k, values in seen.query.items() for v in values)
        credentials = " ".join([seen.headers.get("authorization", ""), seen.headers.get("x-api-key", ""), query])
        status, body = reply(credentials)
        return status, body, {"Content-Type": "application/json"}

    return FakeServer(answer)


REPLIES: dict[str, Callable[[str], tuple[int, bytes]]] = {
    "401 echo": lambda c: (401, f'{{"error": "invalid key {c}"}}'.encode()),
    "500 echo": lambda c: (500, f'{{"error": "upstream failed for {c}"}}'.encode()),
    "200 not json": lambda c: (200, f"<html>{c}</html>".encode()),
    # The secret straddles the 300th character, where error messages cut a quoted body.
    "500 echo at the cut": lambda c: (500, ("x" * (290 - c.index(SECRET)) + c).encode()),
    # A JSON object with the credentials where each client expects its results.
    "200 wrong shape": lambda c: (
        200,
        (
            f'{{"error": "key {c}", "organic": "{c}", "organic_results": "{c}", "result": "{c}", "choices": "{c}"}}'
        ).encode(),
    ),
    "200 wrong items": lambda c: (
        200,
        (
            f'{{"organic": [{{"snippet": "{c}"}}], "organic_results": [{{"snippet": "{c}"}}], '
            f'"result": [["{c}"]], "choices": [{{"index": 0, "text": "{c}", "finish_reason": "{c}"}}]}}'
        ).encode(),
    ),
}

CLIENTS: dict[str, Callable[[str], Any]] = {
    "openai": lambda url: OpenAIEngine([url], "m", api_key_env=KEY_ENV, max_retries=1, backoff_s=0.001, timeout_s=2),
    "serper": lambda url: SerperSearchEngine(
        api_key_env=KEY_ENV, base_url=url, max_retries=1, backoff_s=0.001, timeout_s=2
    ),
    "serpapi": lambda url: SerpAPISearchEngine(
        api_key_env=KEY_ENV, base_url=url, max_retries=1, backoff_s=0.001, timeout_s=2
    ),
    "http": lambda url: HTTPSearchEngine(
        f"{url}/retrieve", api_key_env=KEY_ENV, max_retries=1, backoff_s=0.001, timeout_s=2
    ),
}


def call(client: Any) -> Any:
    if isinstance(client, OpenAIEngine):
        return client.generate(["a prompt"], SamplingParams(max_new_tokens=4))
    return client.search([SearchRequest("a query", top_k=1)])


def everything_said_about(err: BaseException, client: Any, caplog) -> str:
    return "\n".join(
        [
            str(err),
            repr(err),
            "".join(traceback.format_exception(err)),
            repr(client),
            str(client),
            caplog.text,
            *(r.getMessage() for r in caplog.records),
        ]
    )


@pytest.mark.parametrize("reply", list(REPLIES))
@pytest.mark.parametrize("kind", list(CLIENTS))
def test_api_keys_never_reach_errors_reprs_or_logs_whatever_the_server_says(
    kind: str, reply: str, monkeypatch, caplog
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log every request at INFO / DEBUG
    server = echo_server(REPLIES[reply])
    try:
        client = CLIENTS[kind](server.url)
        with pytest.raises(ServiceError) as info:
            call(client)
    finally:
        server.stop()
    said = everything_said_about(info.value, client, caplog)
    assert SECRET in "".join(REPLIES[reply](SECRET)[1].decode())  # the server did echo it ...
    assert SECRET not in said, said  # ... and none of it reached the user
    assert server.url in str(info.value)


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_api_keys_never_reach_the_error_of_a_dead_server(kind: str, monkeypatch, caplog) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG)
    server = echo_server(REPLIES["500 echo"])
    url = server.url
    server.stop()  # nothing listens there now
    client = CLIENTS[kind](url)
    with pytest.raises(ServiceError) as info:
        call(client)
    assert SECRET not in everything_said_about(info.value, client, caplog)


@pytest.mark.parametrize("kind", list(CLIENTS))
def test_an_unset_key_variable_is_named_and_no_request_is_sent(kind: str, monkeypatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=KEY_ENV):
        CLIENTS[kind]("http://127.0.0.1:9")


def test_http_client_sends_its_key_as_a_bearer_token_our_server_accepts(monkeypatch) -> None:
    from tests.servers import serve_in_thread

    monkeypatch.setenv(KEY_ENV, SECRET)
    with serve_in_thread(create_app(EchoEngine(), token=SECRET)) as url:
        with_key = HTTPSearchEngine(f"{url}/retrieve", api_key_env=KEY_ENV).search([SearchRequest("q", top_k=1)])
        with pytest.raises(ServiceError, match="HTTP 401") as info:
            HTTPSearchEngine(f"{url}/retrieve", max_retries=0).search([SearchRequest("q", top_k=1)])
    assert with_key[0][0].text == "q"
    assert SECRET not in str(info.value)


def _fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        found.append((prefix + f.name, hints[f.name]))
        for arg in (hints[f.name], *typing.get_args(hints[f.name])):
            if dataclasses.is_dataclass(arg):
                found.extend(_fields(arg, f"{prefix}{f.name}."))
    return found


def test_no_recipe_field_can_hold_a_secret_only_the_name_of_a_variable() -> None:
    schemas = [getattr(config, name) for name in dir(config) if name.endswith("Recipe")]
    names = [name for schema in schemas for name, _ in _fields(schema)]
    assert "search.api_key_env" in names and "token_env" in names  # the walk reaches them
    secretive = [n for n in names if {"key", "token", "secret", "password"} & set(n.rsplit(".", 1)[-1].split("_"))]
    assert secretive and all(n.endswith("_env") for n in secretive), secretive


def test_the_run_directory_holds_variable_names_not_keys(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    recipe = load_recipe(
        EvalRecipe,
        None,
        [
            f"run_dir={tmp_path}",
            "datasets=[{name: q, path: q.jsonl}]",
            "policy.kind=openai",
            "policy.model.path=tokenizer",
            "policy.base_urls=[http://127.0.0.1:1]",
            f"policy.api_key_env={KEY_ENV}",
            f"engines={{google: {{kind: serper, api_key_env: {KEY_ENV}, cache: google.sqlite}}}}",
        ],
    )
    saved = save_recipe(recipe, tmp_path).read_text()
    assert KEY_ENV in saved and SECRET not in saved


# --------------------------------------------------------------------------- checkpoints


class RunsCode:
    """Pickles as a call to `os.mkdir(marker)`: what a malicious trainer_state.pt would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


class FakeModel:
    def save_pretrained(self, path: Path, safe_serialization: bool = True) -> None:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"w")


class FakeTokenizer:
    def save_pretrained(self, path: Path) -> None:
        (path / "tokenizer.json").write_text("{}")


def test_a_trainer_state_that_would_run_code_is_refused(tmp_path: Path) -> None:
    checkpoint = save_checkpoint(tmp_path, 1, model=FakeModel(), tokenizer=FakeTokenizer(), state={"x": 1})
    marker = tmp_path / "code-ran"
    torch.save({"optimizer": {}, "step": 1, "payload": RunsCode(marker)}, checkpoint / STATE_FILE)

    with pytest.raises(CheckpointError, match=f"{STATE_FILE}: refused") as info:
        load_state(checkpoint)
    assert not marker.exists()
    assert "weights_only=False" not in str(info.value)  # no advice to load it unsafely

    # The file really is malicious: an unsafe load runs its code.
    torch.load(checkpoint / STATE_FILE, weights_only=False)
    assert marker.is_dir()


def test_a_corrupt_trainer_state_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    checkpoint = save_checkpoint(tmp_path, 1, model=FakeModel(), tokenizer=FakeTokenizer(), state={"x": 1})
    data = (checkpoint / STATE_FILE).read_bytes()
    (checkpoint / STATE_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE}: cannot be read .* delete .*step_0000001"):
        load_state(checkpoint)


# --------------------------------------------------------------------------- no shell, no eval

DANGEROUS_CALLS = {
    "os.system": "runs a shell command",
    "os.popen": "runs a shell command",
    "eval": "evaluates a string as code",
    "exec": "executes a string as code",
    "pickle.load": "unpickles (runs code)",
    "pickle.loads": "unpickles (runs code)",
    "yaml.load": "may construct arbitrary objects; use yaml.safe_load or OmegaConf",
    "yaml.unsafe_load": "constructs arbitrary objects",
    "marshal.loads": "loads code objects",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def dangerous_calls(source: str) -> list[str]:
    """Every call in `source` that runs a shell, evaluates strings, unpickles or trusts remote code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        if name in DANGEROUS_CALLS:
            found.append(f"line {node.lineno}: {name} {DANGEROUS_CALLS[name]}")
        shell = keywords.get("shell")
        if shell is not None and not (isinstance(shell, ast.Constant) and shell.value is False):
            found.append(f"line {node.lineno}: {name}(shell=...) runs a shell command")
        if name.startswith("subprocess.") and node.args and not isinstance(node.args[0], (ast.List, ast.Tuple)):
            found.append(f"line {node.lineno}: {name} with a command that is not an argument list")
        remote = keywords.get("trust_remote_code")
        if remote is not None and not (isinstance(remote, ast.Constant) and remote.value is False):
            found.append(f"line {node.lineno}: trust_remote_code runs code from the model repository")
        if name == "torch.load":
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"line {node.lineno}: torch.load without weights_only=True unpickles code")
        if name.endswith("np.load") or name == "numpy.load":
            pickle = keywords.get("allow_pickle")
            if pickle is not None and not (isinstance(pickle, ast.Constant) and pickle.value is False):
                found.append(f"line {node.lineno}: np.load(allow_pickle=...) unpickles code")
    return found


def test_the_checker_finds_what_it_looks_for() -> None:
    bad = (
        "import os, subprocess, torch\n"
        "os.system('rm -rf ' + path)\n"
        "subprocess.run(cmd, shell=True)\n"
        "subprocess.check_output('ls ' + d)\n"
        "torch.load(f)\n"
        "eval(text)\n"
        "AutoModel.from_pretrained(p, trust_remote_code=True)\n"
    )
    assert len(dangerous_calls(bad)) == 7
    good = "import subprocess, torch\nsubprocess.run(['ls', d], check=True)\ntorch.load(f, weights_only=True)\n"
    assert dangerous_calls(good) == []


def test_the_package_builds_no_shell_strings_and_unpickles_nothing() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        problems += [f"{path.relative_to(PACKAGE.parent)}: {p}" for p in dangerous_calls(path.read_text())]
    assert problems == []
