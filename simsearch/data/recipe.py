"""The data sections of a recipe: the QA files a command reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class DataConfig:
    """QA data for training or collection."""

    train: list[str] = field(default_factory=list)  # FlashRAG JSONL/Parquet or verl Parquet files
    val: list[str] = field(default_factory=list)  # held-out files for validation
    val_size: int = 0  # validation questions per file; 0 = all


@dataclass
class EvalDataset:
    """One QA set to evaluate on."""

    name: str = MISSING  # column name in the tables (nq, hotpotqa, ...)
    path: str = MISSING  # local file (FlashRAG JSONL/Parquet or verl Parquet), or a FlashRAG folder with `split`
    split: str | None = None  # for a folder: which file to read (test -> test.jsonl|json|parquet)
    limit: int = 0  # first N questions only (0 = all)
