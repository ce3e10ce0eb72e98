"""`simsearch train`: curriculum RL of a search agent (ZeroSearch, SSRL, Search-R1 baselines).

Set-up (processes, data, models, engines, resume) → loop → clean-up. One step: this process's
share of `prompts_per_step` questions; p_noise from the curriculum; rollouts and rewards
(`policy.step.sample_step`, with DAPO's dynamic sampling `policy.sampling`); reference / old
log-probs and values (`policy.update.forward_passes`); advantages; the update and the weight
sync; log, validate every `eval_every` steps, the health monitor's rules (`training.health`: an alarm
warns, stops or rolls back, `health.on_alarm`), checkpoint every `save_every` steps.

Launch:
    simsearch train recipes/train/tiny_cpu.yaml
    torchrun --nproc_per_node 2 -m simsearch.cli train RECIPE deepspeed.stage=3
    deepspeed --num_gpus 8 --no_local_rank --module simsearch.cli train RECIPE

Run directory: `recipe.yaml`, `metrics.jsonl` (+ `tensorboard/`), `cost.json` (totals over every
invocation), `trajectories.jsonl` (for `simsearch view`), `health.jsonl` (the monitor's alarms and
rollbacks, appended to), `checkpoints/step_N/` (`model/` in
Hugging Face format, full or LoRA adapter; `trainer_state.pt`), with DeepSpeed
`deepspeed/step_N/`. A resumed run replays what an uninterrupted one would have done.
Departures from ZeroSearch's trainer: docs/protocols.md.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from simsearch.commands import preflight
from simsearch.config import TrainRecipe
from simsearch.curriculum.schedules import NoiseSchedule
from simsearch.data.qa import load_qa
from simsearch.errors import NonFiniteError, ServiceError, SimsearchError
from simsearch.factory import train as rl
from simsearch.factory.build import build_schedule, build_search_engine, meter_search_engine
from simsearch.policy import step as steps
from simsearch.policy.records import search_usage, trajectory_rows
from simsearch.policy.rollout import RolloutResult, RolloutStopped
from simsearch.policy.sync import RolloutWeights, sync_rollout_weights
from simsearch.policy.update import Learner, UpdateShape, forward_passes, update
from simsearch.policy.validation import Validation, validate
from simsearch.retrieval import accounting
from simsearch.retrieval.accounting import EngineUsage, Ledger
from simsearch.training import preempt
from simsearch.training.checkpoint import checkpoint_dir, latest_checkpoint, rng_state, set_rng_state
from simsearch.training.distributed import mean_over_ranks
from simsearch.training.health import HEALTH_FILE, STOP_STATUS, Alarm, Monitor, trajectory_signals
from simsearch.training.runlog import METRICS_FILE, RunLogger, read_metrics
from simsearch.training.session import Run, open_run


@dataclass
class _Training:
    """Everything the loop works with, built by `_set_up`."""

    recipe: TrainRecipe
    run: Run
    learner: Learner
    weights: RolloutWeights
    tokenizer: Any
    shape: UpdateShape
    rollouts: steps.Rollouts
    schedule: NoiseSchedule
    share: slice  # this process's questions of each step
    train_data: list
    validation: Validation | None
    ledger: Ledger
    logger: RunLogger | None
    previous_cost: Any
    run_usage: dict[str, EngineUsage]
    monitor: Monitor

    def generation(self) -> Any:  # vLLM runs in its own dtype, maybe in this very thread: leave it be
        return nullcontext() if self.weights.vllm else self.learner.autocast_context()


@dataclass
class _Progress:
    """Where the loop is: the data position, the last checkpoint written, the last step's metrics."""

    position: int
    last_saved: int  # the step of the last checkpoint, -1 before the first
    last_dir: Path | None
    step: int  # the step in flight (0-based), named by the error of a failed step
    metrics: dict[str, float] = field(default_factory=dict)  # stays empty when a finished run is resumed
    rng: dict[str, Any] = field(default_factory=dict)  # the RNG states at the start of the step in flight
    alarms: list[Alarm] = field(default_factory=list)  # the health monitor's new alarms of the last step


