"""Kill-and-restart, repeated: does a 2-process run that torchrun brings back after kill -9 of one
rank end as if never killed, every time, and none wait without a word?

Renders a project from this template with copier (or uses --project), prepares the demo corpus,
runs the tiny gpt with the project's recipe (config/train.yaml: optim.optimizer=muon) once
uninterrupted for the reference, then N times (default 10) with kill -9 of rank 1 at a step
drawn at random past the first checkpoint (at a random moment inside it), each under
`torchrun --standalone --nproc-per-node 2 --max-restarts 3`. Plain torchrun hands every attempt's
ranks its agent's store (the case that once hung in Gloo's connect); `--via launch` runs the tries
under `launch devmachine` instead (a fresh store per attempt). Per try it prints whether the ranks
restarted and resumed, the seconds from start to end, the final loss and whether it equals the
reference's bit for bit; then a summary. A try still running after --try-timeout seconds is
stopped and counted as hung, with `py-spy dump --native` of its ranks when py-spy is installed.

    python bench/restart_repeat.py                   # 10 tries, about 5 minutes on 2 cores
    python bench/restart_repeat.py -n 3 --via launch
    python bench/restart_repeat.py --set run.start_timeout_minutes=0.5

This is a script run by hand, not a test (template/tests/test_faults.py holds the one kill test).
Exit 0 when every try ended with the reference's final loss.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
from fault_costs import env_for, prepare_demo_data, rank_pid  # noqa: E402  (same folder)
from gpt_vs_hf import render_project  # noqa: E402

MAX_STEPS = 60
CHECKPOINT_EVERY = 10
STEP_LINE = re.compile(r"step +(\d+)/\d+ \| loss")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--tries", type=int, default=10, help="kill-and-restart runs in a row")
    p.add_argument("--via", choices=("torchrun", "launch"), default="torchrun", help="what starts the ranks")
    p.add_argument("--try-timeout", type=float, default=300, help="seconds before a try counts as hung")
    p.add_argument("--seed", type=int, default=0, help="draws the step and moment of each kill")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another override, every run")
    p.add_argument("--project", type=Path, help="an already generated project (default: render one)")
    p.add_argument("--vcs-ref", default="HEAD")
    return p.parse_args(argv)


def overrides(data: Path, out: Path, extra: list[str]) -> list[str]:
    """The tiny gpt on CPU with the project's recipe; a line and a metrics record every step."""
    return [
        "model.size=tiny",
        "model.sequence_len=64",
        "batch.global_batch_size=16",
        "batch.micro_batch_size=4",
        f"schedule.max_steps={MAX_STEPS}",
        "schedule.warmup_steps=5",
        "logging.every_steps=1",
        "logging.eval_every_steps=0",
        "logging.tensorboard=false",
        f"checkpoint.every_steps={CHECKPOINT_EVERY}",
        "checkpoint.keep_last=10",
        "run.device=cpu",
        "run.dtype=fp32",
        "run.compile=false",
        f"data.dir={data}",
        f"run.output_dir={out}",
        *extra,
    ]


def command(slug: str, via: str, train_args: list[str]) -> list[str]:
    if via == "launch":
        return [sys.executable, "-m", slug, "launch", "devmachine", "--nproc-per-node", "2", *train_args]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return [*torchrun, "--max-restarts", "3", "-m", slug, "train", *train_args]


def final_loss(out: Path) -> float | None:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return None
    losses = [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r]
    return losses[-1] if losses else None


