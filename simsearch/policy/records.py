"""What a training step records beside its losses: search usage summed over processes, sampled trajectories."""

from __future__ import annotations

from typing import Any

import torch

from simsearch.eval import report
from simsearch.retrieval.accounting import COUNTERS, EngineUsage, Ledger
from simsearch.training.distributed import all_reduce_sum
from simsearch.types import Trajectory


def search_usage(ledger: Ledger, run_usage: dict[str, EngineUsage], world: int) -> dict[str, float]:
    """This step's search counts summed over processes (added to `run_usage`), as metrics.

    Latency percentiles are this process's: histograms of different buckets are not reduced.
    """
    window = ledger.take_window()
    names = sorted(window)
    if world > 1:
        flat = torch.tensor([float(getattr(window[n], c)) for n in names for c in COUNTERS], dtype=torch.float64)
        summed = iter(all_reduce_sum(flat, world).tolist())
        for name in names:
            for counter in COUNTERS:
                value = next(summed)
                setattr(window[name], counter, value if counter == "simulator_s" else round(value))
    out: dict[str, float] = {}
    for name in names:
        out.update(window[name].metrics(name))
        usage = window[name]
        run_usage.setdefault(name, EngineUsage(usage.kind, usage.price_per_1k_queries, usage.gpu_hour_price))
        run_usage[name].merge(usage)
    return out


def trajectory_rows(
    trajectories: list[Trajectory], rewards: list[float], p_noise: float, *, samples: int, group_size: int,
    normalization: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """The first `samples` trajectories of this process's step, group by group.

    Rows hold the question, gold answers, group and sample index, reward, p_noise, and what
    `eval.report.trajectory_sample` keeps of an evaluation sample (turns with queries and
    documents, answer), with the answer's scores under the reward's `normalization`.
    """
    rows = []
    for index, trajectory in enumerate(trajectories[:samples]):
        example = trajectory.example
        sample = report.trajectory_sample(trajectory)
        sample["scores"] = report.score_answer(trajectory.answer, example.golden_answers, normalization=normalization)
        rows.append(
            {
                "id": example.id,
                "question": example.question,
                "golden_answers": list(example.golden_answers),
                "data_source": example.data_source,
                "group": trajectory.prompt_id,
                "sample": index % group_size,
                "reward": float(rewards[index]),
                "p_noise": p_noise,
                **sample,
            }
        )
    return rows
