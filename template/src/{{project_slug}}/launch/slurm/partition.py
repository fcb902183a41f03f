"""What the nodes of a Slurm partition hold (sinfo), and whether a batch script's request fits one.

    request = requested(script_text, ["--partition=gpu", "--cpus-per-task=20"])  # #SBATCH lines, then options
    problem = partition_problem(request)       # None: it fits, or sinfo is not here; else one line and the fix

sbatch refuses a job that no node of its partition can hold (or leaves it pending for ever where the
cluster does not enforce partition limits), in words that name no answer: a V100 node with 20 cores
for 4 GPUs refuses the default 8 CPUs per GPU. `launch slurm` refuses such a request before sbatch,
naming the answer or option to change; `check` says the same on a machine where sinfo answers.

The nodes are read with one `sinfo -h -N -o <format>` call: one line per node and partition, fields
split by '|', CPUs (%c), memory in MB (%m) and generic resources (%G: gpu:4, gpu:v100:4(S:0-1),
several separated by commas, or (null)). A node's state is not looked at: a node down now is
back later, and Slurm itself judges by the configured nodes. A node whose count is no number, or
more than any node holds (a 5000-digit GPU count is not 0 GPUs), cannot be judged: its partition's
check is skipped, and the caller warns in one line naming the value (partition_problem's notes).

Every Slurm client's output (sinfo here, scontrol, sacct, squeue, scancel and sbatch in
launch/slurm.py) is read by slurm_output: bytes that are not UTF-8 (a job or node name in another
encoding) become U+FFFD, never a traceback.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from ...settings.bounds import MAX_GPUS_PER_NODE, count_in, shown

SINFO_FORMAT = "%P|%N|%c|%m|%G"
# One GPU item of %G: gpu[:type]:count, followed by a socket list "(S:0-1)" or the next item.
GPU_ITEM = re.compile(r"(?:^|,)gpu(?::([^:,(]+))?:([^:,(]*)")
MEMORY_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
# What a node may hold: the largest machines have a few thousand CPUs and tens of TiB; GPUs as
# gres count MIG slices too (7 per GPU).
MOST_CPUS = 2**14
MOST_MEMORY_MB = 2**26
MOST_GPUS = MAX_GPUS_PER_NODE * 8
# How Slurm's clients' output is decoded (subprocess's text mode): see slurm_output.
SLURM_TEXT = {"encoding": "utf-8", "errors": "replace"}


def slurm_output(command: list[str], timeout: float = 30) -> subprocess.CompletedProcess | None:
    """A Slurm client's exit status and output as text (SLURM_TEXT); None where it cannot be started or
    does not answer within `timeout` seconds."""
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout, check=False, **SLURM_TEXT)
    except (OSError, subprocess.TimeoutExpired):
        return None


@dataclass(frozen=True)
class Node:
    name: str
    partition: str
    default_partition: bool
    cpus: int
    memory_mb: int
    gpus: dict[str, int] = field(default_factory=dict)
    """GPUs by type ('' for untyped ones)."""
    unreadable: str = ""
    """What sinfo said of the node that is no plausible count ('' when all of it reads): the node
    cannot be judged, nor its partition."""

    def gpu_count(self, gpu_type: str | None) -> int:
        return self.gpus.get(gpu_type, 0) if gpu_type else sum(self.gpus.values())


def plausible(text: str, most: int) -> int | None:
    """The count sinfo printed, or None where it is no count or more than any node holds."""
    count = count_in(text.strip())
    return count if count is not None and count <= most else None


def parse_gres(text: str) -> dict[str, int] | None:
    """%G of one node: {'v100': 4} for gpu:v100:4(S:0-1), {'': 4} for gpu:4, {} for (null); None
    where a GPU count is no plausible count (parse_sinfo names it)."""
    gpus: dict[str, int] = {}
    for gpu_type, written in GPU_ITEM.findall(text.strip()):
        count = plausible(written, MOST_GPUS)
        if count is None:
            return None
        gpus[gpu_type] = gpus.get(gpu_type, 0) + count
    return gpus if sum(gpus.values()) <= MOST_GPUS else None


def parse_sinfo(text: str) -> list[Node]:
    """The lines of `sinfo -h -N -o SINFO_FORMAT`; a line that is not one (a warning) is skipped, a
    node line with a count that cannot be its own is kept as unreadable."""
    nodes = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        partition, name, cpus, memory, gres = fields
        counts = (plausible(cpus, MOST_CPUS), plausible(memory, MOST_MEMORY_MB), parse_gres(gres))
        words = ("CPUs (%c)", "memory in MB (%m)", "generic resources (%G)")
        unreadable = next(
            (f"{word} {shown(value)}" for word, value, n in zip(words, fields[2:], counts) if n is None), ""
        )
        nodes.append(
            Node(
                name=name,
                partition=partition.rstrip("*"),
                default_partition=partition.endswith("*"),
                cpus=counts[0] or 0,
                memory_mb=counts[1] or 0,
                gpus=counts[2] or {},
                unreadable=unreadable,
            )
        )
    return nodes


def read_nodes() -> list[Node] | None:
    """Every node of every partition from sinfo; None where sinfo is missing or does not answer."""
    if shutil.which("sinfo") is None:
        return None
    out = slurm_output(["sinfo", "-h", "-N", "-o", SINFO_FORMAT])
    return parse_sinfo(out.stdout) if out is not None and out.returncode == 0 else None


# --- The request --------------------------------------------------------------------------------


@dataclass
class Request:
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    gpu_type: str | None
    memory_mb: int | None
    partitions: list[str]
    """Empty: the cluster's default partition."""
    given: set[str]
    """The options set on the command line (they override the script's #SBATCH lines)."""

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * self.cpus_per_task


