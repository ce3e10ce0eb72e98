"""The policy sections of a recipe: the agent loop, the reward, the advantage estimator and loss.

The choice tables its checks read live beside what they choose (`data.templates`, `policy.rewards`,
`eval.metrics`); the estimator and loss tables need torch, so `AlgorithmConfig.check` imports them
when it runs, which keeps `import simsearch.config` (and `simsearch --help`) torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simsearch.checks import check_choice, check_positive, check_range, setting
from simsearch.data.templates import TEMPLATE_NAMES
from simsearch.errors import RecipeError
from simsearch.eval.metrics import NORMALIZATIONS
from simsearch.policy.protocols import PROTOCOLS
from simsearch.policy.rewards import REWARD_NAMES
from simsearch.policy.toolcalls import TOOL_CALL_FORMATS

RECIPE_TEMPLATES = tuple(name for name in TEMPLATE_NAMES if name not in ("direct", "rag"))
"""Policy templates a recipe may name; `simsearch eval` runs the direct and RAG baselines itself."""


@dataclass
class RolloutConfig:
    """The multi-turn agent loop."""

    template: str = setting(
        "search-r1",
        'Policy prompt, from simsearch.data.templates (docs there; "direct" and "rag" are evaluation baselines). '
        "search-r1-auto: Search-R1's text through the chat template exactly when the tokenizer has one, as Search-R1 "
        "and ZeroSearch do; search-r1: never (the quickstart's default); search-r1-chat: always.",
    )
    max_turns: int = setting(2, "search turns before the final answer turn (ZeroSearch paper: 2)")
    max_obs_tokens: int = setting(512, "tokens of one <information> block before truncation")
    max_context_tokens: int = setting(4096, "prompt + response tokens per trajectory")
    group_size: int = setting(5, "rollouts per prompt (GRPO's G)")
    self_search_real_share: float = setting(0.0, "self-search: share of questions whose searches `search` answers")
    protocol: str = setting(
        "tags",
        "How the policy searches, from simsearch.policy.protocols.PROTOCOLS: tags (Search-R1's <search> tags in the "
        "text) or tool-call (the search tool in the model's own chat template; `template` then only picks the user "
        "message: search-r1-brief one sentence, self-search SSRL's in the tool format, any other the full one)",
    )
    tool_format: str = setting(
        "hermes",
        "tool-call only: how the model writes a call, from simsearch.policy.toolcalls.TOOL_CALL_FORMATS (hermes: "
        "Qwen2.5 / Qwen3 <tool_call> JSON, verl's `format: hermes`; llama3: Llama 3.1 JSON)",
    )
    chat_template_kwargs: dict[str, Any] = setting(
        default_factory=dict,
        help="tool-call only: extra arguments of the chat template, e.g. {enable_thinking: false} (Qwen3, thinking "
        "off)",
    )

    def check(self, key: str) -> None:
        check_choice(f"{key}.template", self.template, RECIPE_TEMPLATES)
        check_choice(f"{key}.protocol", self.protocol, tuple(PROTOCOLS))
        check_choice(f"{key}.tool_format", self.tool_format, tuple(TOOL_CALL_FORMATS))
        if self.chat_template_kwargs and self.protocol != "tool-call":
            raise RecipeError(
                f"{key}.chat_template_kwargs apply to {key}.protocol=tool-call (the conversation rendered by the "
                f"chat template); with {key}.protocol={self.protocol} leave them empty"
            )
        for name in ("group_size", "max_obs_tokens", "max_context_tokens"):
            check_positive(f"{key}.{name}", getattr(self, name))
        if self.max_turns < 0:
            raise RecipeError(f"{key}.max_turns={self.max_turns} must be >= 0")
        check_range(f"{key}.self_search_real_share", self.self_search_real_share, 0.0, 1.0)
        if self.self_search_real_share > 0 and self.template != "self-search":
            raise RecipeError(
                f"{key}.self_search_real_share={self.self_search_real_share:g} only applies to "
                f"{key}.template=self-search; set it to 0 or switch the template"
            )


@dataclass
class RewardConfig:
    """The reward: a weighted sum of named components."""

    weights: dict[str, float] = setting(
        default_factory=dict,
        help="name -> weight, names from simsearch.policy.rewards.REWARD_NAMES (format is ours, ssrl_format SSRL's "
        "exact rule); empty = {f1: 1.0}, ZeroSearch's reward (see `resolved_weights`). (A non-empty default would be "
        "merged into, not replaced by, a recipe's own weights.)",
    )
    normalization: str = setting(
        "squad",
        "How answers are normalized before em / substring_em / f1 (simsearch.eval.metrics). squad by default: the "
        "SQuAD v1.1 rule Search-R1, ZeroSearch and SSRL train with, so a reward means what theirs means; unicode "
        '(ours) also deletes non-ASCII punctuation and never matches a gold answer that normalizes to "".',
    )
    overlong_buffer: int = setting(
        0,
        "DAPO's overlong reward shaping (policy.rewards.overlong_penalty): a trajectory whose prompt + response tokens "
        "L come within overlong_buffer tokens of rollout.max_context_tokens (L_max; one the context cut counts as "
        "L_max) gets overlong_penalty x (L_max - buffer - L) / buffer added; 0 = off",
    )
    overlong_penalty: float = setting(1.0, "the penalty at the limit (DAPO's penalty_factor)")

    def check(self, key: str) -> None:
        for name in self.weights:
            check_choice(f"{key}.weights key", name, REWARD_NAMES)
        check_choice(f"{key}.normalization", self.normalization, tuple(NORMALIZATIONS))
        if not any(self.resolved_weights().values()):
            raise RecipeError(f"{key}.weights are all 0: give at least one a weight, e.g. {{f1: 1.0}}")
        if self.overlong_buffer < 0:
            raise RecipeError(f"{key}.overlong_buffer={self.overlong_buffer} must be >= 0 tokens (0 = off)")
        if not 0 <= self.overlong_penalty < float("inf"):  # also refuses NaN
            raise RecipeError(f"{key}.overlong_penalty={self.overlong_penalty} must be finite and >= 0 (DAPO: 1.0)")

    def resolved_weights(self) -> dict[str, float]:
        """The weights the reward uses: `weights`, or ZeroSearch's {f1: 1.0} when it is empty."""
        return dict(self.weights) or {"f1": 1.0}


