"""`launch kubeflow`: submit, watch and cancel the Kubeflow job rendered in launch/kubeflow/.

    <package> launch kubeflow                                # submit launch/kubeflow/pytorchjob.yaml
    <package> launch kubeflow --dry-run                      # print exactly the manifest it would submit
    <package> launch kubeflow --manifest trainjob            # Kubeflow Trainer v2 TrainJob instead
    <package> launch kubeflow --manifest mpijob              # MPIJob: DeepSpeed's launcher (strategy deepspeed)
    <package> launch kubeflow schedule.max_steps=500         # overrides reach `node` -> train in every pod
    <package> launch kubeflow --action status                # conditions, replica counts, restarts of every pod
    <package> launch kubeflow --action logs [--node-rank 1] [--follow]   # a node's log (default: the master)
    <package> launch kubeflow --action cancel                # delete the job; its pods go with it
    <package> launch kubeflow --action status --id ml/other-run   # a job not submitted from here

The manifest is the file copier rendered from the answers (image, namespace, nodes, GPUs, PVC,
RDMA resource, NCCL settings); `--namespace` and `--name` change it for one submission. The actions
find the last job this project submitted (launch/jobs.py), or the one --id namespace/name names. Talking to
the cluster (kubernetes_api.py) uses the `kubernetes` Python client (`pip install kubernetes`, or the project's
`[kubeflow]` extra) with your kubeconfig (KUBECONFIG, --kubeconfig, --context), or the pod's
service account when run inside the cluster. Nothing here needs kubectl.
"""

from __future__ import annotations

import re
import sys
import time
from argparse import ArgumentParser, Namespace
from pathlib import Path

import yaml

from ...planning import storage_paths
from ...runtime import process_exit
from ...settings.bounds import MAX_NODES, non_negative_float, non_negative_int, text_type
from ...settings.config import ConfigError, project_root
from ...settings.stored_files import read_yaml
from .. import code_copy, job_history, jobs
from ..base import Platform
from ..jobs import Job
from .environment import manifest_mounts
from .kubernetes_api import Cluster, context_problem
from .restarts import check_grace, read_restarts

MANIFESTS = ("pytorchjob", "trainjob", "mpijob")
KINDS = ("PyTorchJob", "TrainJob", "MPIJob")
POLL_SECONDS = 5
LOGS_WAIT_SECONDS = 600  # logs: how long a pod may take to be scheduled and pull its image

# RFC 1035 label: both kinds name Services and pod hostnames after the job.
NAME_PATTERN = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
namespace_name = text_type(
    re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"),  # an RFC 1123 label
    "at most 63 lowercase letters, digits and '-', starting and ending alphanumeric, e.g. team-a",
)


def add_arguments(p: ArgumentParser) -> None:
    """Kubeflow's own options (the verbs and --name/--id/--follow/--dry-run are common to every platform)."""
    p.add_argument(
        "--manifest",
        "--kind",
        default="pytorchjob",
        metavar="pytorchjob|trainjob|mpijob|FILE",
        help="launch/kubeflow/pytorchjob.yaml (training-operator, default), launch/kubeflow/trainjob.yaml "
        "(Kubeflow Trainer v2), launch/kubeflow/mpijob.yaml (MPI Operator v2, DeepSpeed's launcher; "
        "projects generated with strategy deepspeed), or a manifest file of your own",
    )
    p.add_argument("--namespace", type=namespace_name, help="namespace to use instead of the manifest's")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument(
        "--node-rank", type=non_negative_int, help="logs: the node whose pod to read (default 0, the master)"
    )
    p.add_argument(
        "--wait",
        type=non_negative_float,
        help=f"logs: seconds to wait for the pod to exist and start (default {LOGS_WAIT_SECONDS})",
    )
    code_copy.add_arguments(p)


# --- The manifest ---------------------------------------------------------------------------------


def manifest_path(choice: str) -> Path:
    if choice in MANIFESTS:
        path = project_root() / "launch" / "kubeflow" / f"{choice}.yaml"
        if not path.is_file() and choice == "mpijob":
            raise ConfigError(
                f"{path} is missing: the MPIJob (DeepSpeed's own launcher) is generated for projects with strategy "
                "deepspeed. Fixes: 1) `copier update --data strategy=deepspeed`; 2) the PyTorchJob (default "
                "--manifest) trains with any strategy, run.strategy=deepspeed included"
            )
        if not path.is_file():
            raise ConfigError(f"{path} is missing: re-render it with `copier update` (kubeflow among the platforms)")
        return path
    path = Path(choice)
    if not path.is_file():
        raise ConfigError(
            f"--manifest {choice}: no such file; use pytorchjob, trainjob, mpijob or the path of a manifest"
        )
    return path


