"""What a training step costs the host under each strategy: DDP against DeepSpeed ZeRO 1, 2 and 3.

On a GPU a step is fast only if the host queues its kernels ahead of the device: every op the host
dispatches, every value it reads back, every millisecond of Python between kernels shows up as
idle GPU once the model is small enough or the GPU fast enough. This measures those on the CPU, on
a tiny model where the host's work is most of the step, with the project's real `train` under
torchrun (2 processes, Gloo), per plain step (one that neither logs, evaluates nor saves):

    ops/step     aten ops dispatched on the main thread (a dispatch mode counts them)
    reads/step   of those, the ones the host waits for (.item(), nonzero, ...: test_host_syncs.py's READ_OPS)
    ms/step      wall time per step in a second run without the counting (the median)

and each as a ratio against DDP's. Rows: --strategies (ddp, zero1, zero2, zero3), each with the
project's train.yaml plus --set overrides; --ds sets a key of the DeepSpeed config the project
generates (strategies/deepspeed/engine.py), to measure an option before the project adopts it.

    python bench/step_overhead.py                        # about 3 minutes on 2 cores
    python bench/step_overhead.py --project PATH --size d4 --steps 16
    python bench/step_overhead.py --strategies zero1 --ds zero_optimization.overlap_comm=true

A script run by hand, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_costs import env_for, prepare_demo_data  # noqa: E402  (same folder)
from gpt_vs_hf import import_project, render_project  # noqa: E402

STRATEGIES = {
    "ddp": ["run.strategy=ddp"],
    "zero1": ["run.strategy=deepspeed", "deepspeed.zero_stage=1"],
    "zero2": ["run.strategy=deepspeed", "deepspeed.zero_stage=2"],
    "zero3": ["run.strategy=deepspeed", "deepspeed.zero_stage=3"],
}
# The ops the host waits for, as template/tests/test_host_syncs.py's READ_OPS.
READ_OPS = {
    "_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "argwhere", "repeat_interleave", "_assert_async", "equal", "is_nonzero",
}  # fmt: skip

# Runs `<package> train` in this process, counting per step (between the package's before_step
# hooks) the ops dispatched on the main thread and the host reads among them, or only timing.
COUNTER = """
import atexit, contextlib, importlib, json, os, sys, time
from pathlib import Path
import torch
from torch.utils._python_dispatch import TorchDispatchMode

package, out, counting = sys.argv[1], sys.argv[2], sys.argv[3] == "count"
faults = importlib.import_module(package + ".runtime.faults")
steps, current = {}, [None]
ds_module = importlib.import_module(package + ".strategies.deepspeed.engine")

def with_options(*args, original=ds_module.deepspeed_config, **kwargs):
    # The project's DeepSpeed config with --ds's dotted keys set (STEP_OVERHEAD_DS, JSON).
    result = original(*args, **kwargs)
    for dotted, value in json.loads(os.environ.get("STEP_OVERHEAD_DS", "{}")).items():
        *parents, key = dotted.split(".")
        node = result
        for parent in parents:
            node = node.setdefault(parent, {})
        node[key] = value
    return result

ds_module.deepspeed_config = with_options

class Ops(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if current[0] is not None:
            record = steps[current[0]]
            record["ops"] += 1
            record["reads"] += func._overloadpacket.__name__ in READ_OPS
        return func(*args, **(kwargs or {}))

def before_step(rank, step, original=faults.before_step):
    now = time.perf_counter()
    if current[0] is not None:
        steps[current[0]]["seconds"] = now - steps[current[0]]["started"]
    current[0] = step + 1
    steps[current[0]] = {"ops": 0, "reads": 0, "started": now}
    original(rank, step)

faults.before_step = before_step
atexit.register(lambda: Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(steps)))
with Ops() if counting else contextlib.nullcontext():
    code = importlib.import_module(package + ".cli").main(sys.argv[4:])