def stop(proc: subprocess.Popen, out: Path) -> None:
    """End the launcher's process group and the ranks (torchrun starts each in a session of its own)."""
    for rank in (0, 1):
        pid = rank_pid(out, rank)
        if pid:
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def dump_stacks(out: Path, log: Path) -> None:
    """py-spy's native stacks of the ranks still running, appended to the try's log."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    with open(log, "a") as f:
        for rank in (0, 1):
            pid = rank_pid(out, rank)
            if pid and spy:
                dump = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True)
                f.write(f"\n--- rank {rank} (pid {pid}), py-spy dump --native\n{dump.stdout}{dump.stderr}")


def one_run(project: Path, cmd: list[str], out: Path, log: Path, timeout: float, kill_at: tuple[int, float] | None):
    """(seconds, exit code or None when hung, killed?) of one run; kill_at: (step, seconds into it)."""
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, cwd=project, env=env_for(project), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    killed = False
    try:
        while proc.poll() is None:
            if time.monotonic() - started > timeout:
                dump_stacks(out, log)
                return time.monotonic() - started, None, killed
            if kill_at and not killed:
                steps = [int(s) for s in STEP_LINE.findall(log.read_text())]
                victim = rank_pid(out, 1)
                if steps and max(steps) >= kill_at[0] and victim:
                    time.sleep(kill_at[1])
                    os.kill(victim, signal.SIGKILL)
                    killed = True
            time.sleep(0.01)
        return time.monotonic() - started, proc.returncode, killed
    finally:
        stop(proc, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    draw = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="restart-repeat-"))
    keep = False
    try:
        project = args.project
        if project is None:
            project = work / "project"
            render_project(project, args.vcs_ref)
        (slug,) = [p.parent.name for p in (project / "src").glob("*/__main__.py")]
        data = work / "data"
        prepare_demo_data(project, slug, data)

        ref_out = work / "reference"
        cmd = command(slug, args.via, overrides(data, ref_out, args.set))
        ref_seconds, code, _ = one_run(project, cmd, ref_out, work / "reference.log", args.try_timeout, None)
        reference = final_loss(ref_out)
        if code != 0 or reference is None:
            keep = True
            print(f"the uninterrupted run failed (exit {code}); see {work / 'reference.log'}")
            return 1
        print(
            f"{args.via}, 2 processes on CPU (Gloo), tiny gpt, {MAX_STEPS} steps, a checkpoint every {CHECKPOINT_EVERY}"
        )
        print(f"uninterrupted: {ref_seconds:.1f} s, final loss {reference!r}\n")
        print(
            f"{'try':>3} {'killed at':>10} {'restarted':>9} {'bound hit':>9} {'seconds':>8} {'final loss':>20} {'equal':>5}"
        )
        rows = []
        for n in range(1, args.tries + 1):
            out, log = work / f"try{n}", work / f"try{n}.log"
            kill_at = (draw.randint(CHECKPOINT_EVERY + 1, MAX_STEPS - 10), draw.uniform(0, 0.05))
            cmd = command(slug, args.via, overrides(data, out, args.set))
            seconds, code, killed = one_run(project, cmd, out, log, args.try_timeout, kill_at)
            text = log.read_text()
            loss = final_loss(out)
            row = {
                "killed": killed,
                "restarted": killed and "resumed from" in text,
                "bound": "did not start within" in text,
                "hung": code is None,
                "seconds": seconds,
                "equal": code == 0 and loss == reference,
            }
            rows.append(row)
            if not row["equal"]:
                keep = True
            shown = "hung" if row["hung"] else repr(loss)
            print(
                f"{n:>3} {f'step {kill_at[0]}':>10} {'yes' if row['restarted'] else 'no':>9} "
                f"{'yes' if row['bound'] else 'no':>9} {seconds:>8.1f} {shown:>20} {'yes' if row['equal'] else 'NO':>5}",
                flush=True,
            )
        seconds = [r["seconds"] for r in rows]
        tally = {key: sum(r[key] for r in rows) for key in ("restarted", "equal", "hung", "bound")}
        print(
            f"\n{args.tries} tries: {tally['restarted']} restarted and resumed, {tally['equal']} ended with the "
            f"uninterrupted run's final loss, {tally['hung']} hung, {tally['bound']} hit the start bound; "
            f"seconds median {statistics.median(seconds):.1f}, max {max(seconds):.1f} (uninterrupted {ref_seconds:.1f})"
        )
        if keep:
            print(f"logs kept in {work}")
        return 0 if tally["equal"] == args.tries else 1
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