def load_manifest(path: Path) -> dict:
    manifest = read_yaml(path, "correct that line, or re-render the manifest with `copier update`")
    if not isinstance(manifest, dict) or not all(k in manifest for k in ("apiVersion", "kind", "metadata", "spec")):
        raise ConfigError(f"{path} must hold one Kubernetes object with apiVersion, kind, metadata and spec")
    if manifest["kind"] not in KINDS:
        raise ConfigError(
            f"{path}: kind {manifest['kind']!r} is not handled here; use a PyTorchJob, TrainJob or MPIJob"
        )
    node_count(manifest, str(path))  # its pod counts are numbers
    return manifest


def pod_count(value, field: str, where: str) -> int:
    """A count of pods manifest `where` gives at `field`: a whole number up to MAX_NODES, else one line."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_NODES:
        return value
    written = f"{value!r}" if not isinstance(value, int) or value.bit_length() < 64 else "a number of 20 digits or more"
    raise ConfigError(
        f"{where}: {field} is {written}, not a number of pods from 0 to {MAX_NODES}; correct it, or "
        "re-render the manifest with `copier update`"
    )


def node_count(manifest: dict, where: str = "the manifest") -> tuple[int, str]:
    """(nodes, processes per node) the manifest (file `where`) asks for."""
    spec = manifest["spec"]
    if manifest["kind"] == "TrainJob":
        trainer = spec.get("trainer", {})
        return pod_count(trainer.get("numNodes", 1), "spec.trainer.numNodes", where), str(
            trainer.get("numProcPerNode", "auto")
        )
    if manifest["kind"] == "MPIJob":  # the Launcher trains nowhere: the Workers are the nodes
        worker = spec.get("mpiReplicaSpecs", {}).get("Worker", {})
        replicas = pod_count(worker.get("replicas", 1), "spec.mpiReplicaSpecs.Worker.replicas", where)
        return replicas, str(spec.get("slotsPerWorker", 1))
    groups = spec.get("pytorchReplicaSpecs", {})
    nodes = sum(
        pod_count(r.get("replicas", 1), f"spec.pytorchReplicaSpecs.{kind}.replicas", where)
        for kind, r in groups.items()
    )
    return nodes, str(spec.get("nprocPerNode", "auto"))


def training_containers(manifest: dict) -> list[dict]:
    """The dicts whose `command` starts training: the `pytorch` containers, TrainJob's trainer, or the
    MPIJob Launcher's container (its mpirun starts every rank; the Workers only run sshd)."""
    if manifest["kind"] == "TrainJob":
        return [manifest["spec"].setdefault("trainer", {})]
    if manifest["kind"] == "MPIJob":
        launcher = manifest["spec"].get("mpiReplicaSpecs", {}).get("Launcher", {})
        return launcher.get("template", {}).get("spec", {}).get("containers", [])[:1]
    return [
        c
        for r in manifest["spec"].get("pytorchReplicaSpecs", {}).values()
        for c in r.get("template", {}).get("spec", {}).get("containers", [])
        if c.get("name") == "pytorch"
    ]


def check_name(name: str, manifest: dict) -> None:
    nodes, _ = node_count(manifest)
    # The longest name the operator derives: <name>-worker-<i> (training-operator), <name>-node-0-<i>
    # (JobSet) or <name>-launcher and <name>-worker-<i> (MPI Operator); a pod hostname and a Service
    # name are at most 63 characters.
    longest = {
        "PyTorchJob": f"{name}-worker-{max(nodes - 2, 0)}",
        "TrainJob": f"{name}-node-0-{nodes - 1}",
        "MPIJob": max(f"{name}-launcher", f"{name}-worker-{nodes - 1}", key=len),
    }[manifest["kind"]]
    if not NAME_PATTERN.fullmatch(name) or len(longest) > 63:
        raise ConfigError(
            f"job name {name!r} is not allowed: use lowercase letters, digits and '-', starting with a letter, short "
            f"enough that {longest!r} stays within 63 characters"
        )


def prepared_manifest(args: Namespace) -> dict:
    """The manifest file with this invocation's --namespace, --name, --config and overrides applied."""
    manifest = load_manifest(manifest_path(args.manifest))
    meta = manifest["metadata"]
    if args.namespace:
        meta["namespace"] = args.namespace
    meta.setdefault("namespace", "default")
    if args.name:
        meta["name"] = args.name
    check_name(meta.get("name", ""), manifest)
    extra = (["--config", args.config] if args.config else []) + list(args.overrides)
    if extra:
        containers = training_containers(manifest)
        if not containers or not all(c.get("command") for c in containers):
            raise ConfigError(f"{args.manifest}: no training command to pass {' '.join(extra)} to")
        for container in containers:
            container["command"] = list(container["command"]) + extra
    return manifest


