"""docs/make_architecture.py --check: the layer rules hold, and it finds an import circle when there is one."""

import ast
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


def _imported(path: Path) -> set[str]:
    """The top-level names of the modules `path` imports (absolute imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_library_imports_neither_the_benchmarks_nor_the_tests() -> None:
    wrong = {str(p.relative_to(ROOT)): sorted(_imported(p) & {"benchmarks", "tests"})
             for p in sorted((ROOT / "simsearch").rglob("*.py"))}  # fmt: skip
    assert {path: names for path, names in wrong.items() if names} == {}


def test_the_benchmarks_reach_the_commands_through_the_experiments_only() -> None:
    # They run stages with `simsearch.experiments.stages`, never a command module directly.
    assert _importing(sorted((ROOT / "benchmarks").glob("*.py")), "simsearch.commands") == []


def test_the_benchmarks_are_a_package_that_leaves_sys_path_alone() -> None:
    # They run as `python -m benchmarks.NAME` from the repository root and import each other by name.
    assert (ROOT / "benchmarks" / "__init__.py").is_file()
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    edits = [str(p.relative_to(ROOT)) for p in scripts if "sys.path" in p.read_text(encoding="utf-8")]
    assert edits == []


def test_the_experiments_sit_between_the_cli_and_the_commands() -> None:
    script = _script()
    assert not script.breaks_rule("cli", "experiments") and not script.breaks_rule("experiments", "commands")
    assert script.breaks_rule("commands", "experiments") and script.breaks_rule("experiments", "cli")
    assert script.breaks_rule("commands", "cli")
    for library in ("factory", "config", "tinyworld", "policy", "types"):
        assert script.breaks_rule(library, "experiments"), library


def _imported_modules(path: Path) -> set[str]:
    """Every dotted name `path` imports, function-level imports included: `from a.b import c` gives a.b and a.b.c."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def _importing(paths: list[Path], module: str) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths
            if any(name == module or name.startswith(module + ".") for name in _imported_modules(p))]  # fmt: skip


def test_only_the_cli_and_the_experiments_import_the_experiments() -> None:
    package = ROOT / "simsearch"
    library = [
        p for p in sorted(package.rglob("*.py")) if p.relative_to(package).parts[0] not in ("cli.py", "experiments")
    ]
    assert _importing(library, "simsearch.experiments") == []
    assert _importing([package / "cli.py"], "simsearch.experiments") == ["simsearch/cli.py"]  # the check sees them


def test_the_tiny_world_pipeline_is_imported_from_the_experiments_only() -> None:
    scripts = sorted(p for folder in ("benchmarks", "tests", "docs") for p in (ROOT / folder).rglob("*.py"))
    for gone in ("simsearch.commands.quickstart", "simsearch.commands.release"):
        assert _importing(scripts, gone) == [], gone
    assert not (ROOT / "simsearch" / "commands" / "quickstart.py").exists()
    assert not (ROOT / "simsearch" / "commands" / "release.py").exists()