class _RollBack(Exception):
    """Raised by the loop when an alarm asks for a rollback (`health.on_alarm=rollback`)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"rollback after step {step}")
        self.step = step


def main(recipe: TrainRecipe) -> dict[str, float]:
    """Trains the policy the recipe describes; returns the last step's metrics.

    On SIGTERM or SIGINT it finishes the step in flight, saves it and exits with status 143
    (`training.preempt`); alone (one process), a step that cannot finish in the grace period is
    abandoned at a turn boundary of its rollout instead, and the last finished step saved. A health
    alarm with `health.on_alarm=stop` saves the step and exits with status 3 (`training.health`);
    with `rollback` the run goes on from the last checkpoint before the alarm, its learning rate scaled.
    """
    t = _set_up(recipe)
    while True:
        run = t.run
        last_saved, last_dir = (run.start, run.checkpoint) if run.checkpoint is not None else (-1, None)
        p = _Progress(int(run.state["data_position"]) if run.state else 0, last_saved, last_dir, run.start)
        last_good = partial(preempt.last_checkpoint_line, run.run_dir)
        with preempt.stop_on_signals(recipe.stop_grace_s, last_good, "simsearch train") as stop:
            try:
                _train(t, p, stop)
            except (ServiceError, NonFiniteError) as err:
                if t.logger is not None:
                    t.logger.close()
                raise _stopped_by(err, recipe, p) from err
            except _RollBack as back:
                t = _roll_back(t, back.step)
                continue
            return _clean_up(t, p.metrics, p.position, p.last_saved)  # a signal now: the final checkpoint is written


def _train(t: _Training, p: _Progress, stop: preempt.Stop) -> None:
    """The loop: a step, its log, validation and periodic checkpoint; a signal ends it after the step.

    Alone, the rollout asks `stop.abandon_at_turn` at each turn boundary (every process would have
    to agree at the same boundary, and their turns do not line up).
    """
    recipe, run = t.recipe, t.run
    progress = tqdm(range(run.start, recipe.steps), initial=run.start, total=recipe.steps, disable=run.rank != 0,
                    desc="train")  # fmt: skip
    should_stop = stop.abandon_at_turn if run.world == 1 else None
    for step in progress:
        p.step, p.rng, began = step, rng_state(), time.monotonic()
        try:
            p.metrics, p.position, p.alarms = _step(t, step, p.position, should_stop)
        except RolloutStopped as stopped:
            _abandon(t, p, stop, stopped.turn)
        if t.logger is not None:
            progress.set_postfix(reward=f"{p.metrics['reward/mean']:.3f}", kl=f"{p.metrics.get('losses/kl', 0.0):.4f}",
                                 p_noise=f"{p.metrics['curriculum/p_noise']:.2f}",
                                 s=f"{p.metrics['time/step_s']:.1f}")  # fmt: skip
        done = step + 1
        if p.alarms:
            _on_alarms(t, p, done)
        if recipe.save_every and done % recipe.save_every == 0:
            p.last_dir, p.last_saved = _save(t, done, p.position), done
        stop.step_s = time.monotonic() - began  # its checkpoint included
        if done < recipe.steps and stop.agreed(run.world):  # every process stops after the same step
            _stop(t, p, stop, done)


def _step(
    t: _Training, step: int, position: int, should_stop: Callable[[], bool] | None
) -> tuple[dict[str, float], int, list[Alarm]]:
    """One training step (rollout, update, weight sync, validation, health, log): its metrics, the next data
    position and the health monitor's new alarms.

    Raises:
        RolloutStopped: `should_stop` said so at a turn boundary; nothing of the step was kept.
    """
    recipe, run = t.recipe, t.run
    began = time.perf_counter()
    p_noise = t.schedule(step)  # the curriculum decides how noisy search is, in every round
    sample = _sample(t, position, p_noise, step, should_stop)
    position, result, scored = position + sample.prompts, sample.result, sample.scored
    rollout_s = time.perf_counter() - began - sample.metrics["time/reward_s"]  # rounds, without scoring
    alg = recipe.algorithm
    batch = steps.step_batch(alg, result.trajectories, t.tokenizer.pad_token_id).to(t.learner.device)
    passes = forward_passes(t.learner, alg, t.shape, batch)
    advantages, trained, returns, stats = steps.step_advantages(
        alg, t.learner, t.shape, scored.total, batch, passes, result, t.tokenizer
    )
    update_began = time.perf_counter()
    losses = update(t.learner, alg, t.shape, batch, trained, passes, returns, step)
    sync_rollout_weights(t.weights)
    health_began = time.perf_counter()
    signals = trajectory_signals(result.trajectories, scored.total, recipe.health.repeat_n)
    health_s = time.perf_counter() - health_began
    metrics = {
        **scored.stats, **result.metrics, **losses, **stats, **sample.metrics, **signals,
        "advantages/mean": float((advantages * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)),
        "curriculum/p_noise": p_noise, "time/rollout_s": rollout_s,
        "time/search_s": result.timings["time/search_s"], "time/update_s": time.perf_counter() - update_began,
        "optim/lr": t.learner.actor.scheduler.get_last_lr()[0],
    }  # fmt: skip
    metrics = _finish_metrics(t, metrics, float(batch.attention_mask.sum()), began, position)
    done = step + 1
    if t.validation is not None and (done % recipe.eval_every == 0 or done == recipe.steps):
        with t.generation():
            metrics.update(validate(t.validation, t.weights.generator, t.tokenizer, run.rank, run.world))
    metrics.update(search_usage(t.ledger, t.run_usage, run.world))
    observed = time.perf_counter()
    alarms = t.monitor.observe(done, metrics)  # the same on every process: its signals are averaged over them
    metrics["time/health_s"] = health_s + time.perf_counter() - observed  # the signals and the rules
    if t.logger is not None:
        _log(t, t.logger, done, metrics, result, scored.total, p_noise)
    return metrics, position, alarms


def _stop(t: _Training, p: _Progress, stop: preempt.Stop, done: int) -> None:
    """After a signal: the finished step saved (if the periodic save did not), the log closed, exit 143."""
    if p.last_saved != done:
        p.last_dir, p.last_saved = _save(t, done, p.position), done
    if t.logger is not None:
        t.logger.close()
    resume = preempt.resume_command("train", t.run.run_dir, resume_false=t.recipe.resume == "false",
                                    world=t.run.world)  # fmt: skip
    preempt.exit_stopped(stop, f"after step {done}/{t.recipe.steps}: checkpoint {p.last_dir}", resume,
                         rank=t.run.rank)  # fmt: skip


def _on_alarms(t: _Training, p: _Progress, done: int) -> None:
    """The step's alarms printed and recorded in health.jsonl; then `health.on_alarm` (a rollback past
    `health.max_rollbacks` stops instead)."""
    health, monitor = t.recipe.health, t.monitor
    action = health.on_alarm
    if action == "rollback" and monitor.rollbacks >= health.max_rollbacks:
        action = "stop"
    if t.run.rank == 0:
        for alarm in p.alarms:
            tqdm.write(f"simsearch train: {alarm.line()}")
        _record_health(t.run.run_dir, [{**alarm.row(), "action": action} for alarm in p.alarms])
    if action == "rollback":
        raise _RollBack(done)
    if action == "stop":
        _health_stop(t, p, done)


def _health_stop(t: _Training, p: _Progress, done: int) -> None:
    """After an alarm: the step saved, the log closed, one line saying why and how to go on; exit status 3."""
    if p.last_saved != done:
        p.last_dir, p.last_saved = _save(t, done, p.position), done
    if t.logger is not None:
        t.logger.close()
    if t.run.rank == 0:
        rules = ", ".join(alarm.rule for alarm in p.alarms)
        rollbacks = f" after {t.monitor.rollbacks} rollback(s)" if t.monitor.rollbacks else ""
        print(f"simsearch train: stopped by the health monitor after step {done}/{t.recipe.steps}{rollbacks} "
              f"({rules}; {t.run.run_dir / HEALTH_FILE}, docs/health.md); checkpoint {p.last_dir}. To go on: "
              f"lower optim.lr (now {t.recipe.optim.lr:g}) and run simsearch train {t.run.run_dir / 'recipe.yaml'} "
              "optim.lr=... resume=force", file=sys.stderr, flush=True)  # fmt: skip
    raise SystemExit(STOP_STATUS)


def _roll_back(t: _Training, alarm_step: int) -> _Training:
    """The run set up again from the last checkpoint before the alarm's window, its learning rate scaled.

    A step's signals measure the weights of the step before it, so the run goes back to the newest
    checkpoint before step `alarm_step - health.window` (none of the window's values came from its
    weights); later checkpoints move to `checkpoints/rolled_back/`; with none left the run starts
    over. The monitor keeps its count of rollbacks and the scale across the reload.
    """
    rollbacks, scale = t.monitor.rollbacks + 1, t.monitor.lr_scale * t.recipe.health.lr_scale
    if t.logger is not None:
        t.logger.close()
    run_dir, recipe = t.run.run_dir, replace(t.recipe, resume="true")  # the reload resumes, whatever started it
    del t  # the models of the abandoned steps go before the reloaded ones arrive
    kept = latest_checkpoint(run_dir)
    while kept is not None and int(kept.name.split("_")[1]) >= alarm_step - recipe.health.window:
        _set_aside(kept)
        kept = latest_checkpoint(run_dir)
    t = _set_up(recipe)
    t.monitor.rollbacks, t.monitor.lr_scale = rollbacks, scale
    _scale_lr(t.learner, scale)
    line = (f"health: rolled back to step {t.run.start} ({kept or 'the initial policy'}) with the learning rate "
            f"x{scale:g} (rollback {rollbacks} of {recipe.health.max_rollbacks})")  # fmt: skip
    tqdm.write(f"simsearch train: {line}")
    _record_health(run_dir, [{"step": alarm_step, "action": "rolled_back", "to_step": t.run.start, "lr_scale": scale,
                              "line": line}])  # fmt: skip
    return t


def _set_aside(checkpoint: Path) -> None:
    """Moves a checkpoint a rollback abandons to `checkpoints/rolled_back/` (a numbered name if taken)."""
    target = checkpoint.parent / "rolled_back" / checkpoint.name
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"{checkpoint.name}.{n}")
    target.parent.mkdir(exist_ok=True)
    checkpoint.rename(target)


def _scale_lr(learner: Learner, scale: float) -> None:
    """Each trained model's base learning rate set to the recipe's x `scale`, from the schedule's position on."""
    for model in (learner.actor, learner.critic):
        if model is None or scale == 1.0:
            continue
        scheduler, groups = model.scheduler, model.optimizer.param_groups
        scheduler.base_lrs = [group["initial_lr"] * scale for group in groups]
        lrs = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas,
                                                                          strict=True)]  # fmt: skip
        for group, lr in zip(groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs  # what get_last_lr reports


def _record_health(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    with (run_dir / HEALTH_FILE).open("a", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)


def _abandon(t: _Training, p: _Progress, stop: preempt.Stop, turn: int) -> None:
    """After a signal, at a turn boundary: the step in flight dropped, the last finished one saved, exit 143.

    Nothing of the dropped step was kept (model, optimizer, curriculum, data position); its
    checkpoint holds the RNG states of the dropped step's start, so a resume replays that step.
    Its searches were made: they count in `cost.json`.
    """
    done = p.step
    if p.last_saved != done and done > 0:
        set_rng_state(p.rng)
        p.last_dir, p.last_saved = _save(t, done, p.position), done
    search_usage(t.ledger, t.run_usage, t.run.world)
    if t.logger is not None:
        accounting.write_cost(t.run.run_dir, t.previous_cost, t.run_usage)
        t.logger.close()
    kept = f"checkpoint {p.last_dir}" if p.last_dir is not None else "no step had finished, nothing saved"
    what = (f"in step {done + 1}/{t.recipe.steps}, which could not finish in the grace period: abandoned at a "
            f"turn boundary (before turn {turn}), replayed on resume; {kept}")  # fmt: skip
    resume = preempt.resume_command("train", t.run.run_dir, resume_false=t.recipe.resume == "false",
                                    world=t.run.world)  # fmt: skip
    preempt.exit_stopped(stop, what, resume, rank=t.run.rank)


def _stopped_by(err: ServiceError | NonFiniteError, recipe: TrainRecipe, p: _Progress) -> SimsearchError:
    """The error that ends a failed step: the step, the last good checkpoint, and what to do."""
    kept = f"{p.last_dir} (step {p.last_saved})" if p.last_dir is not None else "none: no checkpoint was written yet"
    where = f"training stopped in step {p.step + 1}/{recipe.steps}: {err}"
    if isinstance(err, NonFiniteError):  # one line: the rows, the step, the checkpoint and the advice
        fixes = [f"lower optim.lr (now {recipe.optim.lr:g})"]
        fixes += ["set bf16=false (float32 instead of bf16)"] if recipe.bf16 else []
        fixes += [] if recipe.policy.model.dtype == "float32" else ["set policy.model.dtype=float32"]
        return NonFiniteError(
            f"{where}. Nothing of that step was saved; the last good checkpoint is {kept}. To go on: "
            f"{', or '.join(fixes)}, then run the same command to resume from that checkpoint",
            err.rows,
        )
    return ServiceError(
        f"{where}\nNothing of that step was saved; the last good checkpoint is {kept}. Bring the service back "
        "and run the same command to resume from it."
    )


def _set_up(recipe: TrainRecipe) -> _Training:
    """Processes, data, models, engines and the resumed state, in the order that seeds them alike.

    The paths and a resume are checked first, and the run directory is written to only once the
    data, the models and the engines have loaded.
    """
    preflight.set_threads(recipe.threads)
    preflight.check_paths(recipe)
    changes = preflight.check_resume(recipe, Path(recipe.run_dir), preflight.TRAIN_UNCOMPUTED)
    run = open_run(recipe.run_dir, seed=recipe.seed, deepspeed=recipe.deepspeed.stage > 0,
                   resume=recipe.resume != "false", task="training")  # fmt: skip
    train_data = [example for path in recipe.data.train for example in load_qa(path)]
    val_data = [ex for path in recipe.data.val for ex in load_qa(path)[: recipe.data.val_size or None]]
    share, shape, learner, weights, tokenizer = rl.load_learner(recipe, run)
    ledger = Ledger()
    search = meter_search_engine(build_search_engine(recipe.search, seed=recipe.seed + run.rank), recipe.search,
                                 ledger, "search")  # fmt: skip
    validation = rl.build_validation(recipe, val_data, search, ledger) if recipe.eval_every and val_data else None
    rollouts = rl.rollouts(recipe, weights.generator, tokenizer, search, run.rank)
    schedule = build_schedule(recipe.curriculum, recipe.steps)
    sync_rollout_weights(weights)  # a resumed DeepSpeed run restored its weights after the copy was taken
    if run.state is not None:
        schedule.load_state_dict(run.state["curriculum"])
    monitor = _monitor(recipe, run, learner)
    run.restore_rng()
    previous_cost = preflight.start_records(recipe, run.run_dir, run.start, changes, "train") if run.rank == 0 else None
    logger = RunLogger(run.run_dir, resume_step=run.start, tensorboard=recipe.tensorboard,
                       wandb_project=recipe.wandb_project) if run.rank == 0 else None  # fmt: skip
    return _Training(recipe, run, learner, weights, tokenizer, shape, rollouts, schedule, share, train_data,
                     validation, ledger, logger, previous_cost, {}, monitor)  # fmt: skip


def _monitor(recipe: TrainRecipe, run: Run, learner: Learner) -> Monitor:
    """The health monitor, resumed with its learning-rate scale; a fresh start empties health.jsonl."""
    monitor = Monitor(recipe.health)
    if run.state is not None and "health" in run.state:  # checkpoints written before the monitor have none
        monitor.load_state_dict(run.state["health"])
        _scale_lr(learner, monitor.lr_scale)
    if recipe.resume == "false" and run.rank == 0:
        (run.run_dir / HEALTH_FILE).unlink(missing_ok=True)
    return monitor


def _sample(
    t: _Training, position: int, p_noise: float, step: int, should_stop: Callable[[], bool] | None
) -> steps.StepSample:
    """The step's rollout rounds from data position `position`, each search with p_noise (`steps.sample_step`)."""
    rollout = partial(steps.rollout_round, t.rollouts, p_noise, step, should_stop=should_stop)
    with t.generation():
        sample = steps.sample_step(t.rollouts.recipe, rollout, t.train_data, position, t.share, t.run.world,
                                   t.shape.minibatch_rows)  # fmt: skip
    if t.weights.vllm and t.recipe.policy.enable_sleep_mode:
        t.weights.generator.sleep()  # its GPU memory to the update; sync and the next rollout wake it
    return sample


def _finish_metrics(
    t: _Training, metrics: dict[str, float], tokens: float, began: float, position: int
) -> dict[str, float]:
    """Averaged over processes, with throughput and data position; the curriculum observes them."""
    metrics = mean_over_ranks(metrics, t.run.world)
    step_s = time.perf_counter() - began
    metrics["perf/tokens_per_s"] = tokens * t.run.world / step_s
    metrics["time/step_s"] = step_s
    metrics["data/position"] = float(position)
    metrics["data/epoch"] = float(position // len(t.train_data))
    t.schedule.observe(metrics)
    return metrics


def _log(t: _Training, logger: RunLogger, done: int, metrics: dict[str, float], result: RolloutResult,
         rewards: list[float], p_noise: float) -> None:  # fmt: skip
    recipe = t.recipe
    logger.log(done, metrics)
    if recipe.trajectory_samples and ((done - 1) % recipe.trajectory_every == 0 or done == recipe.steps):
        rows = trajectory_rows(
            result.trajectories, rewards, p_noise, samples=recipe.trajectory_samples,
            group_size=recipe.rollout.group_size, normalization=recipe.reward.normalization,
        )  # fmt: skip
        logger.log_trajectories(done, rows)
    accounting.write_cost(t.run.run_dir, t.previous_cost, t.run_usage)


def _save(t: _Training, done: int, position: int) -> Path:
    extra = {"curriculum": t.schedule.state_dict(), "data_position": position, "health": t.monitor.state_dict()}
    return rl.save_training(t.recipe, t.run, t.learner, t.tokenizer, done, extra)


def _clean_up(t: _Training, metrics: dict[str, float], position: int, last_saved: int) -> dict[str, float]:
    """The final checkpoint, the run log closed; a finished run resumed reports what it logged last."""
    recipe, run = t.recipe, t.run
    final = (
        _save(t, recipe.steps, position) if last_saved != recipe.steps else checkpoint_dir(run.run_dir, recipe.steps)
    )
    if t.logger is not None:
        t.logger.close()
    if run.rank == 0:
        if not metrics:  # a finished run resumed: what it logged last
            rows = read_metrics(run.run_dir)
            metrics = {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
        line = accounting.simulator_line(accounting.merged_totals(t.previous_cost, t.run_usage))
        if line:
            print(f"simsearch train: {line}", flush=True)
        print(f"simsearch train: final checkpoint {final / 'model'} (metrics in {run.run_dir / METRICS_FILE})",
              flush=True)  # fmt: skip
    return metrics