# --- Actions ---------------------------------------------------------------------------------------


def status(cluster: Cluster, job: dict) -> int:
    state = job.get("status") or {}
    conditions = state.get("conditions") or []
    print(f"{cluster.kind} {cluster.namespace}/{cluster.name}")
    if not conditions and not (state.get("replicaStatuses") or state.get("jobsStatus")):
        print("  no conditions yet (the operator has not picked the job up: is it running?)")
    for c in conditions:
        print(
            f"  {c.get('lastTransitionTime', ''):<22} {c.get('type', ''):<11} {c.get('status', ''):<6} "
            f"{c.get('reason', '')}: {c.get('message', '')}"
        )
    for role, counts in (state.get("replicaStatuses") or {}).items():  # PyTorchJob, MPIJob
        print(f"  {role}: " + ", ".join(f"{k} {v}" for k, v in counts.items() if k != "selector"))
    for job_status in state.get("jobsStatus") or []:  # TrainJob (JobSet's replicated jobs)
        print(f"  {job_status.get('name')}: " + ", ".join(f"{k} {v}" for k, v in job_status.items() if k != "name"))
    for line in read_restarts(cluster, job):
        print(f"  {line}")
    return 0


def state_words(job: dict) -> str | None:
    """The job's state as a record keeps it: its newest true condition (Created, Running, Restarting,
    Succeeded, Failed, Suspended) with that condition's reason."""
    true = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    if not true:
        return None
    newest = max(true, key=lambda c: c.get("lastTransitionTime") or "")
    return newest.get("type", "?") + (f" ({newest['reason']})" if newest.get("reason") else "")


def logs(cluster: Cluster, args: Namespace, record: Job | None = None) -> int:
    """Node `--node-rank`'s pod log; what it shows of training is kept in the record's history."""
    nodes, _ = node_count(cluster.manifest)
    node_rank = args.node_rank or 0
    wait = LOGS_WAIT_SECONDS if args.wait is None else args.wait
    if cluster.kind == "MPIJob" and node_rank:
        raise ConfigError(
            "an MPIJob's output, every rank's, arrives in the Launcher's log: drop --node-rank "
            "(the Workers' own logs are sshd's)"
        )
    if not 0 <= node_rank < nodes:
        raise ConfigError(f"--node-rank {node_rank} must be between 0 and {nodes - 1} for this {nodes}-node job")
    job = cluster.get()  # a clear "not found" before waiting for pods
    selector, container = cluster.node_selector(node_rank)
    deadline = time.monotonic() + wait
    said = None
    while True:
        pod = cluster.node_pod(selector)
        phase = pod.status.phase if pod else None
        if phase in ("Running", "Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            raise ConfigError(
                f"node {node_rank}'s pod is {'not created' if pod is None else phase} after "
                f"{wait:.0f} s: `launch kubeflow --action status --id {cluster.namespace}/"
                f"{cluster.name}`, and `kubectl describe pod -l {selector} -n {cluster.namespace}` "
                "for scheduling events"
            )
        if phase != said:
            where = f"{pod.metadata.name} {phase}" if pod else "not created yet"
            print(f"waiting for node {node_rank}'s pod ({where})", file=sys.stderr, flush=True)
            said = phase
        time.sleep(POLL_SECONDS)
    print(f"--- {pod.metadata.name} ({phase})", file=sys.stderr, flush=True)
    watcher = job_history.LogWatcher()
    try:
        cluster.stream_log(pod.metadata.name, container, args.follow, watcher)
    except KeyboardInterrupt as exc:
        return process_exit.interrupted_code(exc)
    finally:
        if record is not None:
            job_history.remember(record, "logs", state_words(job), watcher)
    return 0


def cancel(cluster: Cluster) -> int:
    cluster.delete()
    print(f"deleted {cluster.kind} {cluster.namespace}/{cluster.name}; Kubernetes removes its pods")
    return 0


def first_image(manifest: dict) -> str:
    containers = training_containers(manifest)
    return containers[0].get("image", "") if containers else ""


def run_from_copy(manifest: dict, copy: Path, image: str | None, package: str) -> None:
    """The training containers start the copy's node start, in the ready-made image."""
    if manifest["kind"] == "MPIJob":
        raise ConfigError(
            "--code-from-storage: the MPIJob's Launcher runs mpirun from the image's shell script and its Workers "
            "need sshd in the image; use --manifest pytorchjob (or trainjob), which train with any strategy"
        )
    for container in training_containers(manifest):
        container["command"] = code_copy.node_command(list(container.get("command") or []), copy, package)
        if image:
            container["image"] = image


