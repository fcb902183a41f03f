"""The training loop: data parallel over torchrun ranks (DDP or a sharded strategy, see strategies/),
gradient accumulation, mixed precision (bf16, or fp16 with loss scaling: precision.py), optional
torch.compile, AdamW or Muon (strategies/optimizer.py) on a warmup + decay schedule (schedule.py),
clipping, metrics, evaluation and checkpoints.

    torchrun --standalone --nproc-per-node 8 -m <package> train [key=value ...]
    <package> launch devmachine            # builds that torchrun command for you

Each rank reads its own slice of every global batch; the stream position follows from the step,
so a resumed run reads exactly the data it would have read.

Faults: a resume restores every rank's state (checkpoint.py), so the run continues bit for bit
as if never stopped; SIGTERM/SIGUSR1 make all ranks save at the next logging or checkpoint step
(at most logging.every_steps steps later) and exit with EXIT_PREEMPTED (preemption.py); torchrun's
--max-restarts brings a crashed rank back, which then resumes from the latest intact checkpoint.
Before anything is written, rank 0 claims the output folder for this job (run_lock.py) and refuses
a folder that holds another run or lacks room for the next checkpoint
(checkpoint_files.refuse_to_start); every rank follows its verdict.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import os
import sys
import threading
import time
from pathlib import Path

import torch

from ..checkpoints import checkpoint, checkpoint_files
from ..data.epochs import derived_steps_line, with_derived_steps
from ..data.splits import open_split
from ..data.tokens import (
    TokenData,
    bos_id,
    data_fingerprint,
    load_tokenizer,
    micro_batch_start,
    read_meta,
    token_byte_lengths,
)
from ..evaluation import tasks
from ..evaluation.evaluate import evaluate, format_scores, val_scores
from ..models.sample_dropout import sample_keys, samples
from ..planning.rules import require_valid
from ..runtime import faults
from ..runtime.distributed import (
    DistInfo,
    autocast_context,
    collective_timeout,
    finish,
    init_distributed,
    print0,
    share_from_main,
    shutdown,
    start_timeout,
)
from ..runtime.run_context import Run, resolve_run
from ..runtime.unrecoverable import SharedFailure, raise_on_every_rank
from ..settings.batch import at_world_size, scaling_note
from ..settings.config import Config, ConfigError, changed, save_config
from ..settings.precision import fp8_note
from ..strategies import build_strategy
from ..tracking import check_installed
from . import preemption, prefetch, run_lock, schedule
from .divergence import DivergenceGuard, weights_are_finite
from .metrics import MetricsLogger, format_step, mfu, peak_flops


def micro_batches(data: TokenData, step: int, accum: int, data_rank: int, b, seed: int) -> list[tuple]:
    """The (inputs, targets, dropout keys) micro batches of one optimizer step for one data-parallel
    rank, on the CPU (training/prefetch.py reads them ahead and moves them); the keys name the samples by
    their place in the stream (models/sample_dropout.py). b: the batch sizes (the Run's, or cfg.batch)."""
    batches = []
    for micro in range(accum):
        first = micro_batch_start(step, micro, data_rank, b.global_batch_size, b.micro_batch_size, accum)
        x, y = data.batch(first, b.micro_batch_size)
        batches.append((x, y, sample_keys(seed, step, first, b.micro_batch_size)))
    return batches


def run_training(cfg: Config) -> int:
    info = init_distributed(cfg.run.device, collective_timeout(cfg.run), start_timeout(cfg.run))
    try:
        run = start(cfg, info)
        lock, resume = claim_output_dir(run)
        try:
            code = _train(run, resume, lock)
        finally:
            if lock is not None:
                lock.release()
        finish()
        return code
    except SharedFailure:
        # Every rank raised it at the same point: they end together, or a rank that leaves at once
        # could tear down a peer still completing the collective that shared it (Gloo aborts it).
        finish()
        raise
    finally:
        shutdown()


def start(cfg: Config, info: DistInfo) -> Run:
    """The run resolved once, before the folder is claimed (a mistake leaves no trace there): the
    config checked, at this world's global batch (batch.scaling=weak) and with the steps
    schedule.epochs or tokens_per_param give; then what the run is here (run_context.resolve_run),
    which everything below reads."""
    require_valid(cfg, info.world_size)
    check_installed(cfg)  # a chosen tracker's package, on every rank
    cfg = at_world_size(cfg, info.world_size)
    cfg = with_derived_steps(cfg, Path(cfg.data.dir))
    return resolve_run(cfg, info, training=True)


def claim_output_dir(run: Run) -> tuple[run_lock.RunLock | None, bool]:
    """Collective: rank 0 holds run.output_dir for this job (or finds its supervisor holding it),
    refuses a folder of another run under checkpoint.resume=false and a disk without room; every
    rank ends with rank 0's verdict. Returns the lock (rank 0) and whether to resume: a restart of
    the job that started the run in this folder continues it whatever checkpoint.resume says."""
    cfg = run.cfg
    out, lock, verdict = Path(cfg.run.output_dir), None, None
    if run.is_main:
        try:
            lock = run_lock.acquire(out, run_lock.job_identity(os.environ))
            resume = cfg.checkpoint.resume or run_lock.last_job(out) == lock.job
            checkpoint_files.refuse_to_start(out, resume)
            verdict = (None, resume)
        except ConfigError as exc:
            if lock is not None:
                lock.release()
                lock = None
            verdict = (str(exc), False)
    message, resume = share_from_main(verdict)
    if message:
        raise_on_every_rank(message, run.is_main, key="run.output_dir")
    return lock, resume


def saved_config(cfg: Config, path: Path) -> None:
    """The run's config.yaml, which --config reads back: under schedule.epochs or tokens_per_param as
    written (max_steps null; the steps derived, in its first line), since a config setting two is refused."""
    s = cfg.schedule
    if s.epochs is None and s.tokens_per_param is None:
        save_config(cfg, path)
        return
    how = (
        f"schedule.epochs={s.epochs:g}" if s.epochs is not None else f"schedule.tokens_per_param={s.tokens_per_param:g}"
    )
    gave = f"{how} gave {s.max_steps} steps on {cfg.data.dir}"
    save_config(changed(cfg, **{"schedule.max_steps": None}), path, comment=gave)


def _train(run: Run, resume: bool, lock: run_lock.RunLock | None) -> int:
    watchdog = first_step_watchdog(run.cfg, run.rank)
    try:
        return _train_steps(run, resume, lock, watchdog)
    finally:
        if watchdog is not None:
            watchdog.cancel()


def _train_steps(run: Run, resume: bool, lock: run_lock.RunLock | None, watchdog: threading.Timer | None) -> int:
    cfg, accum, precision, data_parallel = run.cfg, run.grad_accum, run.precision, run.data_parallel_size
    device, T = run.device, cfg.model.sequence_len
    out = Path(cfg.run.output_dir)
    ckpt_dir = out / "checkpoints"
    data_dir = Path(cfg.data.dir)
    meta = read_meta(data_dir)
    trained_on = data_fingerprint(data_dir, meta)  # recorded in every checkpoint of this run
    train_data = open_split(cfg, data_dir, "train", run.family)
    val_data = open_split(cfg, data_dir, "val", run.family)
    tokenizer = load_tokenizer(data_dir / meta["tokenizer"])
    token_bytes = torch.from_numpy(token_byte_lengths(tokenizer)).to(device)
    # The task bundle is read and checked before anything is written (a broken one stops the start).
    task_list = tasks.load_bundle(tasks.bundle_path(cfg)) if cfg.eval.tasks_every_steps else []
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    torch.manual_seed(cfg.run.seed)  # same init on every rank; DDP also broadcasts rank 0's weights
    # Builds and wraps the model, owns optimizer and checkpoints.
    strategy = build_strategy(run, meta["vocab_size"], resume)
    num_params, flops_per_token, peak = strategy.num_params, strategy.flops_per_token, peak_flops(device, precision)
    start_step = strategy.resume(ckpt_dir, resume)
    # Under fp16 an overflowing gradient is the loss scaler's to skip; a pipeline engine reports the
    # norm after its update (or none): there the guard judges the loss.
    guard = DivergenceGuard(
        cfg.optim, device, run.is_main, judges_norm=precision != "fp16" and not strategy.consumes_batches
    )
    guard.load_state_dict(strategy.resumed_state.get("divergence"))
    stop = preemption.StopRequest(cfg.cluster.stop_grace_seconds, cfg.logging.every_steps)
    if run.is_main:  # the first writes of this run to the folder, after every refusal
        out.mkdir(parents=True, exist_ok=True)
        run_lock.record_job(out, lock.job)
        saved_config(cfg, out / "config.yaml")
        preemption.clear_marker(out)
    autocast = autocast_context(device, precision)

    s = cfg.schedule
    tokens_per_step = run.global_batch_size * T
    print0(
        f"model {cfg.model.size}: {num_params:,} parameters | {run.world_size} process(es) on {device.type} | "
        f"global batch {run.global_batch_size} = micro {run.micro_batch_size} x accum {accum} x "
        f"{data_parallel} data-parallel ranks | "
        f"{tokens_per_step:,} tokens/step | steps {start_step}->{s.max_steps} | {strategy.describe()} | "
        f"precision {precision}{fp8_note(cfg.run.fp8, device.type == 'cuda')} | {scaling_note(cfg, run.world_size)}"
    )
    derived = derived_steps_line(cfg, data_dir)
    if derived:
        print0(derived)
    if start_step >= s.max_steps:
        print0(f"already trained to step {start_step} (schedule.max_steps={s.max_steps}); nothing to do")
        return 0

    def newest_checkpoint():
        """Collective (every rank asks at once, about to stop): rank 0's reading, the message every rank raises."""
        return share_from_main(checkpoint.named_by_latest(ckpt_dir) if run.is_main else None)

    def save(done: int) -> None:
        guard.check(newest_checkpoint)
        # Belt and braces: no checkpoint of weights that are not finite, whatever the guard let through.
        if not bool(weights_are_finite(strategy.local_weights(), device)):
            raise_on_every_rank(
                f"the weights are not finite at step {done}: nothing saved; the newest checkpoint, "
                f"{newest_checkpoint()}, is the one to resume from with a lower learning rate",
                run.is_main,
                key="optim.lr",
            )
        positions = [
            micro_batch_start(done, 0, r, run.global_batch_size, run.micro_batch_size, accum)
            for r in range(data_parallel)
        ]
        state = checkpoint.run_state(cfg, done, run.world_size, data_parallel, positions, trained_on)
        strategy.save(ckpt_dir, done, {**state, "divergence": guard.state_dict()})

    # Records after the checkpoint's step were written by the attempt that died: they are redone.
    logger = MetricsLogger(out, run.is_main, cfg, resume_step=start_step)
    window = StepWindow()

    def train_step(step: int, batches: list) -> tuple[float, torch.Tensor]:
        """Forward, backward and the update (unless the guard refuses it): the step's rate and norm."""
        faults.before_step(run.rank, step)
        point = schedule.at(step, cfg.schedule)
        strategy.set_schedule(point)
        if strategy.consumes_batches:  # a pipeline engine schedules the micro batches over its stages itself
            loss_sum, grad_norm = strategy.train_batch(batches)
            guard.observe_loss(loss_sum)
            guard.judge(step, None)
        else:
            loss_sum = torch.zeros((), device=device)
            for micro, (x, y, keys) in enumerate(batches):
                # DDP: all-reduce only on the last micro step. Dropout draws for these samples.
                with strategy.micro_context(micro), samples(keys):
                    with autocast:
                        loss = strategy.runnable(x, y)
                    strategy.backward(faults.overflow(loss, step, micro), micro)
                loss_sum += loss.detach()
            guard.observe_loss(loss_sum / accum)
            # clip, update unless the guard says not to, clear; the norm before clipping
            grad_norm = strategy.step(functools.partial(guard.judge, step))
        return strategy.peak_lr * point.lr_factor, grad_norm

    def log_step(done: int, lr: float, grad_norm: torch.Tensor) -> None:
        """The metrics line: the one place between logging steps that waits for the device (.item())."""
        skipped = guard.check(newest_checkpoint)  # also waits for the device
        step_time = window.step_time()
        record = {
            "step": done,
            "loss": guard.loss.item(),
            "lr": lr,
            "grad_norm": grad_norm.item(),
            "tokens_per_sec": tokens_per_step / step_time,
            "mfu": mfu(flops_per_token, tokens_per_step / step_time, run.world_size, peak),
            "step_time": step_time,
            "tokens": done * tokens_per_step,
            **strategy.loss_scaling(),  # fp16: loss_scale, skipped (steps of the run so far)
            **({"not_applied": skipped} if skipped else {}),  # the divergence guard's, in this attempt
        }
        logger.log(record)
        print0(format_step(record, s.max_steps))

    def eval_step(done: int) -> None:
        if strategy.consumes_batches:  # the pipeline's stages evaluate together
            result = strategy.evaluate(val_data, run.micro_batch_size, cfg.logging.eval_batches)
        else:
            batch, batches = run.micro_batch_size, cfg.logging.eval_batches
            result = evaluate(strategy.module, val_data, token_bytes, run, batch, batches, autocast)
        scores = val_scores(result)
        logger.log({"step": done, **scores})
        print0(f"step {done:>6}/{s.max_steps} | {format_scores(scores)}")

    def tasks_step(done: int) -> None:
        result = tasks.evaluate_tasks(
            strategy.module, tokenizer, bos_id(tokenizer), task_list, T, run, autocast, cfg.eval.tasks_max_per_task
        )
        logger.log(tasks.metrics_record(done, result))
        print0(f"step {done:>6}/{s.max_steps} | CORE {result['core']:.4f} ({len(task_list)} tasks)")

    def stop_preempted(done: int, saved: bool) -> int:
        if not saved:
            save(done)
        if run.is_main:
            preemption.write_marker(out, done, stop.signal_name, str(checkpoint.named_by_latest(ckpt_dir)))
        print0(
            f"preempted ({stop.signal_name or 'signal on another rank'}): checkpoint of step {done} saved; "
            f"the same command resumes from it (exit code {preemption.EXIT_PREEMPTED})"
        )
        logger.close()
        return preemption.EXIT_PREEMPTED

    # The next steps' batches are read on a thread while this one computes; leaving the loop stops it.
    load = functools.partial(
        micro_batches, train_data, accum=accum, data_rank=strategy.data_rank, b=run, seed=cfg.run.seed
    )
    every, eval_every, tasks_every = cfg.logging.every_steps, cfg.logging.eval_every_steps, cfg.eval.tasks_every_steps
    stop.start(start_step)
    for step, batches in prefetch.steps(load, range(start_step, s.max_steps), device):
        if step == start_step + 1 and watchdog is not None:  # the first step is done, and agreed on
            watchdog.cancel()
        lr, grad_norm = train_step(step, batches)
        done, last = step + 1, step + 1 == s.max_steps
        window.steps += 1
        # Only a logging step waits for the device: between two of them the host queues work ahead.
        logged = done % every == 0 or last
        if logged:
            log_step(done, lr, grad_norm)
            window.restart()
        if (eval_every and done % eval_every == 0) or last:
            eval_step(done)
            window.restart()  # tokens/s counts training steps only
        if task_list and done % tasks_every == 0:
            tasks_step(done)
            window.restart()
        saved = (cfg.checkpoint.every_steps and done % cfg.checkpoint.every_steps == 0) or last
        if saved:
            save(done)
            window.restart()
        # A collective that waits for every rank: held at the logging steps, which wait for the device
        # anyway (every rank knows which they are), at checkpoints, which would save again otherwise,
        # and where slow steps would make logging.every_steps outlast the grace (preemption.py).
        if not last and (logged or saved or stop.due(done)) and stop.agreed(done):
            return stop_preempted(done, saved)

    logger.close()
    left_out = guard.check(newest_checkpoint)
    note = f"; {left_out} step{'s were' if left_out > 1 else ' was'} not applied (divergence guard)" if left_out else ""
    print0(f"done: metrics in {out / 'metrics.jsonl'}, checkpoints in {ckpt_dir}{note}")
    return 0


class StepWindow:
    """The training steps since the time was last taken: tokens/s and MFU count training only, so
    evaluation, tasks and saves start a new window."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.start, self.steps = time.perf_counter(), 0

    def step_time(self) -> float:
        return (time.perf_counter() - self.start) / self.steps


def first_step_watchdog(cfg: Config, rank: int) -> threading.Timer | None:
    """A timer that, unless cancelled within run.first_step_timeout_minutes, prints this rank's Python
    stacks (what it waits in: a collective, a lock, a load) and ends the process with exit 1: a job
    that hangs at its start would otherwise hold its GPUs silently until someone looks."""
    minutes = cfg.run.first_step_timeout_minutes
    if not minutes:
        return None

    def expired() -> None:
        print(
            f"error: rank {rank}: no first step {minutes:g} minutes after the start "
            "(run.first_step_timeout_minutes); its stacks:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(1)  # the main thread may sit in a collective that never returns

    timer = threading.Timer(minutes * 60, expired)
    timer.daemon = True
    timer.start()
    return timer


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`train` takes the config and its overrides only."""


def run(cfg: Config, args: argparse.Namespace) -> int:
    return run_training(cfg)
