"""Train on a running Ray cluster with Ray Train's TorchTrainer: one worker per GPU, each running
the project's own training loop (train.run_training) in a process group Ray sets up.

    <package> ray-train [--config FILE] [key=value ...]   # on the Ray head (TI-ONE Ray mode)
    RAY_NUM_NODES=3 <package> ray-train                    # wait for 3 nodes (a head without GPUs + 2)
    <package> ray-train --num-workers 4 --dry-run          # print the plan, connect to nothing

`bash launch/tione/start-ray.sh` runs it on the head. It connects to the cluster (RAY_ADDRESS,
default: the one running on this machine), waits until cluster.nodes nodes have joined, then
starts cluster.nodes x cluster.gpus_per_node workers, on GPUs when the cluster has any.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ...cluster.nccl_env import apply_nccl_env
from ...settings.bounds import count, count_in, positive_float
from ...settings.config import Config, ConfigError, project_root, read_env_file
from ...settings.packages import require_package

RAY_INSTALL = "pip install 'ray[train]'"  # Ray Train is an extra of the ray distribution


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Ray options of `ray-train` (the CLI adds --config/--set)."""
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "auto"),
        help="Ray cluster to join (default: $RAY_ADDRESS, else the one running on this machine)",
    )
    p.add_argument(
        "--num-nodes",
        type=count,
        help="Ray nodes to wait for before training (default: $RAY_NUM_NODES, else cluster.nodes)",
    )
    p.add_argument(
        "--num-workers",
        type=count,
        help="training processes (default: $RAY_NUM_WORKERS, else cluster.nodes x cluster.gpus_per_node)",
    )
    p.add_argument(
        "--use-gpu",
        choices=["auto", "yes", "no"],
        default=os.environ.get("RAY_USE_GPU", "auto"),
        help="one GPU per worker; auto = when the cluster has GPUs",
    )
    p.add_argument("--wait-timeout", type=positive_float, default=900, help="seconds to wait for every node to join")
    p.add_argument("--dry-run", action="store_true", help="print the plan, connect to nothing")


def fabric_env() -> dict[str, str]:
    """config/nccl.env as read here, on the head; workers apply it without overriding their own."""
    return read_env_file(project_root() / "config" / "nccl.env")


WORKER_LINE = "ray worker rank {rank}/{world} on node {node} (local rank {local})"
"""Each worker's placement, printed once by the worker and streamed to the head's terminal."""
KEEP_WORKER_LINES = r"ray worker rank \d+/\d+ on node "


def keep_worker_lines() -> None:
    """Ray's driver folds lines that differ only in their numbers, from several workers, into the last
    one seen ("[repeated Nx across cluster]"): every worker's placement line but one would be dropped,
    and which one is left depends on the order the nodes' log monitors send them. Exempt those lines
    (RAY_DEDUP_LOGS_ALLOW_REGEX, read when ray is imported: call this first)."""
    theirs = os.environ.get("RAY_DEDUP_LOGS_ALLOW_REGEX")
    if not theirs:
        os.environ["RAY_DEDUP_LOGS_ALLOW_REGEX"] = KEEP_WORKER_LINES
    elif KEEP_WORKER_LINES not in theirs:
        os.environ["RAY_DEDUP_LOGS_ALLOW_REGEX"] = f"(?:{theirs})|{KEEP_WORKER_LINES}"


def train_worker(payload: dict) -> None:
    """Body of every Ray Train worker: the process group exists already (init_distributed sees it)."""
    apply_nccl_env(values=payload["fabric_env"])  # a platform's own NCCL_* (TI-ONE's HCC machines) wins
    import ray.train

    from ...training.train import run_training

    ctx = ray.train.get_context()
    node = ray.get_runtime_context().get_node_id()[:12]
    line = WORKER_LINE.format(
        rank=ctx.get_world_rank(), world=ctx.get_world_size(), node=node, local=ctx.get_local_rank()
    )
    print(line, flush=True)
    code = run_training(payload["cfg"])
    if code:
        raise RuntimeError(f"training exited with status {code} on rank {ctx.get_world_rank()}")


