"""No function of `simsearch/` or `benchmarks/` is over 60 lines, from `def` to its last line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(path for folder in ("simsearch", "benchmarks") for path in (ROOT / folder).rglob("*.py"))
MAX_FUNCTION_LINES = 60


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function, method or nested function in `source` over `limit` lines."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_over_60_lines(path: Path) -> None:
    found = long_functions(path.read_text(encoding="utf-8"))
    assert not found, "split into named helpers:\n" + "\n".join(
        f"{path.relative_to(ROOT)}:{line}: {name} is {length} lines" for name, line, length in found
    )


def test_the_detector_counts_from_def_to_the_last_line() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(59))
    assert long_functions(f"class C:\n    @staticmethod\n    def ok():\n{body}") == []  # 60 lines with its def
    assert long_functions(f"class C:\n    async def m(self):\n{body}        y = 1\n") == [("m", 2, 61)]