importlib.import_module(package + ".runtime.process_exit").end(code)  # as the console script ends
""".replace("READ_OPS", repr(READ_OPS))


def run_steps(project: Path, slug: str, work: Path, name: str, mode: str, settings: list[str], ds: dict) -> list[dict]:
    """Rank 0's records of the plain steps of one run (steps 3 .. n-1 that do not log)."""
    out, script = work / f"{name}-{mode}", work / "step_counter.py"
    out.mkdir(parents=True)
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"),
        *(str(script), slug, str(out), mode, "train", *settings, f"run.output_dir={out / 'run'}"),
    ]
    env = {**env_for(project), "STEP_OVERHEAD_DS": json.dumps(ds if name != "ddp" else {})}
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{name} ({mode}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    records = json.loads((out / "rank0.json").read_text())
    last = max(int(step) for step in records)
    return [r for step, r in records.items() if 3 <= int(step) < last and "seconds" in r]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--project", type=Path, help="a generated project (default: render one from this template)")
    p.add_argument("--vcs-ref", default="HEAD")
    p.add_argument("--size", default="tiny", help="model.size (gpt)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    p.add_argument("--set", action="append", default=[], help="an override for every row (repeatable)")
    p.add_argument(
        "--ds", action="append", default=[], metavar="KEY=VALUE", help="a DeepSpeed config key (dotted; JSON value)"
    )
    p.add_argument("--out", type=Path, help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    ds = {}
    for item in args.ds:
        key, _, text = item.partition("=")
        try:
            ds[key] = json.loads(text)
        except json.JSONDecodeError:
            ds[key] = text

    work = Path(tempfile.mkdtemp(prefix="step-overhead-"))
    project = args.project
    if project is None:
        project = work / "project"
        render_project(project, args.vcs_ref)
    slug = import_project(project)[0]
    (work / "step_counter.py").write_text(COUNTER)
    data = work / "data"
    prepare_demo_data(project, slug, data)
    common = [
        f"data.dir={data}", "model.arch=gpt", f"model.size={args.size}", "model.sequence_len=64",
        "batch.global_batch_size=8", "batch.micro_batch_size=4", "batch.grad_accum_steps=null",
        f"schedule.max_steps={args.steps}", "schedule.warmup_steps=2", "optim.optimizer=adamw",
        "run.device=cpu", "run.dtype=fp32", "run.compile=false", f"logging.every_steps={args.steps}",
        "logging.eval_every_steps=0", "logging.tensorboard=false", "checkpoint.every_steps=0",
        "eval.tasks_every_steps=0", "cluster.nodes=1", "cluster.gpus_per_node=2",
    ]  # fmt: skip
    print(f"model.size={args.size}, 2 processes on CPU (Gloo), plain steps 3..{args.steps - 1}; rank 0")
    if ds:
        print(f"DeepSpeed rows with {json.dumps(ds)}")
    rows = []
    print(f"{'strategy':<10}{'ops/step':>10}{'reads/step':>12}{'ms/step':>10}{'ops vs ddp':>12}{'ms vs ddp':>11}")
    reference = None
    for name in ["ddp", *(s for s in args.strategies if s != "ddp")]:  # ddp first: the reference
        settings = [*common, *STRATEGIES[name], *args.set]
        counted = run_steps(project, slug, work, name, "count", settings, ds)
        timed = run_steps(project, slug, work, name, "time", settings, ds)
        ops = statistics.median(r["ops"] for r in counted)
        reads = statistics.median(r["reads"] for r in counted)
        ms = statistics.median(r["seconds"] for r in timed) * 1e3
        reference = reference or (ops, ms)
        print(f"{name:<10}{ops:>10.0f}{reads:>12.0f}{ms:>10.1f}{ops / reference[0]:>11.2f}x{ms / reference[1]:>10.2f}x")
        rows.append({"strategy": name, "ops": ops, "reads": reads, "ms": ms, "ds": ds if name != "ddp" else {}})
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"(runs kept in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