def wait_for_nodes(ray, expected: int, timeout: float) -> list[dict]:
    """Alive nodes once at least `expected` have joined; ConfigError after `timeout` seconds."""
    deadline, reported = time.monotonic() + timeout, -1
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= expected:
            return alive
        if len(alive) != reported:
            print(f"{len(alive)} of {expected} Ray node(s) joined; waiting ...", flush=True)
            reported = len(alive)
        if time.monotonic() > deadline:
            raise ConfigError(
                f"only {len(alive)} of {expected} Ray nodes joined within {timeout:.0f} s; check the worker "
                "nodes' logs, or set RAY_NUM_NODES to the node count of this cluster (head included)"
            )
        time.sleep(2)


def runtime_env() -> dict:
    """Workers on other nodes import the package from the same source tree when it is not
    installed (code mounted at the same path on every node, e.g. /opt/ml/code)."""
    src = str(Path(__file__).resolve().parents[2])
    if Path(src).name in ("site-packages", "dist-packages"):
        return {}
    path = os.environ.get("PYTHONPATH", "")
    return {"env_vars": {"PYTHONPATH": src + (os.pathsep + path if path and src not in path.split(os.pathsep) else "")}}


def env_count(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not (count_in(value) or 0) >= 1:
        raise ConfigError(f"{name}={value!r} must be a whole number of at least 1; fix or unset it")
    return int(value)


def run(cfg: Config, args: argparse.Namespace) -> int:
    # argparse, env_count and bounds.py have refused counts below 1
    num_nodes = args.num_nodes or env_count("RAY_NUM_NODES") or cfg.cluster.nodes
    num_workers = args.num_workers or env_count("RAY_NUM_WORKERS") or cfg.cluster.nodes * cfg.cluster.gpus_per_node
    plan = (
        f"Ray Train: {num_workers} worker(s) on {num_nodes} node(s), cluster {args.address}, "
        f"GPUs {args.use_gpu}, output {cfg.run.output_dir}"
    )
    print(plan, flush=True)
    if args.dry_run:
        return 0
    keep_worker_lines()
    ray = require_package("ray", "ray", "ray-train", install=RAY_INSTALL)
    require_package("ray.train.torch", "ray", "ray-train", install=RAY_INSTALL)
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    try:
        ray.init(address=args.address, runtime_env=runtime_env() or None, log_to_driver=True)
    except (ValueError, ConnectionError) as exc:  # an address of another form, or no cluster there
        where = f"--address {args.address}" if args.address else "RAY_ADDRESS (or a local cluster)"
        raise ConfigError(
            f"cannot join the Ray cluster at {where}: {str(exc).splitlines()[0][:160]}; start one with "
            "`ray start --head` or give --address HOST:6379 of its head"
        ) from None
    try:
        alive = wait_for_nodes(ray, num_nodes, args.wait_timeout)
        gpus = ray.cluster_resources().get("GPU", 0)
        use_gpu = gpus > 0 if args.use_gpu == "auto" else args.use_gpu == "yes"
        print(
            f"{len(alive)} Ray node(s), {gpus:g} GPU(s), {ray.cluster_resources().get('CPU', 0):g} CPU(s); "
            f"starting {num_workers} worker(s) on {'GPU' if use_gpu else 'CPU'}",
            flush=True,
        )
        trainer = TorchTrainer(
            train_worker,
            train_loop_config={"cfg": cfg, "fabric_env": fabric_env()},
            # Ray's default placement, PACK: as few nodes as the workers fit on. cluster.nodes x
            # cluster.gpus_per_node workers of one GPU each fill every GPU node (one worker group per
            # node, Ray numbers the ranks node by node); where the cluster has more room than the job
            # asks, they stay on fewer, fuller nodes. SPREAD would scatter them over partly used nodes.
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
            # Ray's own records go beside the run on the shared storage every node mounts.
            run_config=RunConfig(
                storage_path=os.path.join(cfg.run.output_dir, "ray"),
                name=time.strftime("train-%Y%m%d-%H%M%S"),
                # A failed worker group is started again (cluster.max_restarts); its
                # workers resume from the latest checkpoint in run.output_dir.
                failure_config=FailureConfig(max_failures=cfg.cluster.max_restarts),
            ),
        )
        try:
            trainer.fit()
        except ray.train.TrainingFailedError as exc:
            print(f"error: Ray Train failed: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"Ray Train finished: {num_workers} worker(s); metrics in {cfg.run.output_dir}/metrics.jsonl", flush=True)
        return 0
    finally:
        ray.shutdown()
