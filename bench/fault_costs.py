"""What fault tolerance costs a run, measured on a real generated project.

Renders a project from this template with copier (or uses --project), prepares the demo corpus,
and prints three figures, each as a ratio against a reference measured in the same run:

1. The per-step stop agreement (preemption.StopRequest.agreed: one all-reduce of one number so
   every rank saves at the same step) against the project's own training step time, 2 processes
   on Gloo.
2. A checkpoint save (temporary name, fsync, rename, `latest` last, every rank's RNG state)
   against a plain torch.save of the same state into the same folder.
3. Recovery from SIGKILL of one rank under `launch devmachine` (torchrun --max-restarts): seconds
   from the kill to the first step logged after the resume, against a cold start (launch to the
   first logged step).

    python bench/fault_costs.py                    # CPU, tiny model, about 2 minutes on 2 cores
    python bench/fault_costs.py --size d4 --saves 5

Options: --size (gpt size of the checkpoint and the run), --agree-calls, --saves, --project PATH,
--vcs-ref. This is a script run by hand, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt_vs_hf import import_project, render_project  # noqa: E402  (same folder)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="tiny", help="gpt model.size of the saved state and the run (tiny, d4, ...)")
    p.add_argument("--agree-calls", type=int, default=500)
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--project", type=Path, help="an already generated project (default: render one)")
    p.add_argument("--vcs-ref", default="HEAD")
    return p.parse_args(argv)


def train_overrides(size: str, data: Path, out: Path, steps: int) -> list[str]:
    return [
        f"model.size={size}",
        "model.sequence_len=64",
        "batch.global_batch_size=16",
        "batch.micro_batch_size=4",
        f"schedule.max_steps={steps}",
        "schedule.warmup_steps=2",
        "logging.every_steps=1",
        "logging.eval_every_steps=0",
        "logging.tensorboard=false",
        "checkpoint.every_steps=5",
        "run.device=cpu",
        "run.dtype=fp32",
        "run.strategy=ddp",
        f"data.dir={data}",
        f"run.output_dir={out}",
    ]


def env_for(project: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(project / "src"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def prepare_demo_data(project: Path, slug: str, data: Path) -> None:
    """The demo corpus prepared into data (vocab 2048, 5% held out): the tiny runs' data."""
    cmd = [sys.executable, "-m", slug, "prepare-data", "--demo-corpus", f"data.dir={data}",
           "data.vocab_size=2048", "data.val_fraction=0.05"]  # fmt: skip
    subprocess.run(cmd, cwd=project, env=env_for(project), check=True, stdout=subprocess.DEVNULL)


def _agree_worker(rank: int, port: int, calls: int, src: str, slug: str, result_file: str) -> None:
    sys.path.insert(0, src)
    import importlib

    import torch.distributed as dist

    preemption = importlib.import_module(f"{slug}.training.preemption")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    stop = preemption.StopRequest()
    stop.start(0)
    for step in range(1, 21):
        stop.agreed(step)
    times = []
    for step in range(21, 21 + calls):
        start = time.perf_counter()
        stop.agreed(step)
        times.append(time.perf_counter() - start)
    if rank == 0:
        Path(result_file).write_text(str(statistics.median(times)))
    dist.destroy_process_group()


def agreement_seconds(project: Path, slug: str, calls: int) -> float:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as f:
        result = f.name
    mp.spawn(_agree_worker, args=(port, calls, str(project / "src"), slug, result), nprocs=2)
    return float(Path(result).read_text())


def save_seconds(slug: str, size: str, saves: int, folder: Path) -> tuple[float, float, float]:
    """(median atomic save, median plain torch.save, MB) of a model + AdamW state of this size."""
    import importlib

    import torch

    config, models, checkpoint = (
        importlib.import_module(f"{slug}.{m}") for m in ("settings.config", "models", "checkpoints.checkpoint")
    )
    empty = folder / "empty.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    empty.write_text("")
    cfg = config.load_config(empty, ["model.arch=gpt", f"model.size={size}", "model.sequence_len=64"])
    model = models.build_model(cfg, 2048)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 2048, (2, 64)), torch.randint(0, 2048, (2, 64))).backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": checkpoint.every_rank_rng()}
    atomic, plain = [], []
    for step in range(1, saves + 1):
        start = time.perf_counter()
        path = checkpoint.save(folder / "atomic", step, state, keep_last=2)
        atomic.append(time.perf_counter() - start)
        (folder / "plain").mkdir(exist_ok=True)
        start = time.perf_counter()
        torch.save(state, folder / "plain" / f"step_{step}.pt")
        plain.append(time.perf_counter() - start)
    return statistics.median(atomic), statistics.median(plain), path.stat().st_size / 1e6


def rank_pid(out: Path, rank: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in cmd and f"run.output_dir={out}".encode() in cmd and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


def recovery_seconds(project: Path, slug: str, data: Path, out: Path, size: str) -> tuple[float, float, float]:
    """(cold start to first step, kill to first step after resume, median step time)."""
    log = out.parent / "recovery.log"
    cmd = [
        sys.executable,
        "-m",
        slug,
        "launch",
        "devmachine",
        "--nproc-per-node",
        "2",
        *train_overrides(size, data, out, 40),
    ]
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=project, env=env_for(project), stdout=f, stderr=subprocess.STDOUT)
    first_step = killed = resumed = None
    try:
        while proc.poll() is None:
            text = log.read_text()
            now = time.monotonic()
            if first_step is None and "step      1/" in text:
                first_step = now
            if killed is None and (out / "checkpoints" / "step_00000005.pt").exists():
                pid = rank_pid(out, 1)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed, mark = now, len(text)
            if killed and resumed is None and "resumed from" in text[mark:]:
                after = text[mark:].split("resumed from", 1)[1]
                if re.search(r"step +\d+/", after):  # a step line, whatever prefix torchrun gives it
                    resumed = now
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0 or None in (first_step, killed, resumed):
        raise RuntimeError(f"recovery run failed (exit {proc.returncode}); see {log}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_times = [r["step_time"] for r in records if "step_time" in r]
    return first_step - started, resumed - killed, statistics.median(step_times)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fault-costs-"))
    try:
        project = args.project
        if project is None:
            project = work / "project"
            render_project(project, args.vcs_ref)
        slug = import_project(project)[0]
        data = work / "data"
        prepare_demo_data(project, slug, data)
        cold, recovery, step = recovery_seconds(project, slug, data, work / "run", args.size)
        agree = agreement_seconds(project, slug, args.agree_calls)
        atomic, plain, mb = save_seconds(slug, args.size, args.saves, work / "saves")
        rows = [
            ("stop agreement per step", f"{agree * 1e6:.0f} us", f"step {step * 1e3:.1f} ms", agree / step),
            (
                f"checkpoint save ({mb:.1f} MB)",
                f"{atomic * 1e3:.1f} ms",
                f"torch.save {plain * 1e3:.1f} ms",
                atomic / plain,
            ),
            ("recovery after SIGKILL of rank 1", f"{recovery:.1f} s", f"cold start {cold:.1f} s", recovery / cold),
        ]
        print(f"\nmodel.size={args.size}, 2 processes on CPU (Gloo)\n")
        print(f"{'':34} {'measured':>12} {'reference':>22} {'ratio':>8}")
        for name, got, ref, ratio in rows:
            print(f"{name:34} {got:>12} {ref:>22} {ratio:>8.3f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
