"""The all-reduce of `doctor`: a few timed all-reduces after a warm-up, NCCL on GPUs (run with
NCCL_DEBUG=INFO, its log tells which transport NCCL chose) or Gloo on CPU, reported as the bus
bandwidth nccl-tests define. On one node doctor starts the ranks as workers of this module; inside a
job (torchrun's, mpirun's or a scheduler's ranks) every rank measures where it already runs.

    from .allreduce_bench import describe_result, job_allreduce, local_allreduce
    result, error, logs = local_allreduce(2, "gloo", 16 << 20, 5, 300, {}, Path("/tmp/doctor"))  # 2 ranks here
    describe_result(result)      # the table's line: bus bandwidth, or FAIL when the sum is wrong

    python -m <package>.allreduce_bench --worker gloo 16777216 5 300   # one rank, as local_allreduce starts it
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import FAIL, OK, Check

MIB = 1 << 20
RESULT_MARK = "DOCTOR_ALLREDUCE "  # the line of rank 0's output that carries its result


def measure_allreduce(backend: str, nbytes: int, iters: int, local_rank: int, timeout: float) -> dict:
    """Time `iters` all-reduces of nbytes after one warm-up (which also sets up NCCL's connections).
    Joins the process group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT unless already joined."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(
            backend, timeout=timedelta(seconds=timeout), device_id=device if device.type == "cuda" else None
        )
    world = dist.get_world_size()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(x)
    sync()
    correct = bool((x == world).all())
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    seconds = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace, as in nccl-tests
    return {
        "backend": backend,
        "world": world,
        "bytes": x.numel() * 4,
        "iters": iters,
        "seconds": seconds.item(),
        "correct": correct,
    }


def bandwidth(result: dict) -> tuple[float, float]:
    """(algbw, busbw) in GB/s; busbw = algbw * 2(n-1)/n, the all-reduce bus bandwidth of nccl-tests."""
    n = result["world"]
    algbw = result["bytes"] / result["seconds"] / 1e9
    return algbw, algbw * 2 * (n - 1) / n


def describe_result(result: dict) -> Check:
    algbw, busbw = bandwidth(result)
    detail = (
        f"{result['backend']}, {result['world']} processes x {result['bytes'] / MIB:.0f} MiB, "
        f"{result['iters']} iterations of {result['seconds'] * 1e3:.1f} ms: bus bandwidth {busbw:.2f} GB/s "
        f"(algbw {algbw:.2f} GB/s)"
    )
    if not result["correct"]:
        return Check("all-reduce", FAIL, f"{detail}; WRONG RESULT: the sum differs from the number of ranks")
    return Check("all-reduce", OK, detail)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_allreduce(
    nproc: int, backend: str, nbytes: int, iters: int, timeout: float, env_extra: dict, log_dir: Path
) -> tuple[dict | None, str, list[Path]]:
    """Start `nproc` worker processes on this node; (rank 0's result or None, error, per-rank log files).
    Each worker's stdout and stderr (NCCL's INFO lines among them) go to log_dir/rank<N>.log."""
    port = _free_port()
    src = str(Path(__file__).resolve().parents[2])
    procs, logs = [], []
    for rank in range(nproc):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **env_extra,
        )
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        env.pop("NCCL_DEBUG_FILE", None)  # NCCL's lines must land in the captured output
        logs.append(log_dir / f"rank{rank}.log")
        with open(logs[-1], "w") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        f"{__package__}.allreduce_bench",
                        "--worker",
                        backend,
                        str(nbytes),
                        str(iters),
                        str(timeout),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    hung = [rank for rank, p in enumerate(procs) if p.poll() is None]
    for rank in hung:
        procs[rank].kill()
        procs[rank].wait()
    if hung:
        return (
            None,
            (
                f"ranks {hung} did not finish within {timeout:.0f} s: a hang, often a port blocked between "
                f"the processes or a wrong NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME; logs in {log_dir}"
            ),
            logs,
        )
    failed = [(rank, p.returncode) for rank, p in enumerate(procs) if p.returncode != 0]
    if failed:
        rank, code = failed[0]
        lines = [line.strip() for line in logs[rank].read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line or "NCCL WARN" in line]
        said = (errors or lines or ["no output"])[-1]
        return None, f"rank {rank} exited {code}: {said} (log {logs[rank]})", logs
    for line in logs[0].read_text(errors="replace").splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :]), "", logs
    return None, f"rank 0 printed no result (log {logs[0]})", logs


def _worker(argv: list[str]) -> int:
    """`python -m <package>.allreduce_bench --worker BACKEND BYTES ITERS TIMEOUT`: one rank of the local all-reduce."""
    backend, nbytes, iters, timeout = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    import torch.distributed as dist

    result = measure_allreduce(backend, nbytes, iters, int(os.environ["LOCAL_RANK"]), timeout)
    if int(os.environ["RANK"]) == 0:
        print(RESULT_MARK + json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


def job_allreduce(
    backend: str, nbytes: int, iters: int, timeout: float, local_rank: int, rank: int, log_dir: Path
) -> tuple[dict | None, str, list[tuple[str, str]]]:
    """Inside a job (torchrun's, mpirun's or a scheduler's ranks): every rank joins; (result, error, [(rank name, NCCL
    log text)] of ALL ranks, gathered so every rank can judge the job)."""
    import torch.distributed as dist

    nccl_file = log_dir / f"nccl.rank{rank}.log"
    if backend == "nccl":
        os.environ["NCCL_DEBUG_FILE"] = str(nccl_file)
    try:
        result = measure_allreduce(backend, nbytes, iters, local_rank, timeout)
    except Exception as exc:  # a failed NCCL init is a finding, not a crash
        text = nccl_file.read_text(errors="replace") if nccl_file.is_file() else ""
        return (
            None,
            f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            [(f"rank {rank} on {socket.gethostname()}", text)],
        )
    text = nccl_file.read_text(errors="replace") if nccl_file.is_file() else ""
    text = "\n".join(line for line in text.splitlines() if "NCCL" in line)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (f"rank {rank} on {socket.gethostname()}", text))
    dist.destroy_process_group()
    return result, "", gathered


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit(
            f"this entry point is doctor's all-reduce worker; run `{__package__.partition('.')[0]} doctor` instead"
        )
    sys.exit(_worker(sys.argv[2:]))
