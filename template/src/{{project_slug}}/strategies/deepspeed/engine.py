"""DeepSpeed strategy: ZeRO stage 0-3 with optional CPU offload, configured from train.yaml.

    <package> train run.strategy=deepspeed deepspeed.zero_stage=3 deepspeed.offload_optimizer=true

train.yaml is the one source of truth: the DeepSpeed config dict is derived from it at start
(batch sizes always consistent: train_batch_size = micro x accum x data-parallel size) and written
to run.output_dir/deepspeed_config.json for reference. The learning rate comes from our schedule
each step (no DeepSpeed scheduler). Runs under torchrun; DeepSpeed reuses the process group.
Checkpoints are DeepSpeed's: a folder per step `step_XXXXXXXX/` under output_dir/checkpoints,
written by every rank (ZeRO shards), plus a `latest` file naming the newest folder (DeepSpeed's own
format, so its tools such as zero_to_fp32.py read it). Every rank writes into
checkpoints/.staging/<tag>/ and fsyncs its files; only then rank 0 renames the folder into place and
replaces `latest`, so a crash mid-save leaves the previous checkpoint the one that loads. Before
the rename the ranks hash the folder's files between them and rank 0 writes its manifest.json
(checkpoint_files.py: run id, sizes, sha256), which a resume verifies the same way, shared out. A
save that finds no room on any rank stops every rank with one line; the previous checkpoint stays.
The rename needs run.output_dir on storage every node sees (it has to be, to resume anywhere).
Precision (precision.py): bf16 and fp16 put DeepSpeed's "bf16" or "fp16" section on (16-bit weights,
fp32 master copies in the optimizer); fp16 brings DeepSpeed's dynamic loss scaler, whose state and
skipped-step count DeepSpeed keeps in its own checkpoint.
Clipping: ZeRO 1-3 take each gradient's norm in fp64 and clip by their global norm; ZeRO 0 in fp32
computes the same number here and clips by it, as DDP does (common.py): all log one norm to 1e-7.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from ...checkpoints import checkpoint, checkpoint_files
from ...runtime import process_exit
from ...runtime.distributed import barrier, gather_objects, print0, share_from_main
from ...runtime.run_context import Run
from ...runtime.unrecoverable import raise_on_every_rank
from ...settings.config import Config, ConfigError
from ...settings.packages import require_package
from ...settings.precision import INITIAL_SCALE_POWER, SCALE_WINDOW
from ..common import clip_gradients, compiled, param_groups, skip_step
from . import universal_checkpoint
from .plan import fp16_zero0_refusal

STAGING = checkpoint_files.STAGING  # where a save is written before it is renamed into place


HYSTERESIS = 2  # overflows tolerated in a row before the loss scale halves
MIN_LOSS_SCALE = 1  # the loss scale never drops below this


def import_deepspeed():
    """deepspeed, or a ConfigError saying how to install it (no CUDA toolkit needed). DeepSpeed builds
    the ops it needs on first use (the image installs it with DS_BUILD_OPS=0) through torch's
    cpp_extension, under TORCH_EXTENSIONS_DIR: node-local here unless set, so nodes that share a home
    folder do not build into one folder behind one lock."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"  # otherwise DeepSpeed probes for CUDA and fails
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(tempfile.gettempdir()) / f"torch_extensions-{os.getuid()}"))
    refuse_stale_build_locks(Path(os.environ["TORCH_EXTENSIONS_DIR"]))
    return require_package("deepspeed", "deepspeed", "run.strategy=deepspeed (no CUDA toolkit needed to install it)")


def refuse_stale_build_locks(folder: Path, settle_seconds: float = 1.0) -> None:
    """A ConfigError for an op build's lock that no process on this node holds. torch's cpp_extension
    holds `<op>/lock` open while it builds and removes it when done; a build killed midway (an OOM,
    a pod deleted) leaves it, and every later run waits on it forever without a word. A build that
    ends closes the lock before it removes it, so an unheld lock is looked at again settle_seconds
    later: only the same file, still there and still unheld, is a killed build's."""
    locks = [p for p in folder.glob("*/lock") if p.is_file()] if folder.is_dir() else []
    unheld = {lock: identity for lock in unheld_files(locks) if (identity := file_identity(lock))}
    if not unheld:
        return
    time.sleep(settle_seconds)
    stale = [lock for lock in unheld_files(list(unheld)) if file_identity(lock) == unheld[lock]]
    if stale:
        raise ConfigError(
            f"{stale[0]} is the lock of a DeepSpeed op build that was killed (no process on this node holds it): "
            f"the run would wait on it forever; delete it (rm {stale[0]}) and start again"
        )