class Kubeflow(Platform):
    name = "kubeflow"
    action_options = {"node_rank": ("--node-rank", ("logs",)), "wait": ("--wait", ("logs",))}
    extra_fields = {"manifest": str, "kind": str, "namespace": str, **job_history.RUN_FIELDS}
    add_arguments = staticmethod(add_arguments)

    def _manifest(self) -> tuple[dict, Path | None]:
        """The manifest to submit, and the project's copy it runs (None: the image's code)."""
        manifest = prepared_manifest(self.args)
        check_grace(manifest, self.cfg.cluster.stop_grace_seconds)
        from_storage, image = code_copy.ready_image(self.args)
        copy = code_copy.copy_project(self.cfg, dry_run=True) if from_storage else None  # where it goes
        mounts = manifest_mounts(manifest)
        storage_paths.require_on_storage(self.cfg, mounts, str(manifest_path(self.args.manifest)), copy)
        if copy is None:
            return manifest, None
        storage_paths.require_writable_folder("the project's copy", copy.parent)
        copy = code_copy.copy_project(self.cfg, dry_run=self.args.dry_run)
        run_from_copy(manifest, copy, image, self.package)
        return manifest, copy

    def dry_run(self) -> int:
        manifest, copy = self._manifest()
        if self.args.kubeconfig and not Path(self.args.kubeconfig).is_file():  # the submit would stop there
            raise ConfigError(f"--kubeconfig {self.args.kubeconfig} is no file; give your cluster's kubeconfig")
        wrong_context = context_problem(self.args)
        if wrong_context:
            raise ConfigError(wrong_context)
        if copy is not None:
            print(f"note: submitting copies the project to {copy}", file=sys.stderr)
        sys.stdout.write(yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False))
        return 0

    def submit(self) -> int:
        manifest, copy = self._manifest()
        cluster = Cluster(self.args, manifest)
        created = cluster.submit()
        name = created["metadata"]["name"]
        job = jobs.new_job(
            self.name,
            f"{cluster.namespace}/{name}",
            name=name,
            where=cluster.host,
            image=first_image(manifest),
            code_copy=str(copy or ""),
            extra={
                "manifest": self.args.manifest,
                "kind": cluster.kind,
                "namespace": cluster.namespace,
                **job_history.run_fields(self.cfg),
            },
        )
        jobs.record(job)
        nodes, nproc = node_count(manifest)
        print(
            f"submitted {cluster.kind} {cluster.namespace}/{name}: {nodes} node(s) x {nproc} process(es), "
            f"to {cluster.host}"
        )
        print(self.hint(job))
        return 0

    def job_named(self, job_id: str | None, name: str | None) -> Job | None:
        namespace, _, short = (job_id or "").rpartition("/")
        name = short or name
        namespace = namespace or self.args.namespace or ""
        return Job(self.name, f"{namespace}/{name}", name=name, extra={"namespace": namespace}) if name else None

    def default_job(self) -> Job | None:
        """Nothing submitted from here: the job the manifest names (submitted with kubectl, say)."""
        meta = prepared_manifest(self.args)["metadata"]
        return Job(
            self.name,
            f"{meta['namespace']}/{meta['name']}",
            name=meta["name"],
            extra={"namespace": meta["namespace"], "manifest": self.args.manifest},
        )

    def _cluster(self, job: Job) -> Cluster:
        """The cluster and the job's manifest: its kind from the record (or --manifest), its name and namespace."""
        args = Namespace(**vars(self.args))
        if args.manifest == "pytorchjob" and job.extra.get("manifest"):
            args.manifest = job.extra["manifest"]
        args.namespace = job.extra.get("namespace") or args.namespace
        args.name = job.name or job.id.rpartition("/")[2]
        args.overrides, args.config = [], None
        return Cluster(args, prepared_manifest(args))

    def status(self, job: Job) -> int:
        if job.submitted:
            print(job.describe())
        cluster = self._cluster(job)
        found = cluster.find()
        if found is None:
            return job_history.answer_from_records(
                job,
                f"the cluster has no {cluster.kind} {cluster.namespace}/{cluster.name}: deleted (by its TTL after "
                "it ended, by `--action cancel`, by hand) or never submitted there "
                f"(`kubectl get {cluster.plural} -A` lists them)",
                output_dir=job_history.run_folder(job),
            )
        code = status(cluster, found)
        job_history.remember(job, "status", state_words(found))
        return code

    def logs(self, job: Job) -> int:
        return logs(self._cluster(job), self.args, job)

    def cancel(self, job: Job) -> int:
        code = cancel(self._cluster(job))
        job_history.remember(job, "cancel", "deleted")  # the cluster forgets it now: status answers from this
        return code


PLATFORM = Kubeflow
