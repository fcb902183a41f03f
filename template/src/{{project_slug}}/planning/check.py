"""`check`: validate config/train.yaml against the project's shape before anything is launched.

    <package> check                 # for nodes x gpus_per_node from the copier answers
    <package> check --world-size 2  # for another number of processes (the rules only)

Also run by the template right after generation (python -m <package> check --quiet), so
that copier refuses answers that break a rule or whose layout does not fit the GPUs: after the
rules pass, plan's memory estimate for the configured nodes x gpus_per_node must fit gpu_type,
else it exits 1 with "does not fit: <figures>; smallest change: <what to change>". No torch here.
Each platform folder of the project may check its launch files against the site (site_problems in
its environment.py: where the scheduler answers, a batch script's request must fit a node of its
partition); the generation check skips that.
What changes nothing but may be meant (a setting the family does not read, written at its default;
one learning rate of 0 among others) is a `warning:` line that does not fail the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..models.family import model_shape
from ..settings.batch import at_world_size, resolve_grad_accum
from ..settings.bounds import count
from ..settings.config import Config, project_root
from ..settings.packages import platform_modules
from ..settings.precision import on_gpu_type
from .estimates import ASSUMED_MFU, GIB, STOP_WAIT_SHARE, memory, stop_reaction
from .fit import fit_problem
from .rules import check_config, config_warnings
from .storage_paths import launch_file_note, launch_file_problems


def summary(cfg: Config, world: int) -> str:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    cfg = at_world_size(cfg, world)  # weak scaling: the global batch of this world
    dp = cfg.data_parallel_size(world)
    accum = resolve_grad_accum(cfg, dp)
    tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
    layout = f" (tensor {tp} x pipeline {pp} x data {dp})" if tp * pp > 1 else ""
    return (
        f"config OK for {world} processes{layout}: model {cfg.model.arch} {cfg.model.size} ({shape['n_layer']} layers, width {shape['n_embd']}, "
        f"{shape['n_head']} heads, {shape['n_kv_head']} kv heads) | global batch {cfg.batch.global_batch_size} = "
        f"micro {cfg.batch.micro_batch_size} x accum {accum} x data-parallel {dp} | "
        f"{cfg.batch.global_batch_size * cfg.model.sequence_len:,} tokens/step | {cfg.batch.scaling} scaling"
    )


def pretrained_problem(folder: str) -> str | None:
    """model.pretrained missing where its storage is mounted (the folder that holds it exists here);
    where that is not there either (storage mounted on the nodes only) it is the run's to find."""
    if not folder:
        return None
    path = Path(folder)
    if path.exists() or not path.parent.is_dir():
        return None
    return (
        f"model.pretrained={folder!r} does not exist ({path.parent} does): copy the model's folder there "
        "(config.json and its weights), or correct the path"
    )


def run_check(cfg: Config, world_size: int | None = None, quiet: bool = False) -> int:
    world = world_size or cfg.cluster.nodes * cfg.cluster.gpus_per_node
    problems = check_config(cfg, world)
    platforms = platform_modules("environment")  # the platforms present
    launch_mounts = {
        where: mounts
        for module in platforms
        if hasattr(module, "storage_mounts")
        for where, mounts in module.storage_mounts(project_root()).items()
    }
    problems += launch_file_problems(cfg, launch_mounts)  # where each platform's nodes keep the outputs
    # Not in the generation check (quiet): the machine generating may not be the cluster's login node.
    for module in [] if quiet else platforms:
        problems += module.site_problems(cfg) if hasattr(module, "site_problems") else []
    weights_problem = None if quiet else pretrained_problem(cfg.model.pretrained)
    if weights_problem:
        problems.append(weights_problem)
    for warning in [] if quiet else config_warnings(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        print(f"config check failed ({len(problems)} problem(s)):", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    if world == cfg.cluster.nodes * cfg.cluster.gpus_per_node:  # plan knows the configured layout only
        problem = fit_problem(cfg)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        if not quiet:
            m = memory(cfg)
            print(summary(cfg, world))
            print(
                f"memory fits: {m['total'] / GIB:.1f} of {m['usable'] / GIB:.1f} GiB usable per {cfg.cluster.gpu_type} "
                f"in {on_gpu_type(cfg)} (`plan` for the details)"
            )
            note = launch_file_note(cfg, launch_mounts)
            if note:
                print(f"note: {note}")
            stop = stop_reaction(cfg, ASSUMED_MFU)
            if stop["tight"]:
                print(
                    f"warning: a step takes about {stop['step_seconds']:.0f} s at {ASSUMED_MFU:.0%} MFU, over half of "
                    f"cluster.stop_grace_seconds={stop['grace_seconds']}: a stop signal waits for the step, and the "
                    f"save may not fit in the rest; raise cluster.stop_grace_seconds to {stop['step_seconds'] / STOP_WAIT_SHARE:.0f} "
                    "or more",
                    file=sys.stderr,
                )
        return 0
    if not quiet:
        print(summary(cfg, world))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world-size", type=count, help="processes to check for (default: nodes x gpus_per_node)")
    p.add_argument("--quiet", action="store_true", help="print problems only (copier's post-generation check)")


def run(cfg: Config, args: argparse.Namespace) -> int:
    return run_check(cfg, args.world_size, args.quiet)