def sbatch_options(script_text: str) -> dict[str, str]:
    """{option: value} of the script's `#SBATCH --option=value` lines (sbatch stops at the first command)."""
    options = {}
    for line in script_text.splitlines():
        if line.startswith("#SBATCH"):
            for word in line.split()[1:]:
                if word.startswith("#"):
                    break
                key, _, value = word.removeprefix("--").partition("=")
                options[key] = value.strip('"')
        elif line.strip() and not line.startswith("#"):
            break
    return options


def gpu_request(options: dict[str, str]) -> tuple[int, str | None]:
    """(GPUs per node, type or None) of --gpus-per-node=[type:]N or --gres=gpu[:type]:N; (0, None) for none."""
    if "gpus-per-node" in options:
        kind, _, text = options["gpus-per-node"].rpartition(":")
        gpus = count_in(text)
        return (gpus, kind or None) if gpus is not None else (0, None)
    for item in options.get("gres", "").split(","):
        parts = item.split(":")
        gpus = count_in(parts[-1])
        if parts[0] == "gpu" and len(parts) in (2, 3) and gpus is not None:
            return gpus, parts[1] if len(parts) == 3 else None
    return 0, None


def memory_mb(text: str | None) -> int | None:
    """--mem in MB (a unit suffix K/M/G/T, MB without one); None when not asked or 0 (all of it)."""
    found = re.fullmatch(r"([0-9]{1,12})([KMGT]?)B?", (text or "").upper())
    if not found or int(found.group(1)) == 0:
        return None
    return int(int(found.group(1)) * MEMORY_UNITS[found.group(2) or "M"])


def first_count(text: str | None, default: int = 1) -> int:
    """The count of an option such as --nodes=2 or --nodes=2-4 (the minimum); default when not a count."""
    head = (text or "").split("-")[0]
    found = count_in(head)
    return default if found is None else found


def requested(script_text: str, given_options: list[str]) -> Request:
    """The request of the script's #SBATCH lines with the command line's --option=value words on top."""
    options = sbatch_options(script_text)
    given = {}
    for word in given_options:
        key, sep, value = word.removeprefix("--").partition("=")
        if word.startswith("--") and sep:
            given[key] = value
    options.update(given)
    gpus, gpu_type = gpu_request(options)
    partitions = [p for p in options.get("partition", "").split(",") if p]
    return Request(
        nodes=first_count(options.get("nodes")),
        tasks_per_node=first_count(options.get("ntasks-per-node")),
        cpus_per_task=first_count(options.get("cpus-per-task")),
        gpus_per_node=gpus,
        gpu_type=gpu_type,
        memory_mb=memory_mb(options.get("mem")),
        partitions=partitions,
        given=set(given),
    )


