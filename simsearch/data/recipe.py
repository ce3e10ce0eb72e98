"""The data sections of a recipe: the QA files a command reads."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from simsearch.checks import setting


@dataclass
class DataConfig:
    """QA data for training or collection."""

    train: list[str] = setting(default_factory=list, help="FlashRAG JSONL/Parquet or verl Parquet files")
    val: list[str] = setting(default_factory=list, help="held-out files for validation")
    val_size: int = setting(0, "validation questions per file; 0 = all")


@dataclass
class EvalDataset:
    """One QA set to evaluate on."""

    name: str = setting(MISSING, "column name in the tables (nq, hotpotqa, ...)")
    path: str = setting(
        MISSING,
        "local file (FlashRAG JSONL/Parquet or verl Parquet), or a FlashRAG folder with `split`",
    )
    split: str | None = setting(None, "for a folder: which file to read (test -> test.jsonl|json|parquet)")
    limit: int = setting(0, "first N questions only (0 = all)")