def unheld_files(paths: list[Path]) -> list[Path]:
    """The paths that no process on this node has open."""
    if not paths:
        return []
    held = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):  # processes come and go while this reads
            held.add(os.readlink(fd))
    return [path for path in paths if str(path.resolve()) not in held]


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(device, inode, change time) of a file, None once it is gone: a lock removed and made again
    by the next build is another file."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_ctime_ns


def zero_compiled(cfg: Config, device) -> tuple[bool, str]:
    """compiled() for a ZeRO stage: stage 3 stays eager, since its partitioned weights are empty
    tensors outside the hooks that gather them, which torch.compile cannot trace (on an H200 the
    trace failed on a (0,)-shaped weight)."""
    on, note = compiled(cfg.run, device)
    if on and cfg.deepspeed.zero_stage == 3:
        return False, "eager (ZeRO-3's partitioned weights cannot be traced by torch.compile)"
    return on, note


def clipped_by_strategy(zero_stage: int, precision: str) -> bool:
    """ZeRO 0 in fp32: the strategy clips, with the norm DDP and ZeRO 1-3 use (common.py: each
    gradient's norm in fp64); DeepSpeed's own clip there takes them in fp32 (1e-5 off on a CPU) and
    reports none. ZeRO 1-3, and ZeRO 0 in bf16 (DeepSpeed's 16-bit optimizer wrapper), clip and
    report their own norm."""
    return zero_stage == 0 and precision == "fp32"


def deepspeed_config(cfg: Config, accum: int, data_parallel_size: int, device: torch.device, *, precision: str) -> dict:
    """The DeepSpeed config dict derived from train.yaml, the resolved accumulation and precision
    ('bf16', 'fp16' or 'fp32': Run.precision)."""
    b, o, ds = cfg.batch, cfg.optim, cfg.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    if ds.zero_stage in (1, 2):
        # Each gradient is then reduced from where backward left it instead of first being copied into
        # a preallocated bucket: 14% fewer ops dispatched per step (ZeRO-1 987 against 1,146, DDP 875:
        # bench/step_overhead.py), the same bytes moved on the device.
        zero["contiguous_gradients"] = False
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": device.type == "cuda"}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": device.type == "cuda"}
    return {
        "train_micro_batch_size_per_gpu": b.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "train_batch_size": b.micro_batch_size * accum * data_parallel_size,
        "gradient_clipping": 0.0 if clipped_by_strategy(ds.zero_stage, precision) else o.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {
            "enabled": precision == "fp16",
            "loss_scale": 0,  # 0: dynamic
            "initial_scale_power": INITIAL_SCALE_POWER,
            "loss_scale_window": SCALE_WINDOW,
            "hysteresis": HYSTERESIS,
            "min_loss_scale": MIN_LOSS_SCALE,
        },
        "optimizer": {
            "type": "AdamW",
            # torch's AdamW: the DeepSpeed install builds no ops (no CUDA toolkit needed); with
            # offload it would insist on its own compiled CPU Adam unless told otherwise below.
            "params": {
                "lr": o.lr,
                "betas": [o.beta1, o.beta2],
                "eps": o.eps,
                "weight_decay": o.weight_decay,
                "torch_adam": True,
                # One kernel for the whole step, as DDP's optimizer on a GPU (ddp.build_optimizer);
                # DeepSpeed passes it on to torch's AdamW. Offloaded, the step is on the host.
                "fused": device.type == "cuda" and not ds.offload_optimizer,
            },
        },
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,  # our own metrics line does the logging
        "wall_clock_breakdown": False,
    }


_checkpoint_dirs = checkpoint_files.list_folders


