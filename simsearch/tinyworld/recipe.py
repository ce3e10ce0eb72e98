"""The tiny world's recipe section (`tinyworld` of the quickstart): the world's size, the tiny tokenizer,
the base model's pretraining, and the tool-call protocol's own settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simsearch.checks import check_positive, check_range, setting
from simsearch.errors import RecipeError


@dataclass
class TinyWorldConfig:
    """The fictional world, and the tiny base model pretrained on it before the quickstart's stages run."""

    n_entities: int = setting(300, "people in the tiny world RL and evaluation ask about")
    n_train_entities: int = setting(200, "of them, those training questions ask about")
    n_background_entities: int = setting(900, "more people, in the corpus, whose questions pretrain the base LM")
    vocab_size: int = setting(1000, "byte-level BPE of the tiny models")
    drill_steps: int = setting(300, "copy drills (batch 64) before the traces: they form induction heads")
    pretrain_steps: int = setting(
        1600, "base-model pretraining on reading and random-query traces (docs/quickstart-notes.md)"
    )
    pretrain_batch_size: int = setting(32, "traces per pretraining step")
    pretrain_lr: float = setting(
        2e-3, "peak learning rate of the copy drills and the traces (linear warm-up, cosine decay)"
    )
    pretrain_traces: int = setting(
        16000, "traces made for pretraining (pretrain_steps go over them in epochs, each shuffled)"
    )
    copy_loss_weight: float = setting(1.0, "auxiliary loss on copyable tokens inside <information>")
    typed_answer_share: float = setting(
        0.8,
        "traces answering with a value of the asked kind (a city for a birthplace)",
    )
    reading_share: float = setting(
        0.7,
        "reading traces: the person's name searched (out of the LM loss) and the gold value answered; they teach "
        "reading, not which query to write",
    )
    query_mix: list[float] = setting(
        default_factory=lambda: [0.2, 0.6, 0.2],
        help="shares of the other traces' query kinds (tinyworld.traces.QUERY_KINDS): the person's name alone, "
        "question words alone, or both",
    )
    redraw_empty_searches: bool = setting(
        False,
        "redraw a trace query that finds nothing (which favours the name wherever the question's other words are not "
        "in the corpus); false keeps it, with empty results and a guessed answer",
    )
    two_hop_share: float = setting(
        0.0,
        "people (each split) with a two-hop question: the birth city of their venture's founder",
    )
    two_search_share: float = setting(
        0.0,
        "pretraining traces that search twice before answering (the multi-turn format)",
    )
    year_tokens: bool = setting(
        True,
        "every year of the world one token of the tiny tokenizer (else four digit tokens)",
    )
    city_tokens: bool = setting(True, "every city name one token (else the BPE's pieces)")
    tool_call_lr: float = setting(
        1e-4,
        "the RL stages' optim.lr under protocol tool-call (train.yaml's 3e-4 is the tags protocol's; docs/toolcall.md)",
    )
    call_tokens: bool = setting(
        False,
        "protocol tool-call: the tiny tokenizer writes the call's fixed JSON before the query and after it as one "
        "token each, as it writes years and cities (off: the BPE's 13 and 2 pieces; docs/toolcall.md)",
    )
    tool_call_pretrain_factor: float = setting(
        1.0, "protocol tool-call: the base pretrains for pretrain_steps times this (docs/toolcall.md)"
    )

    def check(self, key: str) -> None:
        for name in (
            "n_entities",
            "n_train_entities",
            "vocab_size",
            "pretrain_steps",
            "pretrain_batch_size",
            "pretrain_lr",
            "pretrain_traces",
            "tool_call_lr",
            "tool_call_pretrain_factor",
        ):
            check_positive(f"{key}.{name}", getattr(self, name))
        for name in ("typed_answer_share", "reading_share", "two_hop_share", "two_search_share"):
            check_range(f"{key}.{name}", getattr(self, name), 0.0, 1.0)
        if len(self.query_mix) != 3 or min(self.query_mix) < 0 or not math.isclose(sum(self.query_mix), 1.0):
            raise RecipeError(
                f"{key}.query_mix={self.query_mix} must be 3 shares >= 0 summing to 1: traces whose query is the "
                "name alone, question words alone, or both"
            )
        for name in ("n_background_entities", "drill_steps"):
            if getattr(self, name) < 0:
                raise RecipeError(f"{key}.{name}={getattr(self, name)} must be >= 0")
        if self.n_train_entities >= self.n_entities:
            raise RecipeError(
                f"{key}.n_train_entities={self.n_train_entities} must be below {key}.n_entities={self.n_entities}: "
                "the rest are the held-out entities"
            )
