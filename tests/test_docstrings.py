"""No file of `simsearch/` cites another repository by file and line, or by commit.

Provenance (which repository, which file and line, which commit) belongs in docs/protocols.md;
the code's docstrings and comments give the contract.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simsearch"

# `core_algos.py:123`, `ray_trainer.py:681-710`, `generation.py:91,137`, `evaluate.sh:64`, `file.py#L12`
FILE_LINE = re.compile(r"(?<![\w{])([\w./-]*[\w-]\.(?:py|sh|ya?ml|json|md|toml|cfg))(?::|#L)\d+")
# github.com/owner/repo/blob/<sha>/path#L12
GITHUB_LINE = re.compile(r"github\.com/\S*#L\d+")
# `owner/repo` followed (within a few characters) by a 7-40 hex commit holding a digit and a letter
REPO_COMMIT = re.compile(
    r"\b[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*\b[`'\")\]]?[\s,:@(`]{1,4}(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
)


def is_own(path: str) -> bool:
    """Whether a cited path names a file of this repository (simsearch's own code may be cited)."""
    return (ROOT / path).is_file() or (PACKAGE / path).is_file()


def foreign_citations(text: str) -> list[str]:
    """The citations of other repositories' files, lines or commits in `text`."""
    found = [m.group(0) for m in FILE_LINE.finditer(text) if not is_own(m.group(1))]
    found += GITHUB_LINE.findall(text)
    found += [m.group(0) for m in REPO_COMMIT.finditer(text)]
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_citation_of_another_repository(path: Path) -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {cite}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for cite in foreign_citations(line)
    ]
    assert not hits, "move provenance to docs/protocols.md:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "text",
    [
        "see `verl/trainer/ppo/ray_trainer.py:681-710`",
        "(their `verl/utils/reward_score/qa_em.py:83-90`)",
        "`llm_agent/generation.py:91,137`",
        "`scripts/nq_hotpotqa/evaluate.sh:64`",
        "core_algos.py#L123",
        "https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py#L40",
        "`TsinghuaC3I/SSRL` `3009f2163497ec3f14508bb5e0c60e82536c13f6`",
        "Alibaba-NLP/ZeroSearch@2d4cdca",
    ],
)
def test_citations_are_caught(text: str) -> None:
    assert foreign_citations(text)


@pytest.mark.parametrize(
    "text",
    [
        'raise DataError(f"{path}:{line_no}: not JSON")',
        "see `simsearch/data/qa.py` and `tinyworld/traces.py`",
        "see `data/qa.py:1`",  # this repository's own file
        "vllm-project/vllm#29341",
        "ratio 1e-6, 0.92M parameters, 10.0.0.1:8000",
        "the simsearch/retrieval cache deadbeef",
    ],
)
def test_own_code_and_plain_text_pass(text: str) -> None:
    assert not foreign_citations(text)