def find_latest(folder: Path) -> Path | None:
    """The folder DeepSpeed's `latest` names; if that is missing, the highest step on disk."""
    return checkpoint.find_latest(folder, listing=_checkpoint_dirs)


# What DeepSpeed itself stores beside train.py's client state in *model_states.pt.
DEEPSPEED_KEYS = {
    "module",
    "buffer_names",
    "optimizer",
    "param_shapes",
    "frozen_param_shapes",
    "shared_params",
    "frozen_param_fragments",
    "lr_scheduler",
    "data_sampler",
    "random_ltd",
    "sparse_tensor_module_names",
    "skipped_steps",
    "global_steps",
    "global_samples",
    "dp_world_size",
    "mp_world_size",
    "ds_config",
    "ds_version",
}


def load_model_states(folder: Path) -> dict:
    """A checkpoint folder's model-states file: train.py's client state beside DeepSpeed's own keys
    (and, for ZeRO 0, the module's weights)."""
    # mp_rank_00_*: the data-parallel group's file (pipeline checkpoints add layer_* files beside it).
    files = sorted(folder.glob("mp_rank_00_model_states.pt")) or sorted(folder.glob("*model_states.pt"))
    if not files:
        raise ConfigError(
            f"{folder} is neither a checkpoint file nor a DeepSpeed checkpoint folder "
            "(no *model_states.pt); pass --checkpoint with one of those"
        )
    return torch.load(files[0], map_location="cpu", weights_only=False)


def trained_state(model_states: dict, weights: dict) -> dict:
    """train.py's client state ("step", "config", ...) with "model": the whole model's weights in fp32."""
    client = {k: v for k, v in model_states.items() if k not in DEEPSPEED_KEYS}
    return {**client, "model": {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}}


def read_checkpoint(folder: Path) -> dict:
    """A checkpoint folder this strategy wrote, for one process (eval, sample): see trained_state.
    ZeRO 0 keeps the weights in the model-states file; ZeRO 1-3 weights are consolidated from the
    fp32 partitions of the optimizer shards by DeepSpeed's zero_to_fp32 (on the CPU, any number
    of shards, no process group)."""
    states = load_model_states(folder)
    sharded = any(folder.glob("*optim_states.pt"))  # ZeRO 1-3 write per-rank optimizer shards
    if states.get("ds_config", {}).get("zero_optimization", {}).get("stage", int(sharded)) == 0:
        return trained_state(states, states["module"])
    import_deepspeed()  # sets DS_ACCELERATOR=cpu where there is no GPU, or says how to install
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return trained_state(states, get_fp32_state_dict_from_zero_checkpoint(str(folder.parent), tag=folder.name))


def refuse_unsupported_precision(ds_config: dict, device: torch.device, dtype: str) -> None:
    """One line instead of DeepSpeed's ValueError where its accelerator lacks the 16-bit type (fp16
    on most CPUs: DeepSpeed needs oneDNN's fp16 there), or of silently wrong updates (fp16 at ZeRO 0)."""
    from deepspeed.accelerator import get_accelerator

    if ds_config["fp16"]["enabled"] and ds_config["zero_optimization"]["stage"] == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        raise ConfigError(fp16_zero0_refusal(dtype, name), key="deepspeed.zero_stage")

    for name, supported in (
        ("fp16", get_accelerator().is_fp16_supported),
        ("bf16", get_accelerator().is_bf16_supported),
    ):
        if ds_config[name]["enabled"] and not supported():
            raise ConfigError(
                f"run.dtype={name} with run.strategy=deepspeed: DeepSpeed has no {name} on this {device.type}; "
                "use run.dtype=auto or fp32 here, or run.strategy=ddp (torch's autocast and GradScaler)",
                key="run.dtype",
            )


def norm_tensor(norm) -> torch.Tensor:
    """DeepSpeed's gradient norm as a tensor, without reading it: ZeRO 1-3 and the bf16 wrapper keep it
    on the device, and train.py reads it on logging steps only; a float DeepSpeed has read already
    (its fp16 wrapper, an overflowed step) is wrapped; None, where it computes none (the pipeline at
    ZeRO 0 in fp32), is NaN."""
    if torch.is_tensor(norm):
        return norm.detach().float()
    return torch.tensor(math.nan if norm is None else norm, dtype=torch.float32)