@dataclass
class AlgorithmConfig:
    """Advantage estimator and loss."""

    estimator: str = setting("grpo", "a name in policy.advantages.ESTIMATORS")
    clip_low: float = setting(0.2, "PPO ratio clip below 1")
    clip_high: float = setting(0.2, "PPO ratio clip above 1 (asymmetric when != clip_low)")
    clip_ratio_c: float = setting(
        0.0,
        "dual-clip PPO (verl's clip_ratio_c, its default 3.0): at negative advantages the loss is capped at -A x "
        "clip_ratio_c, so a token whose ratio ran past it stops pushing; 0 = off, else > 1",
    )
    kl_coef: float = setting(0.001, "weight of KL to the frozen reference (0 = no reference model)")
    kl_estimator: str = setting(
        "k3",
        "per-token KL estimate: a name in policy.losses.KL_ESTIMATORS (k3: verl's low_var_kl)",
    )
    kl_in_reward: bool = setting(False, "fold KL into the token reward instead of the loss")
    entropy_coef: float = setting(0.0, "entropy bonus")
    loss_agg: str = setting("token-mean", "a name in policy.losses.LOSS_AGGREGATIONS")
    gamma: float = setting(1.0, "discount (PPO / REINFORCE++)")
    lam: float = setting(1.0, "GAE lambda")
    value_clip: float = setting(0.2, "PPO value clip")
    value_coef: float = setting(0.5, "PPO value loss weight")
    critic_lr: float = setting(1e-5, "PPO critic learning rate")
    critic_warmup_ratio: float | None = setting(
        None,
        "PPO critic warm-up, a share of `steps` (verl's critic.optim.lr_warmup_steps_ratio: 0.015 in ZeroSearch's and "
        "Search-R1's PPO scripts); None = the actor's (optim.warmup_steps / warmup_ratio)",
    )
    stratified_alpha: float = setting(0.5, "stratified GRPO: weight of the within-stratum advantage")
    igpo_gamma: float = setting(
        1.0,
        "IGPO: discount of a turn's advantage over the turns that follow it, in [0, 1] (the paper's 1.0)",
    )
    ppo_epochs: int = setting(1, "passes over each batch (verl's ppo_epochs)")
    minibatch_size: int = setting(
        0,
        "trajectories per optimizer step over all processes; 0 = the whole batch. verl's ppo_mini_batch_size counts "
        "prompts: ours = ppo_mini_batch_size x rollout.n (its group size)",
    )
    tis_cap: float = setting(
        0.0,
        "truncated importance sampling: weight each token by min(p_trainer / p_rollout, tis_cap), correcting for a "
        "rollout engine (vLLM) that samples slightly off the trainer; 0 = off, else >= 1",
    )
    dynamic_sampling: bool = setting(
        False,
        "DAPO's dynamic sampling (policy.sampling): drop the groups whose rewards are all equal and roll out the next "
        "prompts of the data stream, round after round, until prompts_per_step informative groups; only with an "
        "estimator whose flat groups get no gradient (ESTIMATORS' flat_groups_are_silent)",
    )
    max_sampling_rounds: int = setting(
        3,
        "rollout rounds per step at most, the first included (verl: max_num_gen_batches)",
    )
    ratio_level: str = setting(
        "token",
        "importance ratio the loss clips: a name in policy.losses.RATIO_LEVELS (sequence = GSPO's length-normalized "
        "sequence ratio; it differs from token only when a batch makes several updates)",
    )
    mask_unfinished: bool = setting(
        False,
        "Mini-o3's over-turn masking: trajectories still searching when the turns or context ran out (types.OVER_TURN) "
        "get loss mask 0 instead of being trained on their reward of 0",
    )
    mask_gave_up: bool = setting(
        False,
        "with mask_unfinished, also mask give-ups (finish gave_up: the final turn neither searched nor answered)",
    )

    @property
    def needs_reference(self) -> bool:
        """A KL term (loss or reward) is computed, so the reference's log-probs are."""
        return self.kl_coef > 0

    @property
    def kl_loss_coef(self) -> float:
        """The KL term's weight in the loss: 0 when it is folded into the reward instead."""
        return 0.0 if self.kl_in_reward else self.kl_coef

    def check(self, key: str) -> None:
        # Imported here, not at the top: the tables' modules need torch, which `import simsearch.config`
        # (and so `simsearch --help`) must not pay for.
        from simsearch.policy.advantages import ESTIMATORS
        from simsearch.policy.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, RATIO_LEVELS

        check_choice(f"{key}.estimator", self.estimator, tuple(ESTIMATORS))
        check_choice(f"{key}.kl_estimator", self.kl_estimator, tuple(KL_ESTIMATORS))
        if self.clip_ratio_c != 0 and not self.clip_ratio_c > 1:  # `not >` also refuses NaN
            raise RecipeError(
                f"{key}.clip_ratio_c={self.clip_ratio_c} must be 0 (no dual clip) or > 1 (a bound on the ratio "
                "above the clip range); verl's default is 3.0"
            )
        check_choice(f"{key}.loss_agg", self.loss_agg, tuple(LOSS_AGGREGATIONS))
        check_positive(f"{key}.ppo_epochs", self.ppo_epochs)
        for name in ("kl_coef", "entropy_coef", "value_coef"):
            if not getattr(self, name) >= 0:  # `not >=` also refuses NaN
                raise RecipeError(f"{key}.{name}={getattr(self, name)} must be >= 0 (0 = off)")
        check_choice(f"{key}.ratio_level", self.ratio_level, tuple(RATIO_LEVELS))
        check_range(f"{key}.igpo_gamma", self.igpo_gamma, 0.0, 1.0)
        if ESTIMATORS[self.estimator].information_gain and self.kl_in_reward:
            raise RecipeError(
                f"{key}.kl_in_reward=true with {key}.estimator={self.estimator}: its turn rewards take no KL "
                "penalty; keep the KL in the loss (kl_in_reward=false), as the IGPO paper does"
            )
        if self.critic_warmup_ratio is not None:
            check_range(f"{key}.critic_warmup_ratio", self.critic_warmup_ratio, 0.0, 1.0)
        if self.tis_cap != 0 and not self.tis_cap >= 1:  # `not >=` also refuses NaN
            raise RecipeError(
                f"{key}.tis_cap={self.tis_cap} must be 0 (no correction) or >= 1 (a token the rollout "
                "and the trainer agree on keeps weight 1); the usual cap is 2"
            )
        if self.max_sampling_rounds < 1:
            raise RecipeError(
                f"{key}.max_sampling_rounds={self.max_sampling_rounds} must be >= 1 (rollout rounds per step, the "
                "first included); there is no unbounded setting (verl's max_num_gen_batches=0)"
            )
        if self.mask_gave_up and not self.mask_unfinished:
            raise RecipeError(
                f"{key}.mask_gave_up=true masks give-ups only alongside over-turn masking: "
                f"set {key}.mask_unfinished=true too"
            )
