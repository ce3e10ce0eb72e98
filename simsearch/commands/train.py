"""`simsearch train`: curriculum RL of a search agent (ZeroSearch, SSRL, Search-R1 baselines).

Reads top to bottom: setup (processes, data, models, optimizers, engines, resume) → loop → cleanup.
One step:

1. take `prompts_per_step` questions from a seeded permutation per epoch (the position is
   checkpointed); each process rolls out its own share, whole groups per process;
2. p_noise = curriculum(step); each search call gets num_noisy(p_noise, top_k) noisy documents;
3. roll out `group_size` trajectories per question with the in-process `HFEngine`, which shares
   the policy's weights, or with `policy.kind=vllm` an in-process vLLM engine, which is given the
   updated weights after every update (`sync_rollout_weights`) and with
   `policy.enable_sleep_mode` frees its GPU memory between rollouts;
4. score them (`reward.weights`), compute reference log-probs (a frozen copy, or with LoRA the
   base model with the adapter disabled), old log-probs and critic values;
5. advantages (`algorithm.estimator`), then `ppo_epochs` passes over minibatches of
   micro-batches: masked losses, AdamW with gradient clipping per minibatch;
6. log; validate every `eval_every` steps (greedy); checkpoint every `save_every` steps.

Launch:
    simsearch train recipes/train/tiny_cpu.yaml
    torchrun --nproc_per_node 2 -m simsearch.cli train RECIPE deepspeed.stage=3
    deepspeed --num_gpus 8 --no_local_rank --module simsearch.cli train RECIPE

Run directory: `recipe.yaml`, `metrics.jsonl` (+ `tensorboard/`; search counts, latency and cost
per engine under `search/`, `simulator/`, `cost/`), `cost.json` (their totals over every
invocation), `trajectories.jsonl` (`trajectory_samples` trajectories every `trajectory_every`
steps, for `simsearch view`), `checkpoints/step_N/`
(`model/` in Hugging Face format — full weights, or the LoRA adapter — and `trainer_state.pt`:
optimizer, scheduler, curriculum, data position, RNG, critic), and with DeepSpeed
`deepspeed/step_N/` (its partitioned states, referenced from the checkpoint).

Where this departs from the textbook and from ZeroSearch's verl trainer:

- Every trainer log-prob (old, current, reference) and the entropy are those of softmax(logits /
  `sampling.temperature`), the distribution the rollout sampled from, as verl's actor computes
  them (ZeroSearch's `verl/workers/actor/dp_actor.py:100,136`, temperature set for old and
  reference log-probs in `verl/workers/fsdp_workers.py:461,492`); top-p is not applied, as in
  verl. A temperature of 0 (greedy) is refused for training: it has no distribution to train.
- Old log-probs are recomputed only when a batch is reused (`ppo_epochs` > 1, several
  minibatches, or KL folded into the reward); otherwise the update is on-policy and old = the
  current log-probs detached (ratio 1, nothing clipped), which is exact and saves a forward pass.
- The learning-rate schedule advances once per training step, not per optimizer step, as verl's
  (ZeroSearch's `verl/workers/fsdp_workers.py:381`, after all of the step's minibatch updates), so
  `optim.warmup_steps` (or `warmup_ratio` x `steps`) counts training steps whatever the
  minibatch setting.
- The KL term has the right sign (ZeroSearch's release pushed the policy away from the
  reference); a dead search or simulator service stops the run with the last good checkpoint
  named (ZeroSearch retried forever; with several processes each stops at its own failed call);
  validation keeps every question (ZeroSearch's `drop_last` did not).
- Sampling, noise coin flips and minibatch shuffles are seeded by (seed, step, process), so a
  resumed run replays exactly what an uninterrupted one would have done (given the same recipe:
  `steps` also sets the curriculum's and the LR decay's length unless they set their own).
- Under DeepSpeed, batch-wide statistics (the REINFORCE baseline, REINFORCE++ / GAE whitening,
  the token-mean denominator) are per process; groups never span processes, so GRPO, Dr.GRPO,
  RLOO and stratified GRPO are exact. Under ZeRO-3 the rollout runs on an unpartitioned copy
  (processes generate different lengths, a partitioned model would need all of them in every
  forward), refreshed by gathering the trained parameters after each update; the reference is an
  unpartitioned copy too.
- With neither KL loss nor entropy bonus (and not PPO), rows whose advantages are all zero (GRPO
  groups with equal rewards) skip the forward/backward; the loss denominators still count them,
  so the gradient is the same. Under DeepSpeed the accumulation boundary is set explicitly at
  the last micro-batch of each minibatch (one optimizer step per minibatch whatever is skipped),
  and every process runs the same number of micro-batches, at least one, topped up with skipped
  rows whose gradient is 0 (their forward passes carry ZeRO's collectives).
- With vLLM rollouts (GPU-only; nothing of this path has run on a GPU yet, docs/scaling.md) the
  log-probs the update uses are the trainer's, as in Search-R1 and ZeroSearch: by default the
  small gap between vLLM's sampling distribution and the trained module's is not corrected.
  `algorithm.tis_cap` > 0 turns on truncated importance sampling (`policy.offpolicy`): the
  rollout asks for log-probs, and each trained token's advantage is multiplied by
  min(p_trainer / p_rollout, tis_cap), detached, with p_trainer the old log-probs (then always
  computed: one more forward pass when the batch is not reused). Both sides are the raw
  distribution, before temperature and top-p, so the weights measure the engines' disagreement
  (our engines report raw log-probs; verl asks vLLM for tempered ones): at a temperature other
  than 1 that takes one more forward pass.
  Each process runs its own engine (vLLM's `external_launcher`), so tensor parallelism is
  refused with several processes. Under ZeRO-3 no rollout copy is kept: the weights are gathered
  a module at a time straight into vLLM.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from simsearch.commands.build import build_generation_engine, build_search_engine, meter_search_engine
from simsearch.config import RecipeError, SearchConfig, TrainRecipe, save_recipe
from simsearch.curriculum.schedules import build as build_schedule
from simsearch.curriculum.schedules import num_noisy
from simsearch.data.qa import load_qa
from simsearch.engines.hf import HFEngine
from simsearch.engines.vllm import trained_params_for_vllm
from simsearch.errors import ServiceError
from simsearch.eval import report
from simsearch.models import load_model
from simsearch.policy.batch import (
    ActorLossSettings,
    ValueModel,
    actor_micro_loss,
    collate_rollout_logprobs,
    collate_trajectories,
    logprobs_in_micro_batches,
    loss_denominators,
    micro_batches,
    minibatches,
    pad_micro_batches,
    rank_share,
    response_logits,
    rows_with_signal,
    sequence_kl,
    stream_indices,
    token_advantages,
    values_in_micro_batches,
    values_of,
)
from simsearch.policy.losses import value_loss
from simsearch.policy.offpolicy import truncated_is_weights
from simsearch.policy.rollout import RolloutSettings, generate_trajectories, score_trajectories
from simsearch.retrieval import accounting
from simsearch.retrieval.accounting import COUNTERS, EngineUsage, Ledger
from simsearch.training.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from simsearch.training.distributed import (
    HFExport,
    all_reduce_max,
    all_reduce_sum,
    backward,
    deepspeed_config,
    deepspeed_state_dir,
    init_distributed,
    load_for_training,
    mean_over_ranks,
    prune_deepspeed_dirs,
)
from simsearch.training.optim import adamw_with_schedule
from simsearch.training.runlog import RunLogger, read_metrics
from simsearch.types import SamplingParams, Trajectory

VAL_REWARDS = {"em": 1.0, "f1": 1.0, "substring_em": 1.0}


def main(recipe: TrainRecipe) -> dict[str, float]:
    """Trains the policy the recipe describes; returns the last step's metrics."""
    # ------------------------------------------------------------------ setup
    alg, optim, temp = recipe.algorithm, recipe.optim, recipe.sampling.temperature
    use_ds, lora, ppo = recipe.deepspeed.stage > 0, recipe.lora.r > 0, alg.estimator == "ppo"
    use_vllm = recipe.policy.kind == "vllm"
    rank, world = init_distributed(use_ds, task="training")
    if use_vllm and world > 1 and recipe.policy.tensor_parallel_size > 1:
        raise RecipeError(
            f"policy.tensor_parallel_size={recipe.policy.tensor_parallel_size} with {world} processes: each "
            "process runs its own vLLM engine on its own GPU and rolls out its own questions; set "
            "policy.tensor_parallel_size=1 (or train in one process)"
        )
    share = rank_share(recipe.prompts_per_step, rank, world)
    rows_per_rank = (share.stop - share.start) * recipe.rollout.group_size
    if alg.minibatch_size % world:
        raise RecipeError(f"algorithm.minibatch_size={alg.minibatch_size} must be a multiple of the {world} processes")
    minibatch_rows = alg.minibatch_size // world  # 0 = the whole batch
    if minibatch_rows and rows_per_rank % minibatch_rows:
        raise RecipeError(
            f"algorithm.minibatch_size={alg.minibatch_size} over {world} processes must divide each process's "
            f"{rows_per_rank} trajectories"
        )
    run_dir = Path(recipe.run_dir)
    if rank == 0:
        save_recipe(recipe, run_dir)
    torch.manual_seed(recipe.seed)  # the same on every process: LoRA and head inits must agree

    train_data = [example for path in recipe.data.train for example in load_qa(path)]
    val_data = [ex for path in recipe.data.val for ex in load_qa(path)[: recipe.data.val_size or None]]
    checkpoint = latest_checkpoint(run_dir) if recipe.resume else None
    state = load_state(checkpoint) if checkpoint else None

    # Policy: resumed weights (full or the LoRA adapter) load here; under DeepSpeed `load_checkpoint` below.
    policy, tokenizer = load_for_training(
        recipe.policy.model.path, dtype=recipe.policy.model.dtype, checkpoint=checkpoint, deepspeed=use_ds,
        lora_r=recipe.lora.r, lora_alpha=recipe.lora.alpha, lora_dropout=recipe.lora.dropout,
        lora_target_modules=recipe.lora.target_modules, gradient_checkpointing=recipe.gradient_checkpointing,
    )  # fmt: skip
    # Reference: the initial policy. With LoRA it is the same model with the adapter disabled.
    needs_reference = alg.kl_coef > 0
    reference = None
    if needs_reference and not lora:
        reference, _ = load_model(recipe.policy.model.path, dtype=recipe.policy.model.dtype)
        reference.requires_grad_(False)
    critic = None
    if ppo:
        base, _ = load_model(recipe.policy.model.path, dtype=recipe.policy.model.dtype)
        if recipe.gradient_checkpointing:
            base.gradient_checkpointing_enable()
        critic = ValueModel(base.base_model, base.config.hidden_size)
        del base
        if state is not None and not use_ds:
            critic.load_state_dict(state["critic"])

    def make_optimizer(params: list[torch.nn.Parameter], lr: float, warmup: int) -> tuple[torch.optim.Optimizer, Any]:
        return adamw_with_schedule(
            params, lr=lr, betas=optim.betas, weight_decay=optim.weight_decay,
            warmup_steps=warmup, total_steps=recipe.steps, schedule=optim.schedule,
        )  # fmt: skip

    trainable = [p for p in policy.parameters() if p.requires_grad]
    warmup = optim.warmup_for(recipe.steps)
    optimizer, scheduler = make_optimizer(trainable, optim.lr, warmup)
    critic_optimizer, critic_scheduler = None, None
    if critic is not None:
        if alg.critic_warmup_ratio is not None:
            warmup = int(alg.critic_warmup_ratio * recipe.steps)  # verl's rounding, as optim.warmup_ratio
        critic_optimizer, critic_scheduler = make_optimizer(list(critic.parameters()), alg.critic_lr, warmup)
    rollout_copy = None
    if use_ds:
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        rows = minibatch_rows or rows_per_rank
        config = deepspeed_config(
            stage=recipe.deepspeed.stage,
            offload_optimizer=recipe.deepspeed.offload_optimizer,
            offload_params=recipe.deepspeed.offload_params,
            micro_batch_size=recipe.micro_batch_size,
            grad_accum=math.ceil(rows / recipe.micro_batch_size),  # micro-batches per minibatch
            world_size=world,
            grad_clip=optim.grad_clip,
            bf16=recipe.bf16,
        )
        if recipe.deepspeed.stage == 3 and not use_vllm:
            rollout_copy = copy.deepcopy(policy)  # taken before ZeRO-3 partitions the parameters
        # Our schedulers stay outside DeepSpeed: they advance once per training step.
        actor, optimizer, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=config)
        if critic is not None:
            critic, critic_optimizer, _, _ = deepspeed.initialize(model=critic, optimizer=critic_optimizer, config=config)
        if state is not None:
            actor.load_checkpoint(str(Path(state["deepspeed_dir"]) / "policy"), tag="state")
            if critic is not None:
                critic.load_checkpoint(str(Path(state["deepspeed_dir"]) / "critic"), tag="state")
        device = torch.device(get_accelerator().current_device_name())
        actor_module = actor.module
        dtype = torch.bfloat16 if recipe.bf16 else None
    else:
        device = torch.device(recipe.policy.model.device)
        actor = actor_module = policy.to(device)
        if critic is not None:
            critic.to(device)
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
            if critic is not None:
                critic_optimizer.load_state_dict(state["critic_optimizer"])
        dtype = None
    for extra in (reference, rollout_copy):
        if extra is not None:
            extra.to(device=device, dtype=dtype).eval()
    for name, sched in (("scheduler", scheduler), ("critic_scheduler", critic_scheduler)):
        if state is not None and sched is not None:
            sched.load_state_dict(state[name])
            for group, lr in zip(sched.optimizer.param_groups, sched.get_last_lr()):
                group["lr"] = lr  # whatever the optimizer state restored, the schedule decides
    actor.train()
    if critic is not None:
        critic.train()

    use_autocast = recipe.bf16 and not use_ds and _bf16_supported(device)
    if recipe.bf16 and not use_ds and not use_autocast and rank == 0:
        print(f"simsearch train: bf16 is not supported on {device}; training in float32")

    def autocast() -> Any:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if use_autocast else nullcontext()

    def generation_autocast() -> Any:  # vLLM runs in its own dtype, maybe in this very thread: leave it be
        return nullcontext() if use_vllm else autocast()

    if use_vllm:  # GPU-only, unverified on a GPU (docs/scaling.md)
        backend = "external_launcher" if world > 1 else None  # one engine per process, on its GPU
        generator, _, _ = build_generation_engine(recipe.policy, seed=recipe.seed + rank, distributed_executor_backend=backend)
    else:
        generator = HFEngine(rollout_copy if rollout_copy is not None else actor_module, tokenizer, batch_size=recipe.policy.batch_size)

    def sync_rollout_weights() -> None:
        """Makes the rollout engine generate with the latest policy weights.

        vLLM holds its own copy: load the trained weights into it (LoRA merged; under ZeRO-3
        gathered a module at a time, on every process), which also resets its prefix cache. The
        in-process HFEngine over the trained module shares its weights, but the KV caches it
        keeps for prefix reuse were computed with the old ones: drop them. Under ZeRO-3 the
        HFEngine runs a copy: gather the trained parameters into it.
        """
        if use_vllm:
            generator.sync_weights(trained_params_for_vllm(actor_module, lora=lora, zero3=recipe.deepspeed.stage == 3))
            return
        generator.reset_prefix_cache()
        if rollout_copy is None:
            return
        named = [(n, p) for n, p in actor_module.named_parameters() if p.requires_grad]
        targets = dict(rollout_copy.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
            with torch.no_grad():
                for name, param in named:
                    targets[name].copy_(param.data)

    sync_rollout_weights()  # a resumed DeepSpeed run restored its weights after the copy was taken
    ledger, previous_cost = Ledger(), accounting.read_cost(run_dir) if rank == 0 else None
    search = build_search_engine(recipe.search, seed=recipe.seed + rank)
    search = meter_search_engine(search, recipe.search, ledger, "search")
    validating = bool(recipe.eval_every and val_data)
    val_cfg = recipe.val_search or recipe.search
    val_search = search
    if validating and recipe.val_search:
        val_search = meter_search_engine(build_search_engine(val_cfg, seed=recipe.seed), val_cfg, ledger, "val_search")
    run_usage: dict[str, EngineUsage] = {}  # summed over processes, step by step
    settings, val_settings = _rollout_settings(recipe, recipe.search), _rollout_settings(recipe, val_cfg)

    schedule = build_schedule(recipe.curriculum, recipe.steps)
    start = int(state["step"]) if state else 0
    position = int(state["data_position"]) if state else 0
    if state is not None:
        schedule.load_state_dict(state["curriculum"])
        set_rng_state(state["rng"])
    logger = None
    if rank == 0:
        logger = RunLogger(run_dir, resume_step=start, tensorboard=recipe.tensorboard, wandb_project=recipe.wandb_project)
    loss_settings = ActorLossSettings(
        clip_low=alg.clip_low,
        clip_high=alg.clip_high,
        aggregation=alg.loss_agg,
        token_sum_normalizer=float(recipe.rollout.max_context_tokens) if alg.loss_agg == "seq-mean-token-sum-norm" else None,
        kl_coef=0.0 if alg.kl_in_reward else alg.kl_coef,
        kl_estimator=alg.kl_estimator,
        entropy_coef=alg.entropy_coef,
        temperature=temp,
        clip_ratio_c=alg.clip_ratio_c,
    )
    # Rows without signal may skip the forward/backward only where nothing else acts on them.
    skip_flat_rows = not ppo and loss_settings.kl_coef == 0 and alg.entropy_coef == 0

    def optimizer_step(engine: Any, opt: torch.optim.Optimizer) -> float:
        if use_ds:
            return float(engine.get_global_grad_norm() or 0.0)
        params = [p for group in opt.param_groups for p in group["params"]]
        for p in params:  # a minibatch whose rows were all skipped has gradient 0, not "no gradient"
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = torch.nn.utils.clip_grad_norm_(params, optim.grad_clip if optim.grad_clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(norm)

    def update(batch: Any, advantages: torch.Tensor, old_logp: Any, ref_logp: Any, returns: Any, old_values: Any, step: int) -> dict[str, float]:
        """`ppo_epochs` passes over the minibatches; returns the update's loss statistics."""
        sums: dict[str, float] = defaultdict(float)
        lengths = batch.prompt_lens + batch.response_lens
        keep = rows_with_signal(advantages) if skip_flat_rows else torch.ones(batch.size, dtype=torch.bool, device=lengths.device)
        shuffle = torch.Generator().manual_seed(_derived_seed(recipe.seed, "minibatch", step, rank))
        plan = [
            (rows, micro_batches(rows[keep[rows]], lengths, recipe.micro_batch_size))
            for _ in range(alg.ppo_epochs)
            for rows in (r.to(lengths.device) for r in minibatches(batch.size, minibatch_rows, shuffle))
        ]
        if use_ds:
            # DeepSpeed steps at the boundary we set, after the last micro-batch of each minibatch;
            # every process runs as many micro-batches (each forward/backward has collectives) and
            # at least one, so skipped rows never move or drop a step. Fillers are skipped rows
            # (gradient 0).
            counts = all_reduce_max(torch.tensor([max(len(micros), 1) for _, micros in plan]), world)
            plan = [
                (rows, pad_micro_batches(micros, rows[~keep[rows]], lengths, int(n)))
                for (rows, micros), n in zip(plan, counts)
            ]
        updates = 0
        for rows, micros in plan:
            denominators = loss_denominators(batch.loss_mask[rows])
            for i, micro_rows in enumerate(micros):
                boundary = i == len(micros) - 1
                micro = batch.select(micro_rows)
                width = micro.response_width
                with autocast():
                    logits = response_logits(actor, micro)
                loss, stats = actor_micro_loss(
                    logits, micro, advantages[micro_rows, :width],
                    None if old_logp is None else old_logp[micro_rows, :width],
                    None if ref_logp is None else ref_logp[micro_rows, :width],
                    loss_settings, denominators,
                )  # fmt: skip
                backward(loss, actor if use_ds else None, boundary=boundary)
                sums["policy"] += stats["policy"]
                sums["kl"] += stats.get("kl", 0.0)
                for name in ("clipfrac", "clipfrac_lower", "approx_kl", "entropy"):
                    sums[name] += stats[name] * stats["tokens"]
                sums["tokens"] += stats["tokens"]
                if critic is not None:
                    with autocast():
                        values = values_of(critic, micro)
                    vloss, vstats = value_loss(
                        values, old_values[micro_rows, :width], returns[micro_rows, :width], micro.loss_mask,
                        alg.value_clip, alg.loss_agg,
                        denominators[0] if alg.loss_agg == "token-mean" else denominators[1],
                        loss_settings.token_sum_normalizer,
                    )  # fmt: skip
                    backward(alg.value_coef * vloss, critic if use_ds else None, boundary=boundary)
                    sums["value"] += float(vloss.detach())
            sums["grad_norm"] += optimizer_step(actor, optimizer)
            if critic is not None:
                sums["critic_grad_norm"] += optimizer_step(critic, critic_optimizer)
            updates += 1
        scheduler.step()
        if critic_scheduler is not None:
            critic_scheduler.step()
        tokens = max(sums["tokens"], 1.0)  # 0 when every row was skipped
        out = {"perf/skipped_row_share": 1.0 - float(keep.float().mean())}
        parts = ("policy",) + (("kl",) if needs_reference else ()) + (("value",) if critic is not None else ())
        out.update({f"losses/{k}": sums[k] / updates for k in parts})
        out.update({f"losses/{k}": sums[k] / tokens for k in ("clipfrac", "clipfrac_lower", "approx_kl", "entropy")})
        out["optim/grad_norm"] = sums["grad_norm"] / updates
        if critic is not None:
            out["optim/critic_grad_norm"] = sums["critic_grad_norm"] / updates
        return out

    def validate() -> dict[str, float]:
        """Greedy rollouts on `data.val` (each process a share), scored with EM, F1, substring EM."""
        mine = val_data[rank::world]
        totals = torch.zeros(5, dtype=torch.float64)  # em, f1, substring_em, searches, count
        if mine:
            with generation_autocast():
                result = generate_trajectories(
                    mine, policy=generator, tokenizer=tokenizer, search=val_search, settings=val_settings,
                    sampling=SamplingParams(temperature=0.0, max_new_tokens=recipe.sampling.max_new_tokens),
                    group_size=1, rng=random.Random(f"val:{recipe.seed}:{rank}"),
                )  # fmt: skip
            scored = score_trajectories(result.trajectories, VAL_REWARDS, normalization=recipe.reward.normalization)
            totals += torch.tensor(
                [sum(scored.components[k]) for k in ("em", "f1", "substring_em")]
                + [sum(t.num_searches for t in result.trajectories), len(mine)],
                dtype=torch.float64,
            )
        totals = all_reduce_sum(totals, world)
        count = max(float(totals[4]), 1.0)
        names = ("val/em", "val/f1", "val/substring_em", "val/calls_per_traj")
        return {name: float(totals[i]) / count for i, name in enumerate(names)}

    def trainer_state(data_position: int, ds_dir: Path) -> dict[str, Any]:
        """What a checkpoint holds beside the model: optimizer, scheduler, curriculum, data, RNG."""
        trainer: dict[str, Any] = {
            "rng": rng_state(),
            "curriculum": schedule.state_dict(),
            "data_position": data_position,
            "scheduler": scheduler.state_dict(),
        }
        if critic_scheduler is not None:
            trainer["critic_scheduler"] = critic_scheduler.state_dict()
        if use_ds:
            trainer["deepspeed_dir"] = str(ds_dir)
        else:
            trainer["optimizer"] = optimizer.state_dict()
            if critic is not None:
                trainer["critic"] = critic.state_dict()
                trainer["critic_optimizer"] = critic_optimizer.state_dict()
        return trainer

    def save(done: int, data_position: int) -> Path:
        """Writes the checkpoint of `done` finished steps (every process takes part)."""
        ds_dir = deepspeed_state_dir(run_dir, done)
        if use_ds:  # every process writes its partitions
            actor.save_checkpoint(str(ds_dir / "policy"), tag="state")
            if critic is not None:
                critic.save_checkpoint(str(ds_dir / "critic"), tag="state")
        zero3 = recipe.deepspeed.stage == 3
        gather = deepspeed.zero.GatheredParameters(list(actor_module.parameters()), modifier_rank=None) if zero3 else nullcontext()
        with gather:  # ZeRO-3: every process holds the full weights while process 0 writes them
            if rank == 0:
                # The live module saves itself (tied weights stay tied); merged LoRA goes through HFExport.
                export: Any = actor_module
                if lora and recipe.lora.merge_on_save:
                    export = HFExport(actor_module, actor_module.state_dict(), recipe.policy.model.path)
                save_checkpoint(run_dir, done, model=export, tokenizer=tokenizer, state=trainer_state(data_position, ds_dir))
                prune_deepspeed_dirs(run_dir)
        if world > 1:
            dist.barrier()
        return checkpoint_dir(run_dir, done)

    # ------------------------------------------------------------------ loop
    last_saved, last_dir = (start, checkpoint) if checkpoint is not None else (-1, None)
    metrics: dict[str, float] = {}
    progress = tqdm(range(start, recipe.steps), initial=start, total=recipe.steps, disable=rank != 0, desc="train")
    step = start
    try:
        for step in progress:
            began = time.perf_counter()
            # 1. this step's questions, this process's share
            indices = stream_indices(len(train_data), position, recipe.prompts_per_step, recipe.seed)
            examples = [train_data[i] for i in indices[share]]
            position += recipe.prompts_per_step
            # 2. the curriculum decides how noisy search is
            p_noise = schedule(step)
            noise_rng = random.Random(f"noise:{recipe.seed}:{step}:{rank}")
            noise = lambda top_k: num_noisy(p_noise, top_k, recipe.curriculum.granularity, noise_rng)  # noqa: E731
            # 3. roll out
            sampling = SamplingParams(
                temperature=recipe.sampling.temperature,
                top_p=recipe.sampling.top_p,
                max_new_tokens=recipe.sampling.max_new_tokens,
                seed=_derived_seed(recipe.seed, "rollout", step, rank),
                logprobs=alg.tis_cap > 0,
            )
            with generation_autocast():
                result = generate_trajectories(
                    examples, policy=generator, tokenizer=tokenizer, search=search, settings=settings,
                    sampling=sampling, group_size=recipe.rollout.group_size, noise=noise,
                    rng=random.Random(f"real:{recipe.seed}:{step}:{rank}"),
                )  # fmt: skip
            rollout_s = time.perf_counter() - began
            if use_vllm and recipe.policy.enable_sleep_mode:
                generator.sleep()  # its GPU memory to the update; sync and the next rollout wake it
            # 4. rewards, reference and old log-probs, values
            scored = score_trajectories(
                result.trajectories, recipe.reward.resolved_weights(), normalization=recipe.reward.normalization
            )
            rewards = torch.tensor(scored.total, dtype=torch.float32)
            batch = collate_trajectories(result.trajectories, tokenizer.pad_token_id).to(device)
            reused = alg.ppo_epochs > 1 or bool(minibatch_rows and minibatch_rows < batch.size)
            ref_logp = old_logp = raw_logp = old_values = None
            mbs = recipe.micro_batch_size
            with autocast():
                if needs_reference:
                    with actor_module.disable_adapter() if lora else nullcontext():
                        ref_logp = logprobs_in_micro_batches(actor if lora else reference, batch, mbs, temp)
                if reused or (alg.kl_in_reward and needs_reference) or alg.tis_cap > 0:
                    old_logp = logprobs_in_micro_batches(actor, batch, mbs, temp)
                if alg.tis_cap > 0:  # the engines report raw log-probs: compare like with like
                    raw_logp = old_logp if temp == 1 else logprobs_in_micro_batches(actor, batch, mbs)
                if critic is not None:
                    old_values = values_in_micro_batches(critic, batch, recipe.micro_batch_size)
            # 5. advantages and the update
            kl_tokens = None
            if alg.kl_in_reward and needs_reference:
                kl_tokens = sequence_kl(old_logp, ref_logp, batch.loss_mask, alg.kl_estimator)
            advantages, returns, adv_stats = token_advantages(
                alg.estimator, rewards, batch.to("cpu"), kl=None if kl_tokens is None else kl_tokens.cpu(),
                kl_coef=alg.kl_coef if kl_tokens is not None else 0.0,
                values=None if old_values is None else old_values.cpu(),
                gamma=alg.gamma, lam=alg.lam, stratified_alpha=alg.stratified_alpha,
            )  # fmt: skip
            advantages = advantages.to(device)
            returns = None if returns is None else returns.to(device)
            trained_advantages, tis_stats = advantages, dict[str, torch.Tensor]()
            if alg.tis_cap > 0:
                # Weights >= 0 scale each token's clipped surrogate exactly (policy.offpolicy);
                # the logged advantages stay the estimator's.
                rollout_logp = collate_rollout_logprobs(result.trajectories).to(device)  # [B, L]
                tis_weights, tis_stats = truncated_is_weights(raw_logp, rollout_logp, alg.tis_cap, batch.loss_mask)
                trained_advantages = advantages * tis_weights  # [B, L], 0 where not trained
            update_began = time.perf_counter()
            losses = update(batch, trained_advantages, None if not reused else old_logp, ref_logp, returns, old_values, step)
            sync_rollout_weights()
            update_s = time.perf_counter() - update_began
            # 6. metrics, curriculum feedback, validation, checkpoint
            tokens = float(batch.attention_mask.sum())
            metrics = {
                **scored.stats,
                **result.metrics,
                **losses,
                **{f"advantages/{k}": float(v) for k, v in adv_stats.items()},
                **{f"offpolicy/{k}": float(v) for k, v in tis_stats.items()},
                "advantages/mean": float((advantages * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)),
                "curriculum/p_noise": p_noise,
                "time/rollout_s": rollout_s,
                "time/search_s": result.timings["time/search_s"],
                "time/update_s": update_s,
                "optim/lr": scheduler.get_last_lr()[0],
            }
            metrics = mean_over_ranks(metrics, world)
            step_s = time.perf_counter() - began
            metrics["perf/tokens_per_s"] = tokens * world / step_s
            metrics["time/step_s"] = step_s
            metrics["data/position"] = float(position)
            metrics["data/epoch"] = float(position // len(train_data))
            schedule.observe(metrics)
            done = step + 1
            if validating and (done % recipe.eval_every == 0 or done == recipe.steps):
                metrics.update(validate())
            metrics.update(_search_usage(ledger, run_usage, world))
            if logger is not None:
                logger.log(done, metrics)
                if recipe.trajectory_samples and (step % recipe.trajectory_every == 0 or done == recipe.steps):
                    logger.log_trajectories(done, _trajectory_rows(result.trajectories, scored.total, p_noise, recipe))
                accounting.write_cost(run_dir, previous_cost, run_usage)
                progress.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}", p_noise=f"{p_noise:.2f}",
                    kl=f"{metrics.get('losses/kl', 0.0):.4f}", s=f"{step_s:.1f}",
                )  # fmt: skip
            if recipe.save_every and done % recipe.save_every == 0:
                last_dir, last_saved = save(done, position), done
    except ServiceError as err:
        if logger is not None:
            logger.close()
        kept = f"{last_dir} (step {last_saved})" if last_dir is not None else "none: no checkpoint was written yet"
        raise ServiceError(
            f"training stopped in step {step + 1}/{recipe.steps}: {err}\nNothing of that step was saved; "
            f"the last good checkpoint is {kept}. Bring the service back and run the same command to "
            "resume from it."
        ) from err

    # ------------------------------------------------------------------ cleanup
    if last_saved != recipe.steps:
        save(recipe.steps, position)
    if logger is not None:
        logger.close()
    if not metrics and rank == 0:  # a finished run resumed: report what it logged last
        rows = read_metrics(run_dir)
        metrics = {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
    if rank == 0:
        line = accounting.simulator_line(accounting.merged_totals(previous_cost, run_usage))
        if line:
            print(f"simsearch train: {line}", flush=True)
    return metrics


def _rollout_settings(recipe: TrainRecipe, search: SearchConfig) -> RolloutSettings:
    rollout = recipe.rollout
    return RolloutSettings(
        template=rollout.template,  # type: ignore[arg-type]  # checked by the recipe
        max_turns=rollout.max_turns,
        max_obs_tokens=rollout.max_obs_tokens,
        max_context_tokens=rollout.max_context_tokens,
        top_k=search.top_k,
        rendering=search.rendering,  # type: ignore[arg-type]
        self_search_real_share=rollout.self_search_real_share,
    )


def _search_usage(ledger: Ledger, run_usage: dict[str, EngineUsage], world: int) -> dict[str, float]:
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


def _trajectory_rows(
    trajectories: list[Trajectory], rewards: list[float], p_noise: float, recipe: TrainRecipe
) -> list[dict[str, Any]]:
    """The first `trajectory_samples` trajectories of this process's step, group by group.

    Rows hold the question, gold answers, group and sample index, reward, p_noise, and what
    `eval.report.trajectory_sample` keeps of an evaluation sample (turns with queries and
    documents, answer), with the answer's scores under the recipe's reward normalization.
    """
    rows = []
    for index, trajectory in enumerate(trajectories[: recipe.trajectory_samples]):
        example = trajectory.example
        sample = report.trajectory_sample(trajectory)
        sample["scores"] = report.score_answer(
            trajectory.answer, example.golden_answers, normalization=recipe.reward.normalization
        )
        rows.append(
            {
                "id": example.id,
                "question": example.question,
                "golden_answers": list(example.golden_answers),
                "data_source": example.data_source,
                "group": trajectory.prompt_id,
                "sample": index % recipe.rollout.group_size,
                "reward": float(rewards[index]),
                "p_noise": p_noise,
                **sample,
            }
        )
    return rows


def _derived_seed(seed: int, purpose: str, step: int, rank: int) -> int:
    """A seed for one (purpose, step, process): resumed runs draw exactly what they would have."""
    return random.Random(f"{purpose}:{seed}:{step}:{rank}").randrange(2**31)


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"