def current_loss_scale(optimizer) -> float:
    """The loss scale of DeepSpeed's fp16 optimizer (its fp16 and ZeRO wrappers keep it in different places)."""
    config = getattr(optimizer, "loss_scale_config", None)
    return float(config.cur_scale if config is not None else optimizer.cur_scale)


class DeepSpeedStrategy:  # implements base.Strategy
    name = "deepspeed"
    consumes_batches = False  # train.py runs the micro steps (see PipelineStrategy for the other case)

    def __init__(self, run: Run, model: torch.nn.Module, resume: bool = False):
        deepspeed = import_deepspeed()
        cfg = run.cfg
        self.cfg, self.run, self.accum = cfg, run, run.grad_accum
        self.data_rank = run.rank  # every rank is a data-parallel rank
        # Counted before the engine partitions the weights (ZeRO-3 leaves each rank a share).
        self.num_params, self.flops_per_token = model.num_params(), model.flops_per_token()
        self.resumed_state = {}
        self._init_process_group(deepspeed)
        self.ds_config = deepspeed_config(
            cfg, run.grad_accum, run.data_parallel_size, run.device, precision=run.precision
        )
        self.clips_itself = clipped_by_strategy(run.sharding.stage, run.precision)
        refuse_unsupported_precision(self.ds_config, run.device, cfg.run.dtype)
        self.find_resume_point(resume, run.data_parallel_size)
        self._write_config()
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, cfg.optim.weight_decay), config=self.ds_config
        )
        self.compiled, self.compile_note = zero_compiled(cfg, run.device)
        if self.compiled:
            self.engine.compile()  # the engine's module, compiled in place (its ZeRO hooks stay outside the graphs)
        self.runnable = self.engine
        self.module = self.engine.module  # evaluation runs on it (ZeRO-3 hooks gather the weights)
        self._grad_norm = None

    def find_resume_point(self, allowed: bool, data_parallel_size: int) -> None:
        """Collective, before the engine is built: the newest intact checkpoint (verified once, here),
        checked against this run. One of another data-parallel size whose optimizer state is sharded
        is converted to DeepSpeed's universal format, which the engine is configured to load."""
        self.resume_point = self.load_dir = None
        self.run_id = checkpoint_files.new_run_id()
        ckpt_dir = Path(self.cfg.run.output_dir) / "checkpoints"
        latest = checkpoint.newest_intact(ckpt_dir, listing=_checkpoint_dirs) if allowed else None
        if latest is None:
            if allowed and checkpoint_files.list_files(ckpt_dir):
                raise ConfigError(
                    f"{ckpt_dir} holds DDP checkpoints (*.pt) but run.strategy=deepspeed; continue that run with "
                    "run.strategy=ddp, or start a new one in a folder of its own: "
                    f"run.output_dir={checkpoint_files.unused_sibling(ckpt_dir.parent)}"
                )
            return
        self.run_id = checkpoint_files.run_id_of(latest) or self.run_id
        # Check the layout and fingerprint before DeepSpeed loads tensors of a possibly different shape.
        states = sorted(latest.glob("*mp_rank_*model_states.pt"))  # not the pipeline's layer_* files
        if not states:
            raise ConfigError(
                f"{latest} holds no DeepSpeed model states; move it out of {ckpt_dir} to resume from the one before"
            )
        saved = torch.load(states[0], map_location="cpu", weights_only=False, mmap=True)
        parallel = self.cfg.parallel
        layout_changed = universal_checkpoint.saved_degrees(saved) != (parallel.tensor, parallel.pipeline)
        refusal = self.layout_refusal(latest, saved) if layout_changed else None
        if refusal:
            raise ConfigError(refusal, key="parallel.tensor")
        self.resume_notes = checkpoint.check_compatible(saved, self.cfg, self.run.world_size, latest, layout_changed)
        self.resume_point, self.load_dir = latest, ckpt_dir
        saved_dp = saved.get("data_parallel_size", saved.get("world_size"))
        if (saved_dp != data_parallel_size or layout_changed) and universal_checkpoint.is_partitioned(latest):
            refusal = self.universal_refusal(latest, saved)
            if refusal:
                raise ConfigError(refusal, key="checkpoint.reshard")
            self.load_dir = universal_checkpoint.convert_once(latest, self.run.is_main).parent
            self.ds_config["checkpoint"] = {"load_universal": True}
            self.resume_notes.append(
                f"optimizer state re-partitioned from {saved_dp} to {data_parallel_size} data-parallel ranks"
                if saved_dp != data_parallel_size
                else "weights and optimizer state re-split for the new tensor and pipeline degrees"
            )

    def layout_refusal(self, folder: Path, saved: dict) -> str | None:
        """Why checkpoint `folder`, written with other tensor or pipeline degrees, cannot continue on
        this run's; None: it can. This strategy runs neither, so it never can."""
        parallel = self.cfg.parallel
        return universal_checkpoint.layout_change_refusal(
            saved, parallel.tensor, parallel.pipeline, self.run.world_size, folder
        )

    def universal_refusal(self, folder: Path, saved: dict) -> str | None:
        """Why the sharded checkpoint `folder` cannot be converted to continue on another data-parallel
        size; None: it can (every checkpoint of this strategy)."""
        return None

    def _init_process_group(self, deepspeed) -> None:
        for key, value in {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            # A lone process waits for nobody: any free port (0), so two of them on one machine (a
            # second run, an eval beside training) do not both ask for 29500.
            "MASTER_PORT": "0",
        }.items():
            os.environ.setdefault(key, value)  # a single process started without torchrun
        # Reuses the group distributed.init_distributed made (Gloo on CPU, NCCL on CUDA).
        deepspeed.init_distributed(dist_backend="nccl" if self.run.device.type == "cuda" else "gloo")
        process_exit.joined_group(torch.distributed.group.WORLD)  # a lone process's group, made just now

    def _write_config(self) -> None:
        if self.run.is_main:
            out = Path(self.cfg.run.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "deepspeed_config.json").write_text(json.dumps(self.ds_config, indent=2) + "\n")

    def describe(self) -> str:
        ds = self.cfg.deepspeed
        offload = [n for n, on in (("optimizer", ds.offload_optimizer), ("params", ds.offload_params)) if on]
        offloaded = f", offload {'+'.join(offload)} to cpu" if offload else ""
        return f"strategy deepspeed ZeRO {ds.zero_stage}{offloaded}, {self.compile_note}"

    @property
    def peak_lr(self) -> float:
        return self.cfg.optim.lr

    def set_schedule(self, point) -> None:
        """This step's learning rate: optim.lr x the schedule's factor (training/schedule.py)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.optim.lr * point.lr_factor

    def micro_context(self, micro: int):
        return nullcontext()  # DeepSpeed skips the all-reduce off the accumulation boundary itself

    def backward(self, loss: torch.Tensor, micro: int) -> None:
        """engine.backward scales by 1/accum; engine.step updates only on the accumulation boundary,
        which step() reaches after the guard's verdict."""
        self.engine.backward(loss)
        last = micro == self.accum - 1
        assert self.engine.is_gradient_accumulation_boundary() == last
        if not last:
            self.engine.step()  # counts the micro step; no update

    def step(self, judge) -> torch.Tensor:
        """The update, on the accumulation boundary; returns the norm before clipping, the one the
        gradients were clipped by. ZeRO 1-3 leave out a step with non-finite gradients themselves (in
        every precision: DeepSpeed's overflow check), so judge(norm) only records the verdict there.
        ZeRO 0 in fp32 neither clips nor reports a norm (deepspeed_config gives it no clipping): the
        strategy clips, with the gradients already all-reduced, and leaves out a step judge refuses
        (common.skip_step)."""
        if not self.clips_itself:
            self.engine.step()
            norm = norm_tensor(self.engine.get_global_grad_norm())
            judge(norm)
            return norm
        self._grad_norm = clip_gradients(self.module.parameters(), self.cfg.optim.grad_clip)
        skip_step(self.engine.optimizer, judge(self._grad_norm), self.engine.step)
        return norm_tensor(self._grad_norm)

    def local_weights(self) -> list[torch.Tensor]:
        """The weights this rank holds: its ZeRO-3 partitions (ds_tensor), else a whole replica."""
        return [getattr(p, "ds_tensor", p) for p in self.module.parameters()]

    def loss_scaling(self) -> dict:
        """{"loss_scale", "skipped"} under fp16 (skipped: steps of the run so far); {} otherwise."""
        if not self.engine.fp16_enabled():
            return {}
        return {"loss_scale": current_loss_scale(self.engine.optimizer), "skipped": int(self.engine.skipped_steps)}

    def save(self, ckpt_dir: Path, step: int, extra: dict) -> None:
        tag = f"step_{step:08d}"
        staging = ckpt_dir / STAGING
        if self.run.is_main:
            shutil.rmtree(staging / tag, ignore_errors=True)  # left by a save that crashed
        barrier()
        needed = self._checkpoint_bytes(ckpt_dir)
        reason = None
        try:
            # Every rank writes its shard; DeepSpeed's own `latest` is not written: ours comes last.
            self.engine.save_checkpoint(str(staging), tag=tag, client_state={"step": step, **extra}, save_latest=False)
        except (OSError, RuntimeError) as exc:
            reason = checkpoint_files.room_reason(exc, staging, needed)
            if reason is None:
                raise
            barrier()  # the ranks whose writes went through wait in DeepSpeed's closing barrier
        if reason is None:
            try:
                checkpoint_files.fsync_tree(staging / tag)  # this rank's files (and, harmlessly, the others')
            except OSError as exc:
                reason = checkpoint_files.room_reason(exc, staging, needed)
                if reason is None:
                    raise
        failed = next(filter(None, gather_objects(reason)), None)
        if failed:
            message = None
            if self.run.is_main:
                shutil.rmtree(staging / tag, ignore_errors=True)  # frees what the partial save took
                message = str(checkpoint_files.save_failed(failed, ckpt_dir, tag, needed))
            raise_on_every_rank(share_from_main(message), self.run.is_main, key="run.output_dir")
        files = checkpoint.hash_shares(staging / tag)
        if self.run.is_main:
            for script in (p for p in staging.iterdir() if p.is_file()):
                os.replace(script, ckpt_dir / script.name)  # zero_to_fp32.py: run next to `latest`
            keep = self.cfg.checkpoint.keep_last
            prune = universal_checkpoint.remove_conversion
            final = checkpoint.commit_folder(staging / tag, ckpt_dir, step, files, keep, self.run_id, prune)
            print0(f"saved {final}")
        barrier()

    def _checkpoint_bytes(self, ckpt_dir: Path) -> int:
        """About the size of the next checkpoint: the last one's, or (none yet) fp32 weights plus
        AdamW's master copy and two moments."""
        previous = checkpoint.find_latest(ckpt_dir, listing=_checkpoint_dirs)
        return checkpoint_files.size_on_disk(previous) if previous else 16 * self.num_params

    def resume(self, ckpt_dir: Path, allowed: bool) -> int:
        """Load what find_resume_point chose (the checkpoint, or its universal form); 0 when none."""
        if self.resume_point is None:
            return 0
        inner = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)  # the torch optimizer ZeRO wraps
        groups = [dict(group) for group in inner.param_groups]
        _, client = self.engine.load_checkpoint(str(self.load_dir), tag=self.resume_point.name)
        if self.ds_config.get("checkpoint", {}).get("load_universal"):
            # DeepSpeed's ZeRO-3 universal load gives every parameter group the hyperparameters of the
            # first and empties their parameter lists: the groups as built here (from the config, the
            # same as the checkpoint's) are put back, or the no-decay group would decay. It also hands
            # every group one and the same `step` tensor, which torch's Adam advances in place once per
            # group: each gets its own, or the bias correction runs ahead from the second update on.
            for group, built in zip(inner.param_groups, groups):
                group.update(built)
            for state in inner.state.values():
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].clone()
        checkpoint.restore_rank_rng(client["rng"], self.run.rank, self.cfg.run.seed)
        self.resumed_state = {"divergence": client.get("divergence")}  # the loop's own state
        notes = "".join(f"; {n}" for n in self.resume_notes)
        print0(f"resumed from {self.resume_point} at step {client['step']}{notes}")
        return client["step"]
