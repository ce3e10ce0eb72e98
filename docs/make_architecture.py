"""Draws docs/architecture.png: simsearch's layers and the real import graph between its packages.

    python docs/make_architecture.py            # writes docs/architecture.png
    python docs/make_architecture.py --check    # prints imports against the rules and import circles; exit 1 if any

Every `import` / `from ... import` in simsearch/ (function-level ones included, `TYPE_CHECKING` ones
too) is read with `ast`, so the picture shows the code as it is, not as intended. An arrow goes
from the importing package to the imported one; a red arrow is an import against the rules of
docs/architecture.md (upward or sideways across a floor, or a library importing an entry point).
`--check` names each such import file by file, and each circle of files that import each other.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "simsearch"

# Floors, top to bottom: a package may import packages on lower floors only (plus itself).
LAYERS: list[list[str]] = [
    ["cli"],
    ["experiments"],
    ["commands"],
    ["factory"],
    ["config"],
    ["simulator", "policy", "tinyworld", "integrations"],
    ["generation", "retrieval", "training"],
    ["models", "curriculum", "data"],
    ["eval"],
    ["types"],
]
# Shared by every floor (no simsearch imports of their own besides `errors`); drawn at the side.
UTILITIES = ["errors", "httpclient", "fingerprints", "checks"]
# Only the entry points (cli, experiments, commands) may import an entry point, and only one on a lower
# floor: cli -> experiments -> commands, never back up (no library, and no command, imports the
# experiments). They and the factory (recipe sections -> objects, for the entry points) read whole
# recipes: `config` sits on the floor below them and above the libraries, whose recipe sections it composes.
ENTRY = {"cli", "experiments", "commands"}
RECIPE_READERS = ENTRY | {"factory", "config"}


def unit_of(module: str) -> str | None:
    """`simsearch.retrieval.bm25` -> `retrieval`; `simsearch.types` -> `types`; else None."""
    parts = module.split(".")
    if parts[0] != "simsearch" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks (imports for annotations only)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    return inside


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(absolute name, type-only) of the simsearch modules `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = _type_only_nodes(tree)
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        typing = id(node) in type_only
        if isinstance(node, ast.Import):
            found += [(alias.name, typing) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.append((module, typing))
            # `from simsearch import config` names a module, not a symbol.
            found += [(f"{module}.{alias.name}", typing) for alias in node.names if module == "simsearch"]
    return [(name, typing) for name, typing in found if name.startswith("simsearch.")]


def import_graph() -> tuple[Counter[tuple[str, str]], set[tuple[str, str]]]:
    """(importer unit, imported unit) -> number of import statements across all of simsearch/,
    and the pairs whose every import is for annotations only (`if TYPE_CHECKING:`)."""
    edges: Counter[tuple[str, str]] = Counter()
    runtime: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(module_name(path))
        for name, typing in imports_of(path):
            target = unit_of(name)
            if source and target and source != target:
                edges[(source, target)] += 1
                if not typing:
                    runtime.add((source, target))
    return edges, set(edges) - runtime


def file_graph() -> dict[str, dict[str, bool]]:
    """Module -> {imported simsearch module: every such import is for annotations only}.

    A name imported from a package is the submodule when there is one (`from simsearch.commands
    import train` -> `simsearch.commands.train`), else the package's `__init__`.
    """
    files = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, dict[str, bool]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        type_only = _type_only_nodes(tree)
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        arrows: dict[str, bool] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                package = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [f"{package}.{alias.name}" for alias in node.names]
                names = [name if name in files else package for name in names]
            else:
                continue
            for name in names:
                while name and name not in files:  # `import simsearch.a.b` may name a symbol's module
                    name = name.rpartition(".")[0]
                if name.startswith("simsearch") and name != module:
                    arrows[name] = arrows.get(name, True) and id(node) in type_only
        graph[module] = arrows
    return graph


def circles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The groups of modules that import each other in a loop (strongly connected, two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is a few hundred modules
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.get(module, {}):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def floor(unit: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    return None


def breaks_rule(source: str, target: str, type_only: bool = False) -> bool:
    """True when `source` importing `target` goes against the layer rules."""
    if target in ENTRY:
        src_floor, dst_floor = floor(source), floor(target)
        return source not in ENTRY or src_floor is None or dst_floor is None or dst_floor <= src_floor
    if target in UTILITIES:
        return False
    if source in UTILITIES:
        return target not in UTILITIES
    src, dst = floor(source), floor(target)
    if src is None or dst is None:
        return source != "cli"  # a unit the picture does not know
    if type_only and dst == src:
        return False  # a type named in an annotation, across the floor: no runtime dependency
    return dst <= src


def positions() -> dict[str, tuple[float, float]]:
    pos: dict[str, tuple[float, float]] = {}
    for i, layer in enumerate(LAYERS):
        y = len(LAYERS) - 1 - i
        for j, unit in enumerate(layer):
            pos[unit] = ((j + 0.5) / len(layer) * 6.0, y * 1.0)
    for k, unit in enumerate(UTILITIES):
        pos[unit] = (7.4, 2.6 - k * 0.8)
    return pos


def draw(edges: Counter[tuple[str, str]], type_only: set[tuple[str, str]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = positions()
    fig, ax = plt.subplots(figsize=(11, 7.5), dpi=110)
    for i in range(len(LAYERS)):
        y = len(LAYERS) - 1 - i
        ax.axhspan(y - 0.42, y + 0.42, xmin=0.0, xmax=6.6 / 8.6, color="#f2f2f2" if i % 2 else "#e6eef7", zorder=0)
        ax.text(-0.55, y, f"floor {i}", ha="right", va="center", fontsize=9, color="#555555")
    ax.text(7.4, 3.15, "shared utilities", ha="center", fontsize=8, color="#555555")
    for (source, target), count in sorted(edges.items()):
        if source not in pos or target not in pos:
            continue
        bad = breaks_rule(source, target, (source, target) in type_only)
        (x0, y0), (x1, y1) = pos[source], pos[target]
        if target in UTILITIES and not bad:
            continue  # everyone may use the utilities; drawing those arrows would hide the rest
        ax.annotate(
            "",
            xy=(x1, y1),
            xytext=(x0, y0),
            arrowprops={
                "arrowstyle": "-|>",
                "color": "#d62728" if bad else "#7f7f7f",
                "lw": 2.2 if bad else 0.6 + 0.25 * min(count, 6),
                "alpha": 0.95 if bad else 0.55,
                "shrinkA": 16,
                "shrinkB": 16,
                "connectionstyle": "arc3,rad=0.08",
                "linestyle": "--" if (source, target) in type_only else "-",
            },
            zorder=1,
        )
    for unit, (x, y) in pos.items():
        entry = unit in RECIPE_READERS
        ax.text(
            x,
            y,
            unit,
            ha="center",
            va="center",
            fontsize=11,
            zorder=3,
            bbox={"boxstyle": "round,pad=0.4", "fc": "#fff4d6" if entry else "white", "ec": "#333333"},
        )
    bad_edges = [edge for edge in edges if breaks_rule(*edge, edge in type_only)]
    title = "simsearch packages by floor. Arrow: an import (grey: allowed; red: against the rules; dashed: types only)"
    ax.set_title(title, fontsize=11)
    ax.text(
        0.0,
        -0.85,
        f"{sum(edges.values())} cross-package imports; {len(bad_edges)} package pairs against the rules"
        + (": " + ", ".join(f"{s} -> {t}" for s, t in sorted(bad_edges)) if bad_edges else ""),
        fontsize=8,
        color="#d62728" if bad_edges else "#2ca02c",
        wrap=True,
    )
    ax.set_xlim(-1.4, 8.4)
    ax.set_ylim(-1.1, len(LAYERS) - 0.4)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def check() -> int:
    """Prints every file-level import against the layer rules, and every import circle; 1 if any."""
    graph = file_graph()
    wrong = 0
    for module, arrows in sorted(graph.items()):
        for target, annotations_only in sorted(arrows.items()):
            source_unit, target_unit = unit_of(module), unit_of(target)
            if not source_unit or not target_unit or source_unit == target_unit:
                continue
            if breaks_rule(source_unit, target_unit, annotations_only):
                src, dst = floor(source_unit), floor(target_unit)
                how = "runs back up" if src is not None and dst is not None and dst < src else "against the rules"
                print(f"{module} -> {target}: {how} ({source_unit} -> {target_unit})")
                wrong += 1
    loops = circles(graph)
    for group in loops:
        ties = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
        print(f"circle of {len(group)} modules: {', '.join(group)} ({'; '.join(ties)})")
    return 1 if wrong or loops else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="print imports against the rules; exit 1 if any")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "architecture.png")
    args = parser.parse_args(argv)
    edges, type_only = import_graph()
    bad = sorted(edge for edge in edges if breaks_rule(*edge, edge in type_only))
    if args.check:
        return check()
    draw(edges, type_only, args.out)
    print(f"wrote {args.out}; {len(bad)} package pairs against the rules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
