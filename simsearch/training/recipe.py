"""The training sections of a recipe: the optimizer and its schedule, LoRA, DeepSpeed ZeRO."""

from __future__ import annotations

from dataclasses import dataclass

from simsearch.checks import check_choice, check_positive, check_range, setting
from simsearch.errors import RecipeError


@dataclass
class OptimConfig:
    """AdamW with warmup and decay."""

    lr: float = setting(1e-6, "learning rate (the peak, after any warm-up)")
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay")
    betas: list[float] = setting(default_factory=lambda: [0.9, 0.999], help="AdamW's (beta1, beta2)")
    warmup_steps: int = setting(
        0,
        "Schedule steps of linear warm-up. `simsearch train` steps its schedule once per training step (after all of "
        "that step's minibatch updates), as verl does, so these are training steps.",
    )
    warmup_ratio: float = setting(
        0.0,
        "Or the share of the run's `steps` spent warming up: int(warmup_ratio x steps) steps, verl's "
        "`optim.lr_warmup_steps_ratio` with its rounding; exclusive with warmup_steps",
    )
    schedule: str = setting("constant", "constant | linear | cosine (decay after warmup)")
    grad_clip: float = setting(1.0, "gradient-norm clip (0 = none)")

    def check(self, key: str) -> None:
        check_positive(f"{key}.lr", self.lr)
        check_choice(f"{key}.schedule", self.schedule, ("constant", "linear", "cosine"))
        if self.warmup_steps < 0:
            raise RecipeError(f"{key}.warmup_steps={self.warmup_steps} must be >= 0")
        check_range(f"{key}.warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            raise RecipeError(
                f"{key}.warmup_steps={self.warmup_steps} and {key}.warmup_ratio={self.warmup_ratio} both set "
                "the warm-up: keep one (warmup_ratio for a share of the run, as verl's lr_warmup_steps_ratio)"
            )

    def warmup_for(self, total_steps: int) -> int:
        """Warm-up steps of a run of `total_steps`: `warmup_steps`, or int(warmup_ratio x total_steps)."""
        return self.warmup_steps or int(self.warmup_ratio * total_steps)


@dataclass
class LoraConfig:
    """PEFT LoRA; disabled when r = 0."""

    r: int = setting(0, "LoRA rank (0 = no LoRA: full fine-tuning)")
    alpha: int = setting(16, "LoRA's alpha: the adapter's update is scaled by alpha / r")
    dropout: float = setting(0.0, "dropout on the adapter's input")
    target_modules: list[str] = setting(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        help="names of the modules that get an adapter (Llama and Qwen's attention and MLP projections)",
    )
    merge_on_save: bool = setting(False, "write merged full weights instead of the adapter")


@dataclass
class DeepSpeedConfig:
    """DeepSpeed ZeRO; disabled when stage = 0."""

    stage: int = setting(0, "0 (off) | 2 | 3")
    offload_optimizer: bool = setting(False, "ZeRO: optimizer state on CPU")
    offload_params: bool = setting(False, "ZeRO-3: parameters on CPU")

    def check(self, key: str) -> None:
        if self.stage not in (0, 2, 3):
            raise RecipeError(f"{key}.stage={self.stage} must be 0 (off), 2 or 3")
