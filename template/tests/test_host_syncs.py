"""No host sync between logging steps (DESIGN.md section 7): on a step that neither logs, evaluates
nor saves, the package reads nothing back from the device, so the host keeps queueing the next
steps' kernels ahead of the GPU; losses, norms and the stop agreement (preemption.py) wait for the
logging steps. The one read allowed is the stop agreement's after the run's first step, which times
the steps so that slow ones are agreed on sooner: its numbers are a CPU tensor over Gloo, never the
device's.

    python -m pytest -q tests/test_host_syncs.py     # about 30 s on two cores

The real loop runs under torchrun inside COUNTER, this test's own wrapper around `<package> train`.
On the main thread (the one that queues the GPU's work; prefetch.py's reader thread works on CPU
tensors) a dispatch mode sees every op and counts those whose result the host must wait for:
_local_scalar_dense (.item(), float(), int(), bool(), formatting), ops whose output size depends
on the data (nonzero, boolean indexing, masked_select, unique, ...), copies from a device to the
CPU (seen on a GPU run; on the CPU, .to(device) cannot tell a read from the batch's move); beside
it .tolist(), .numpy() and .cpu(), which read a CPU tensor without dispatching an op.
Each read counts against the innermost caller outside torch, so a torch function the package calls
that reads back is the package's; the only reads left to torch are its optimizers' own (unfused
AdamW's step counter, a CPU tensor also on a GPU run). DeepSpeed's are listed by name and count in
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
# Ops whose result the host waits for: a scalar read, or an output whose size depends on the data.
READ_OPS = (
    "_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "argwhere", "repeat_interleave", "_assert_async", "equal", "is_nonzero",
)  # fmt: skip
# Reads of a CPU tensor that dispatch no op there (on a GPU tensor they are a device-to-host copy).
READ_METHODS = ("tolist", "numpy", "cpu")

COUNTER = """
import atexit, importlib, json, os, sys, threading
from pathlib import Path
import torch
from torch.utils._python_dispatch import TorchDispatchMode

package, out = sys.argv[1], sys.argv[2]
faults = importlib.import_module(package + ".runtime.faults")
counts, current = {}, [None]  # step done -> "what file:line" -> calls
TORCH, HERE = os.path.dirname(torch.__file__) + os.sep, __file__

def count(what, frame):
    \"\"\"Count a read against the innermost caller outside torch (torch.optim's own reads apart).\"\"\"
    if current[0] is None:
        return
    while frame is not None and frame.f_code.co_filename == HERE:
        frame = frame.f_back
    optim = None
    while frame is not None and frame.f_code.co_filename.startswith(TORCH):
        if frame.f_code.co_filename.startswith(TORCH + "optim" + os.sep):
            optim = optim or frame.f_code.co_name
        frame = frame.f_back
    if optim:
        site = f"{what} torch.optim:{optim}"
    else:
        site = f"{what} {frame.f_code.co_filename}:{frame.f_lineno}" if frame else f"{what} <no Python caller>"
    per_step = counts.setdefault(current[0], {})
    per_step[site] = per_step.get(site, 0) + 1

def to_host(name, args, kwargs):
    if name == "copy_":
        source, target = args[1], args[0].device
    elif name == "_to_copy":
        source, target = args[0], kwargs.get("device")
    else:
        return False
    return isinstance(source, torch.Tensor) and source.device.type != "cpu" and str(target).startswith("cpu")

def masked_index(name, args):  # indexing by a boolean mask: its nonzero runs inside the kernel, below this mode
    if name not in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])

class HostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._overloadpacket.__name__
        if name in READ_OPS or masked_index(name, args) or to_host(name, args, kwargs):
            count(name, sys._getframe(1))
        return func(*args, **kwargs)

def counting(name, method):
    def counted(self, *args, **kwargs):
        if threading.current_thread() is threading.main_thread():
            count(name, sys._getframe(1))
        return method(self, *args, **kwargs)
    return counted

for name in READ_METHODS:
    setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))

def before_step(rank, step, original=faults.before_step):
    current[0] = step + 1  # the reads until the next step's start belong to this step
    original(rank, step)

faults.before_step = before_step
atexit.register(lambda: Path(out, f"rank{os.environ['RANK']}.json").write_text(json.dumps(counts)))
with HostReads():  # this thread's ops only: a dispatch mode is thread-local
    code = importlib.import_module(package + ".cli").main(sys.argv[3:])
importlib.import_module(package + ".runtime.process_exit").end(code)  # as the console script ends
""".replace("READ_OPS", repr(READ_OPS)).replace("READ_METHODS", repr(READ_METHODS))


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


def library_file(site: str, library: str | None) -> str | None:
    """ "what <library>/<file>" for a read made in a library's own code, else None."""
    what, where = site.split(" ", 1)
    if library is None or f"/{library}/" not in where:
        return None
    return f"{what} {library}/{where.rsplit(f'/{library}/', 1)[1].rsplit(':', 1)[0]}"


def library_reads(sites: dict, library: str | None) -> dict:
    """The reads a library's own code makes, "what <library>/<file>" -> calls."""
    found = {}
    for site, n in sites.items():
        if key := library_file(site, library):
            found[key] = found.get(key, 0) + n
    return found


def assert_no_syncs_between_logging_steps(counts: dict, nproc: int, library: str | None = None) -> dict:
    """No read on a plain step but torch.optim's own and, given its name, a library's (DeepSpeed):
    returns that library's reads on each plain step after the first, rank by rank."""
    assert sorted(counts) == list(range(nproc)), counts.keys()
    agreement = PACKAGE_DIR / "training" / "preemption.py"
    theirs = {}
    for rank, steps in counts.items():
        first = {site: n for site, n in steps.get(1, {}).items() if site.split(" ", 1)[1].startswith(f"{agreement}:")}
        assert len(first) == 1 and next(iter(first)).startswith("tolist "), (rank, steps.get(1))
        for step in PLAIN_STEPS:
            others = {
                site: n
                for site, n in steps.get(step, {}).items()
                if site not in first and " torch.optim:" not in site and not library_file(site, library)
            }
            assert others == {}, (rank, step, steps.get(step))
        theirs[rank] = [library_reads(steps.get(step, {}), library) for step in PLAIN_STEPS[1:]]
        # The counter works: the logging step reads the loss and the norm.
        assert calls_from(PACKAGE_DIR, steps[5]), (rank, steps[5])
    return theirs


def test_ddp_reads_nothing_from_the_device_between_logging_steps(cli, demo_data, tmp_path):
    assert_no_syncs_between_logging_steps(count_syncs(cli, demo_data, tmp_path, 2), 2)
