"""No host sync between logging steps (DESIGN.md section 7): on a step that neither logs, evaluates
nor saves, the package reads nothing back from the device (.item(), .tolist(), .cpu(), .numpy(),
float(), int(), bool(), formatting), so the host keeps queueing the next steps' kernels ahead of
the GPU; losses, norms and the stop agreement (preemption.py) wait for the logging steps. The one
read allowed is the stop agreement's after the run's first step, which times the steps so that slow
ones are agreed on sooner: its numbers are a CPU tensor over Gloo, never the device's.

    python -m pytest -q tests/test_host_syncs.py     # about 30 s on two cores

The real loop runs under torchrun inside COUNTER, this test's own wrapper around `<package> train`:
it wraps those Tensor methods to count their calls per step, on the main thread only (the one that
queues the GPU's work; prefetch.py's reader thread works on CPU tensors). A call counts against
the package when the line making it is in the package. torch's and DeepSpeed's own calls are left
out: torch's unfused AdamW reads its step counter, a CPU tensor, with .item() (on a GPU ddp.py
takes the fused AdamW, which keeps it on the device); DeepSpeed's are listed in
test_host_syncs_deepspeed.py. The same runs on DeepSpeed and the pipeline use these helpers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import PACKAGE, SRC, TRAIN_OVERRIDES

PACKAGE_DIR = SRC / PACKAGE
# Steps 1-4 and 6 are plain, 5 logs, 7 is the last (logs, evaluates, saves).
PLAIN_RUN = ["schedule.max_steps=7", "logging.every_steps=5", "logging.eval_every_steps=0", "checkpoint.every_steps=0"]
PLAIN_STEPS = [1, 2, 3, 4, 6]
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__format__")

COUNTER = """
import atexit, importlib, json, os, sys, threading
from pathlib import Path
import torch

package, out = sys.argv[1], sys.argv[2]
faults = importlib.import_module(package + ".runtime.faults")
counts, current = {}, [None]  # step done -> "method file:line" -> calls

def counting(name, method):
    def counted(self, *args, **kwargs):
        if current[0] is not None and threading.current_thread() is threading.main_thread():
            caller = sys._getframe(1)
            site = f"{name} {caller.f_code.co_filename}:{caller.f_lineno}"
            per_step = counts.setdefault(current[0], {})
            per_step[site] = per_step.get(site, 0) + 1
        return method(self, *args, **kwargs)
    return counted

for name in METHODS:
    setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))

def before_step(rank, step, original=faults.before_step):
    current[0] = step + 1  # the calls until the next step's start belong to this step
    original(rank, step)

faults.before_step = before_step
atexit.register(lambda: Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(counts)))
raise SystemExit(importlib.import_module(package + ".cli").main(sys.argv[3:]))
""".replace("METHODS", repr(SYNC_METHODS))


def count_syncs(cli, demo_data: Path, tmp_path: Path, nproc: int, *overrides: str) -> dict[int, dict[int, dict]]:
    """Rank -> step done -> {"method file:line": calls} of a training run with overrides, then PLAIN_RUN."""
    script, counts = tmp_path / "count_syncs.py", tmp_path / "counts"
    script.write_text(COUNTER)
    counts.mkdir()
    cli.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", nproc),
            *(script, cli.package, counts, "train", *TRAIN_OVERRIDES, *overrides, *PLAIN_RUN),
            *(f"data.dir={demo_data}", f"run.output_dir={tmp_path / 'run'}"),
        ]
    )
    return {
        int(path.stem.removeprefix("rank")): {int(step): sites for step, sites in json.loads(path.read_text()).items()}
        for path in counts.glob("rank*.json")
    }


def calls_from(folder: Path, sites: dict) -> dict:
    return {site: n for site, n in sites.items() if site.split(" ", 1)[1].startswith(f"{folder}/")}


def assert_no_syncs_between_logging_steps(counts: dict, nproc: int) -> None:
    assert sorted(counts) == list(range(nproc)), counts.keys()
    agreement = PACKAGE_DIR / "training" / "preemption.py"
    for rank, steps in counts.items():
        first = {site: n for site, n in steps.get(1, {}).items() if site.split(" ", 1)[1].startswith(f"{agreement}:")}
        assert len(first) == 1 and next(iter(first)).startswith("tolist "), (rank, steps.get(1))
        for step in PLAIN_STEPS:
            found = calls_from(PACKAGE_DIR, steps.get(step, {}))
            if step == 1:
                found = {site: n for site, n in found.items() if site not in first}
            assert found == {}, (rank, step, steps.get(step))
        # The counter works: the logging step reads the loss and the norm.
        assert calls_from(PACKAGE_DIR, steps[5]), (rank, steps[5])


def test_ddp_reads_nothing_from_the_device_between_logging_steps(cli, demo_data, tmp_path):
    assert_no_syncs_between_logging_steps(count_syncs(cli, demo_data, tmp_path, 2), 2)
