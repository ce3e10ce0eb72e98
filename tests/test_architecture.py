"""docs/make_architecture.py --check: the layer rules hold, and it finds an import circle when there is one."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("make_architecture", ROOT / "docs" / "make_architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_circles_finds_each_loop_of_imports_and_nothing_else() -> None:
    graph = {"a": {"b": False}, "b": {"c": True}, "c": {"a": False}, "d": {"a": False}, "e": {"f": False}, "f": {}}
    assert _script().circles(graph) == [["a", "b", "c"]]


def test_config_importing_the_factory_runs_back_up() -> None:
    script = _script()
    assert script.breaks_rule("config", "factory") and not script.breaks_rule("factory", "config")
    assert script.breaks_rule("policy", "config") and not script.breaks_rule("config", "policy")


def test_simsearch_keeps_the_layer_rules_and_has_no_import_circle(capsys) -> None:
    assert _script().check() == 0, capsys.readouterr().out
