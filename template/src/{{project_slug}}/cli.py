"""Command-line interface: prepare-data · train · eval · sample · check · launch · node · image · doctor · debug-dump.

Every command reads config/train.yaml (or --config) and accepts overrides as `section.key=value`
arguments or `--set section.key=value`. A user mistake prints one message and exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .config import ConfigError, load_config

PACKAGE = __package__


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: config/train.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set optim.lr=1e-3; a bare KEY=VALUE argument works too")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PACKAGE, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-data", help="tokenizer + packed token shards from local files")
    p.add_argument("--demo-corpus", action="store_true", help="first write a small corpus from Python's docstrings")
    _add_config_args(p)

    p = sub.add_parser("train", help="train (run under torchrun for several processes)")
    _add_config_args(p)

    p = sub.add_parser("eval", help="validation loss and bits per byte of a checkpoint")
    p.add_argument("--checkpoint", help="checkpoint file (default: latest)")
    p.add_argument("--batches", type=int, help="micro batches per rank (default: logging.eval_batches)")
    _add_config_args(p)

    p = sub.add_parser("sample", help="generate text from a checkpoint")
    p.add_argument("--prompt", action="append", help="prompt text (repeatable)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, help="gpt/gpt3: sample among the k likeliest tokens (default 50, 0 = all); "
                   "bert: predictions shown per [MASK] (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", help="checkpoint file (default: latest)")
    _add_config_args(p)

    p = sub.add_parser("check", help="validate the config for the project's world size")
    p.add_argument("--world-size", type=int, help="processes to check for (default: nodes x gpus_per_node)")
    _add_config_args(p)

    p = sub.add_parser("node", help="node launcher run by the platform on each node: topology -> torchrun")
    p.add_argument("--dry-run", action="store_true", help="print the topology and the command, do not run")
    p.add_argument("--wait-timeout", type=float, default=900, help="seconds a worker node waits for the master")
    p.add_argument("--debug", action="store_true", help="TRAIN_DEBUG=1: NCCL INFO logs, flight recorder dumps")
    _add_config_args(p)

    from . import debug_dump, doctor, image, plan

    p = sub.add_parser("plan", help="memory per GPU, whether it fits, and time to train for 1-8 nodes")
    plan.add_arguments(p)
    _add_config_args(p)

    p = sub.add_parser("image", help="build and push the project image (docker SDK, DOCKER_HOST)")
    image.add_arguments(p)
    _add_config_args(p)

    p = sub.add_parser("doctor", help="check this node: GPUs, RDMA, /dev/shm, memlock, which transport NCCL uses")
    doctor.add_arguments(p)
    _add_config_args(p)

    p = sub.add_parser("debug-dump", help="Python stacks of every training rank on this machine (py-spy), for a hung job")
    debug_dump.add_arguments(p)
    _add_config_args(p)

    p = sub.add_parser("ray-train", help="train on a running Ray cluster with Ray Train (TI-ONE Ray mode)")
    from .ray_train import add_arguments as add_ray_arguments

    add_ray_arguments(p)
    _add_config_args(p)

    from . import launch

    p = sub.add_parser("launch", help="submit to a platform, or its job's status, logs, cancel (launch/<platform>/)")
    launch.add_arguments(p, _add_config_args)
    return parser


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse options; bare KEY=VALUE arguments, wherever they stand, join args.overrides. (An argparse
    positional could not follow the options of a subcommand.)"""
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like section.key=value)")
    args.overrides += extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_with_overrides(build_parser(), argv)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.command == "prepare-data":
            from .prepare_data import prepare_data

            prepare_data(cfg, demo_corpus=args.demo_corpus)
            return 0
        if args.command == "train":
            from .train import run_training

            return run_training(cfg)
        if args.command == "eval":
            from .evaluate import run_eval

            run_eval(cfg, args.checkpoint, args.batches)
            return 0
        if args.command == "sample":
            from .sample import run_sample

            top_k = args.top_k if args.top_k is not None else (5 if cfg.model.arch == "bert" else 50)
            run_sample(cfg, args.prompt or ["The"], args.max_new_tokens, args.temperature, top_k or None,
                       args.seed, args.checkpoint)
            return 0
        if args.command == "check":
            from .check_project import run_check

            return run_check(cfg, args.world_size)
        if args.command == "node":
            from .node import run_node

            return run_node(cfg, args.config, args.overrides, PACKAGE, args.dry_run, args.wait_timeout, args.debug)
        if args.command in ("image", "doctor", "plan", "debug-dump"):
            module = importlib.import_module(f".{args.command.replace('-', '_')}", __package__)
            return module.run(cfg, args)
        if args.command == "ray-train":
            from .ray_train import run as run_ray_train

            return run_ray_train(cfg, args)
        if args.command == "launch":
            from .launch import run as run_launch

            return run_launch(cfg, args, PACKAGE)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(args.command)