# --- The verdict --------------------------------------------------------------------------------


def change(request: Request, option: str, answer: str, option_value: int | str, answer_value: int | str | None) -> str:
    """How to ask for less: the copier answer when the script's line set it, else the option given."""
    if option in request.given or answer_value is None:
        return f"--sbatch-arg=--{option}={option_value}"
    return f"{answer}={answer_value} (`copier update --data {answer}={answer_value}`; for one job --sbatch-arg=--{option}={option_value})"


def partition_problem(request: Request, nodes: list[Node] | None = None, notes: list[str] | None = None) -> str | None:
    """One line naming what no node of the partition holds and the answer to change; None when the
    request fits, or when sinfo cannot tell (not on PATH, no answer, a partition it does not list, a
    node it reports no plausible count of: then one line on `notes` names the value, for a warning)."""
    nodes = read_nodes() if nodes is None else nodes
    if not nodes:
        return None
    if request.partitions:
        members = [n for n in nodes if n.partition in request.partitions]
        where = "partition " + ",".join(request.partitions)
    else:
        members = [n for n in nodes if n.default_partition]
        where = f"default partition {members[0].partition}" if members else ""
    if not members:
        return None  # sbatch names an unknown partition itself
    unreadable = next((n for n in members if n.unreadable), None)
    if unreadable is not None:
        if notes is not None:
            notes.append(
                f"slurm {where}: sinfo reports {unreadable.unreadable} for node {unreadable.name}, which is no count "
                "a node can hold, so the request is not checked against the partition (sbatch judges it)"
            )
        return None
    gpus, kind = request.gpus_per_node, request.gpu_type
    gpu_words = f"{gpus} GPU(s)" + (f" of type {kind}" if kind else "")
    with_gpus = [n for n in members if n.gpu_count(kind) >= gpus]
    if not with_gpus:
        other_types = sorted({t for n in members for t, count in n.gpus.items() if t and count >= gpus})
        if kind and other_types:  # enough GPUs, named otherwise in gres.conf
            fix = change(request, "gpus-per-node", "slurm_gpu_type", f"{other_types[0]}:{gpus}", other_types[0])
            return f"slurm {where}: no node has {gpu_words} (its types: {', '.join(other_types)}); change {fix}"
        most = max(n.gpu_count(kind) for n in members)
        fix = change(request, "gpus-per-node", "gpus_per_node", most, most or None)
        return f"slurm {where}: no node has {gpu_words} (the most: {most}); change {fix}"
    need = request.cpus_per_node
    with_cpus = [n for n in with_gpus if n.cpus >= need]
    if not with_cpus:
        largest = max(with_gpus, key=lambda n: n.cpus)
        per_task = largest.cpus // request.tasks_per_node
        asked = f"{request.tasks_per_node} task(s) x {request.cpus_per_task}" if request.tasks_per_node > 1 else ""
        fix = change(request, "cpus-per-task", "slurm_cpus_per_gpu", per_task, largest.cpus // gpus if gpus else None)
        return (
            f"slurm {where}: the job asks {need} CPUs per node{f' ({asked})' if asked else ''}"
            f"{f' for {gpu_words}' if gpus else ''}, but its largest such node ({largest.name}) has "
            f"{largest.cpus}; change {fix}"
        )
    if request.memory_mb:
        with_memory = [n for n in with_cpus if n.memory_mb >= request.memory_mb]
        if not with_memory:
            largest = max(with_cpus, key=lambda n: n.memory_mb)
            return (
                f"slurm {where}: the job asks {request.memory_mb} MB of memory per node (--mem), but its largest "
                f"such node ({largest.name}) has {largest.memory_mb} MB; change --sbatch-arg=--mem={largest.memory_mb}M"
            )
        with_cpus = with_memory
    fitting = sorted({n.name for n in with_cpus})
    if len(fitting) < request.nodes:
        fix = change(request, "nodes", "nodes", len(fitting), len(fitting))
        return (
            f"slurm {where}: {len(fitting)} node(s) hold {need} CPUs"
            f"{f' and {gpu_words}' if gpus else ''} each ({','.join(fitting)}), the job asks {request.nodes}; "
            f"change {fix}"
        )
    return None
