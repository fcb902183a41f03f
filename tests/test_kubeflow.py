"""Kubeflow: the rendered PyTorchJob, TrainJob and (strategy deepspeed) MPIJob pass the real CRD
schemas as a strict API server would check them, their pod templates pass as core Pods, they say
what the answers said, and `launch kubeflow` prints exactly what it would submit and fails clearly
without a cluster. tests/test_mpijob.py runs the MPIJob's Launcher command for real.

    python -m pytest tests/test_kubeflow.py
    K8S_SCHEMA_DIR=/path/to/crds python -m pytest tests/test_kubeflow.py   # e.g. a live cluster's CRDs

The CRD files default to tests/k8s-crds (see k8s_schemas.py); no API server is needed.
"""

from __future__ import annotations

import copy
import re
import sys

import pytest
import yaml
from conftest import BIN, free_port, render, run, run_project_suite
from k8s_schemas import core_errors, pod_template, to_json_schema, validation_errors
from test_generated_project import part_tests

PLATFORMS = "[devmachine, kubeflow]"
# strategy deepspeed adds launch/kubeflow/mpijob.yaml: nodes 1/2/4/16, every fabric, with and
# without a pull secret; the DDP sets check that it is absent there.
ANSWER_SETS = {
    "one-node": {"project_name": "Solo Run", "nodes": 1, "gpus_per_node": 8, "strategy": "deepspeed"},
    "four-nodes": {
        "project_name": "Four Nodes",
        "nodes": 4,
        "gpus_per_node": 8,
        "k8s_namespace": "ml-training",
        "strategy": "deepspeed",
    },
    "no-rdma": {"project_name": "Plain TCP", "nodes": 2, "gpus_per_node": 1, "rdma_resource": ""},
    "pull-secret": {
        "project_name": "Private Image",
        "nodes": 3,
        "gpus_per_node": 4,
        "image": "registry.internal:5000/team/gpt:v1",
        "image_pull_secret": "regcred",
        "pvc_name": "team.shared-data",
        "rdma_resource": "rdma/rdma_shared_device_a",
        "shared_mount": "/data/shared",
        "strategy": "deepspeed",
    },
    "odd-name": {
        "project_name": '\u00dcn\u00efcode: "quotes" $HOME; run #2 & <tags> {braces}',
        "nodes": 2,
        "gpus_per_node": 8,
        "strategy": "deepspeed",
    },
    # No RDMA on the fabric: no RDMA resource requested, whatever rdma_resource says.
    "tcp-fabric": {
        "project_name": "Tcp Fabric",
        "nodes": 2,
        "gpus_per_node": 8,
        "fabric": "tcp",
        "strategy": "deepspeed",
    },
    "roce-fabric": {
        "project_name": "Roce Fabric",
        "nodes": 2,
        "gpus_per_node": 8,
        "fabric": "roce",
        "strategy": "deepspeed",
    },
    # The longest slug (40) with many nodes: pod and Service names must still fit 63 characters.
    "long-name": {"project_name": "x" * 60, "nodes": 16, "gpus_per_node": 8},
    # Every placement answer set, as the nanochat PyTorchJob places its pods: one RDMA device per
    # GPU, GPU type and driver pinned by node labels, tolerated taints, CPU and memory, gang scheduling.
    "placement": {
        "project_name": "Placed",
        "nodes": 2,
        "gpus_per_node": 8,
        "fabric": "roce",
        "strategy": "deepspeed",
        "rdma_resource": "rdma/hca_shared_devices_ib",
        "rdma_per_pod": 8,
        "k8s_node_labels": "nvidia.com/gpu.product=NVIDIA-A800-SXM4-80GB|NVIDIA-H800,"
        "nvidia.com/cuda.driver.major=535,feature.node.kubernetes.io/rdma.capable",
        "k8s_tolerations": "nvidia.com/gpu:NoSchedule,dedicated=training:NoExecute,spot",
        "k8s_cpu_request": "64",
        "k8s_cpu_limit": "96",
        "k8s_memory_request": "512Gi",
        "k8s_gang_scheduler": "volcano",
        "k8s_queue": "training",
        "k8s_priority_class": "high-priority",
        "trackers": "[tensorboard, mlflow, wandb]",
    },
    # scheduler-plugins coscheduling with its own scheduler name; only a memory limit.
    "coscheduling": {
        "project_name": "Cosched",
        "nodes": 3,
        "gpus_per_node": 4,
        "k8s_gang_scheduler": "scheduler-plugins",
        "k8s_memory_limit": "256Gi",
        "k8s_node_labels": "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "trackers": "[mlflow]",
    },
}
# The variables of each tracker that reach the pods from the secret <slug>-trackers.
TRACKER_ENV = {
    "mlflow": ["MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"],
    "wandb": ["WANDB_API_KEY", "WANDB_BASE_URL"],
}
# The placement of the "placement" set as the manifests must carry it.
PLACED_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "nvidia.com/gpu.product",
                            "operator": "In",
                            "values": ["NVIDIA-A800-SXM4-80GB", "NVIDIA-H800"],
                        },
                        {"key": "nvidia.com/cuda.driver.major", "operator": "In", "values": ["535"]},
                        {"key": "feature.node.kubernetes.io/rdma.capable", "operator": "Exists"},
                    ]
                }
            ]
        }
    }
}
PLACED_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoExecute"},
    {"key": "spot", "operator": "Exists"},
]
DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# SIGTERM to SIGKILL in every pod: cluster.stop_grace_seconds (120, config/train.yaml) + 60 s.
GRACE_SECONDS = 180


class Project:
    """A rendered project with the answers it was rendered from (copier's answers file)."""

    def __init__(self, path):
        self.path = path
        self.answers = yaml.safe_load((path / ".copier-answers.yml").read_text())
        self.slug = self.answers["project_slug"]

    def manifest(self, name: str) -> dict:
        return yaml.safe_load((self.path / "launch" / "kubeflow" / f"{name}.yaml").read_text())

    def tracker_env(self) -> list[str]:
        """The tracker variables the answers' trackers read from the secret, in the manifests' order."""
        chosen = self.answers.get("trackers", ["tensorboard"])
        return [name for tracker, names in TRACKER_ENV.items() if tracker in chosen for name in names]

    def nccl_env(self) -> dict[str, str]:
        pairs = (
            line.split("=", 1)
            for line in (self.path / "config" / "nccl.env").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        )
        return {key.strip(): value.strip() for key, value in pairs}

    def cli(self, *args, env: dict | None = None):
        """`python -m <slug> ARGS` from the project root, as a user runs it."""
        return run(
            [str(BIN / "python"), "-m", self.slug, *map(str, args)],
            cwd=self.path,
            env={"PYTHONPATH": str(self.path / "src"), "KUBERNETES_SERVICE_HOST": "", **(env or {})},
        )


def render_kubeflow(dst, **answers) -> Project:
    answers = {"platforms": PLATFORMS, **answers}
    mount = answers.get("shared_mount", "/mnt/shared")
    return Project(render(dst, **answers, data_dir=f"{mount}/d/data", output_dir=f"{mount}/d/runs"))


@pytest.fixture(scope="module", params=list(ANSWER_SETS))
def project(request, tmp_path_factory) -> Project:
    project = render_kubeflow(tmp_path_factory.mktemp(request.param) / "p", **ANSWER_SETS[request.param])
    project.given = ANSWER_SETS[request.param]
    return project


@pytest.fixture(scope="module")
def solo(tmp_path_factory) -> Project:
    return render_kubeflow(tmp_path_factory.mktemp("solo") / "p", project_name="KF Solo", nodes=2, gpus_per_node=2)


def replica_specs(manifest: dict) -> dict:
    return manifest["spec"]["pytorchReplicaSpecs"]


def runtime_pod(manifest: dict) -> dict:
    """The pod a TrainJob's `node` replicated job gets: the runtimePatches pod template with the
    trainer's image, command, env and resources in the `node` container (as the runtime merges them)."""
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"
    template = copy.deepcopy(patch["template"]["spec"]["template"])
    trainer = manifest["spec"]["trainer"]
    (container,) = template["spec"]["containers"]
    assert container["name"] == "node"  # the torch-distributed runtime's container
    container.update(
        image=trainer["image"], command=trainer["command"], env=trainer["env"], resources=trainer["resourcesPerNode"]
    )
    return template


# --- Schemas -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_manifest_passes_its_crd_schema(project, kind):
    manifest = project.manifest(kind)
    assert validation_errors(manifest) == []
    # What the CRDs check with CEL or the operators' webhooks (not JSON Schema): names are RFC 1035
    # labels, and every name derived from the job stays within 63 characters.
    nodes = project.answers["nodes"]
    name = manifest["metadata"]["name"]
    derived = (
        [f"{name}-master-0"] + [f"{name}-worker-{i}" for i in range(nodes - 1)]
        if kind == "pytorchjob"
        else [f"{name}-node-0-{i}" for i in range(nodes)]
    )
    for value in [name, *derived]:
        assert DNS1035.fullmatch(value) and len(value) <= 63, value


def test_pod_templates_are_valid_core_pods(project):
    for role, spec in replica_specs(project.manifest("pytorchjob")).items():
        assert core_errors(pod_template(f"{project.slug}-{role.lower()}", spec["template"])) == [], role
    assert core_errors(pod_template(f"{project.slug}-node", runtime_pod(project.manifest("trainjob")))) == []


def test_validators_reject_what_a_strict_api_server_rejects(solo):
    job = solo.manifest("pytorchjob")
    master = lambda m: replica_specs(m)["Master"]["template"]["spec"]  # noqa: E731
    cases = {
        "spec: Additional properties are not allowed ('nprocsPerNode'": lambda m: m["spec"].update(
            nprocsPerNode=m["spec"].pop("nprocPerNode")
        ),
        "containers.0: Additional properties are not allowed ('volumeMount'": lambda m: master(m)["containers"][
            0
        ].update(volumeMount=[]),
        "spec.nprocPerNode: 8 is not of type 'string'": lambda m: m["spec"].update(nprocPerNode=8),
        "spec.runPolicy: Additional properties are not allowed ('backofLimit'": lambda m: m["spec"]["runPolicy"].update(
            backofLimit=3
        ),
        "limits.nvidia.com/gpu: '2 GPUs' does not match": lambda m: master(m)["containers"][0]["resources"][
            "limits"
        ].update({"nvidia.com/gpu": "2 GPUs"}),
    }
    for expected, breaks in cases.items():
        broken = copy.deepcopy(job)
        breaks(broken)
        errors = validation_errors(broken)
        assert any(expected in e for e in errors), (expected, errors)
    train = solo.manifest("trainjob")
    train["spec"]["trainer"]["numNode"] = train["spec"]["trainer"].pop("numNodes")
    assert any("'numNode' was unexpected" in e for e in validation_errors(train))
    # The core-kind check fails too: a misspelled container field and a wrong volume medium type.
    template = copy.deepcopy(replica_specs(job)["Master"]["template"])
    template["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert any("'imagePullPolcy' was unexpected" in e for e in core_errors(pod_template("x", template)))
    template = copy.deepcopy(replica_specs(job)["Master"]["template"])
    template["spec"]["volumes"][0]["emptyDir"]["medium"] = 1
    assert core_errors(pod_template("x", template))


def test_structural_schema_conversion():
    schema = to_json_schema(
        {
            "type": "object",
            "properties": {
                "port": {"x-kubernetes-int-or-string": True},
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"a": {"type": "string"}},
                },
                "maybe": {"type": "string", "nullable": True},
                "nested": {"type": "object", "properties": {"b": {"type": "integer"}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        }
    )
    import jsonschema

    ok = [{"port": 80}, {"port": "http"}, {"free": {"a": "x", "anything": 1}}, {"maybe": None}, {"labels": {"k": "v"}}]
    bad = [{"port": 1.5}, {"port": True}, {"nested": {"c": 1}}, {"extra": 1}, {"labels": {"k": 1}}]
    validator = jsonschema.Draft7Validator(schema)
    assert [list(validator.iter_errors(x)) for x in ok] == [[]] * len(ok)
    assert all(list(validator.iter_errors(x)) for x in bad)


def test_schema_folder_is_configurable(solo, tmp_path, monkeypatch):
    """K8S_SCHEMA_DIR takes `kubectl get crd ... -o yaml` output (a List) under any file name."""
    from k8s_schemas import schema_dir

    crd = yaml.safe_load((schema_dir() / "training-operator.kubeflow.org_pytorchjobs.yaml").read_text())
    (tmp_path / "live.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [crd]}))
    monkeypatch.setenv("K8S_SCHEMA_DIR", str(tmp_path))
    job = solo.manifest("pytorchjob")
    assert validation_errors(job) == []
    job["spec"]["unknownField"] = 1
    assert validation_errors(job)
    with pytest.raises(LookupError, match="kubectl get crd"):
        validation_errors(solo.manifest("trainjob"))  # that CRD is not in the folder
    monkeypatch.setenv("K8S_SCHEMA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="K8S_SCHEMA_DIR"):
        validation_errors(job)


# --- Content -------------------------------------------------------------------------------------


def test_pytorchjob_says_what_the_answers_say(project):
    a, job = project.answers, project.manifest("pytorchjob")
    nodes, gpus = a["nodes"], a["gpus_per_node"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["metadata"] == {
        "name": project.slug,
        "namespace": a["k8s_namespace"],
        "labels": {"app.kubernetes.io/name": project.slug},
    }
    assert job["spec"]["nprocPerNode"] == str(gpus)
    assert job["spec"]["runPolicy"]["backoffLimit"] == 3 and job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    specs = replica_specs(job)
    assert set(specs) == ({"Master", "Worker"} if nodes > 1 else {"Master"})
    assert specs["Master"]["replicas"] == 1
    if nodes > 1:
        assert specs["Worker"]["replicas"] == nodes - 1
    for spec in specs.values():
        # Retryable exits (143 after a preemption save, 137) recreate the pod; 1-127 fail the job.
        assert spec["restartPolicy"] == "ExitCode"
        pod = spec["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == GRACE_SECONDS
        (container,) = pod["containers"]
        assert container["name"] == "pytorch" and container["image"] == a["image"]
        assert container["command"] == [project.slug, "node"]
        assert_pod_content(project, pod, container)


def test_trainjob_says_what_the_answers_say(project):
    a, job = project.answers, project.manifest("trainjob")
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["metadata"]["name"] == project.slug and job["metadata"]["namespace"] == a["k8s_namespace"]
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == a["nodes"] and trainer["numProcPerNode"] == a["gpus_per_node"]
    assert trainer["image"] == a["image"] and trainer["command"] == [project.slug, "node"]
    pod = runtime_pod(job)
    assert pod["spec"]["terminationGracePeriodSeconds"] == GRACE_SECONDS
    assert_pod_content(project, pod["spec"], pod["spec"]["containers"][0])


def assert_pod_content(project: Project, pod: dict, container: dict) -> None:
    a = project.answers
    # rdma_resource is not asked on a TCP fabric, so it is not among the answers there.
    gpus, rdma = a["gpus_per_node"], a.get("rdma_resource", "")
    devices = {"nvidia.com/gpu": gpus, **({rdma: a.get("rdma_per_pod", 1)} if rdma and a["fabric"] != "tcp" else {})}
    asked = lambda **keys: {name: a[key] for name, key in keys.items() if a.get(key)}  # noqa: E731
    assert container["resources"] == {
        "requests": {**devices, **asked(cpu="k8s_cpu_request", memory="k8s_memory_request")},
        "limits": {
            **devices,
            **asked(
                cpu="k8s_cpu_limit", memory="k8s_memory_limit" if a.get("k8s_memory_limit") else "k8s_memory_request"
            ),
        },
    }
    if a.get("rdma_resource") and a["fabric"] != "tcp":
        assert a["rdma_per_pod"] == project.given.get("rdma_per_pod", 1)  # older projects' count unless asked
    if project.given.get("k8s_memory_request") and not project.given.get("k8s_memory_limit"):  # limit = request
        assert container["resources"]["limits"]["memory"] == project.given["k8s_memory_request"]
    if a["fabric"] != "tcp":
        assert (rdma == "") == (project.given.get("rdma_resource") == "")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{8 * gpus}Gi"}
    assert mounts["dshm"] == "/dev/shm"
    assert volumes["shared"]["persistentVolumeClaim"] == {"claimName": a["pvc_name"]}
    assert mounts["shared"] == a["shared_mount"]
    for path in (a["data_dir"], a["output_dir"]):
        assert path.startswith(a["shared_mount"] + "/")
    # The same NCCL settings as config/nccl.env, names and values, and the TRAIN_DEBUG switch, off.
    nccl = project.nccl_env()
    plain = [e for e in container["env"] if "valueFrom" not in e]
    assert len(nccl) >= 2 and {e["name"]: e["value"] for e in plain} == {**nccl, "TRAIN_DEBUG": "0"}
    # The trackers' server and credentials: each from the project's secret, optional, never a value.
    from_secret = [e for e in container["env"] if "valueFrom" in e]
    assert [e["name"] for e in from_secret] == project.tracker_env()
    for e in from_secret:
        ref = {"name": f"{project.slug}-trackers", "key": e["name"], "optional": True}
        assert e == {"name": e["name"], "valueFrom": {"secretKeyRef": ref}}
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    secret = a.get("image_pull_secret", "")
    assert pod.get("imagePullSecrets") == ([{"name": secret}] if secret else None)
    assert (secret == "regcred") == ("image_pull_secret" in project.given)
    assert pod["containers"] == [container]


def placed_pods(project: Project) -> dict[str, dict]:
    """Every pod spec of every manifest, by kind and role; the TrainJob's as the runtime patch gives it."""
    pods = {
        f"pytorchjob {role}": s["template"]["spec"] for role, s in replica_specs(project.manifest("pytorchjob")).items()
    }
    pods["trainjob node"] = runtime_pod(project.manifest("trainjob"))["spec"]
    if project.answers["strategy"] == "deepspeed":
        for role, spec in mpi_specs(project.manifest("mpijob")).items():
            pods[f"mpijob {role}"] = spec["template"]["spec"]
    return pods


def test_placement_answers_reach_every_pod(project):
    """Node labels, tolerations, scheduler and priority class are in every pod that can carry them, and
    nowhere when not asked: a TrainJob's runtime patch has no schedulerName or priorityClassName (the
    runtime's pod template decides), and the MPIJob Launcher (no GPU) is not pinned to GPU nodes."""
    a = project.answers
    gang, given = a.get("k8s_gang_scheduler", "none"), project.given
    labels = given.get("k8s_node_labels", "")
    for where, pod in placed_pods(project).items():
        pinned = bool(labels) and where != "mpijob Launcher"
        if pinned and labels == ANSWER_SETS["placement"]["k8s_node_labels"]:
            assert pod["affinity"] == PLACED_AFFINITY, where
        elif pinned:  # one key=value label: one In expression
            key, value = labels.split("=")
            (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
            assert term == {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}, where
        else:
            assert "affinity" not in pod, where
        assert pod.get("tolerations") == (PLACED_TOLERATIONS if given.get("k8s_tolerations") else None), where
        carries = where != "trainjob node"
        expected_scheduler = a["k8s_scheduler_name"] if gang != "none" and carries else None
        assert pod.get("schedulerName") == expected_scheduler, where
        expected_priority = a.get("k8s_priority_class") or None
        assert pod.get("priorityClassName") == (expected_priority if carries else None), where
    if gang == "scheduler-plugins":
        assert a["k8s_scheduler_name"] == "scheduler-plugins-scheduler"  # the chart's second scheduler
    # Gang scheduling: a PodGroup of every pod of the job (the MPIJob's Launcher included).
    policy = {"minAvailable": a["nodes"], "queue": a.get("k8s_queue"), "priorityClass": a.get("k8s_priority_class")}
    policy = {key: value for key, value in policy.items() if value}
    assert project.manifest("pytorchjob")["spec"]["runPolicy"].get("schedulingPolicy") == (
        policy if gang != "none" else None
    )
    if a["strategy"] == "deepspeed":
        mpi_policy = project.manifest("mpijob")["spec"]["runPolicy"].get("schedulingPolicy")
        assert mpi_policy == ({**policy, "minAvailable": a["nodes"] + 1} if gang != "none" else None)
    annotations = project.manifest("trainjob")["metadata"].get("annotations")
    queue = a.get("k8s_queue") if gang == "volcano" else ""
    assert annotations == ({"scheduling.volcano.sh/queue-name": queue} if queue else None)


def test_placement_in_the_readme(project):
    readme = (project.path / "launch" / "kubeflow" / "README.md").read_text()
    a = project.answers
    gang = a["k8s_gang_scheduler"]
    assert (f"`--gang-scheduler-name={gang}`" in readme) == (gang != "none")
    assert (f"Nodes labelled `{a['k8s_node_labels']}`" in readme) == bool(a["k8s_node_labels"])
    if a.get("rdma_resource") and a["fabric"] != "tcp":
        assert f"({a['rdma_per_pod']} per pod: `rdma_per_pod`)" in readme


def test_no_secret_values_in_manifests(project):
    """Only a Secret's name is ever written: no inline credentials, no Secret objects; the one secret read
    is the trackers' (assert_pod_content checks each reference)."""
    for kind in ("pytorchjob", "trainjob"):
        text = (project.path / "launch" / "kubeflow" / f"{kind}.yaml").read_text()
        assert text.isascii()
        for word in ("kind: Secret", "dockerconfigjson", "password:", "token:"):
            assert word not in text, (kind, word)
        refs = re.findall(r"secretKeyRef: \{name: \"([^\"]+)\"", text)
        assert set(refs) == ({f"{project.slug}-trackers"} if project.tracker_env() else set()), kind
        assert (
            text.count("valueFrom")
            == len(refs)
            == len(project.tracker_env()) * (2 if kind == "pytorchjob" and project.answers["nodes"] > 1 else 1)
        )


def test_no_kubeflow_files_without_the_platform(default_project):
    plain = Project(default_project)
    assert "kubeflow" not in plain.answers["platforms"] and not (plain.path / "launch" / "kubeflow").exists()
    assert not (plain.path / "tests" / "test_launch_kubeflow.py").exists()
    proc = plain.cli("launch", "kubeflow", "--dry-run")
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "copier update" in proc.stderr


# --- launch kubeflow -----------------------------------------------------------------------------


@pytest.mark.quick
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_dry_run_prints_exactly_the_manifest(solo, kind):
    proc = solo.cli("launch", "kubeflow", "--manifest", kind, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == solo.manifest(kind)
    # Options change the submission, and only what they name; overrides reach every training command.
    proc = solo.cli(
        "launch",
        "kubeflow",
        "--manifest",
        kind,
        "--dry-run",
        "--namespace",
        "other",
        "--name",
        "run-2",
        "schedule.max_steps=5",
        "--set",
        "optim.lr=0.001",
    )
    assert proc.returncode == 0, proc.stderr
    changed, original = yaml.safe_load(proc.stdout), solo.manifest(kind)
    assert validation_errors(changed) == []
    assert changed["metadata"] == {**original["metadata"], "namespace": "other", "name": "run-2"}
    commands = (
        [r["template"]["spec"]["containers"][0]["command"] for r in replica_specs(changed).values()]
        if kind == "pytorchjob"
        else [changed["spec"]["trainer"]["command"]]
    )
    assert len(commands) == (2 if kind == "pytorchjob" else 1)
    for command in commands:
        assert command == [solo.slug, "node", "optim.lr=0.001", "schedule.max_steps=5"]


READY_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"


@pytest.fixture(scope="module")
def ready(tmp_path_factory) -> Project:
    """code_from=storage: a ready-made image, the code copied to the shared storage at each launch."""
    root = tmp_path_factory.mktemp("ready")
    return render_kubeflow(
        root / "p",
        project_name="KF Ready",
        nodes=2,
        gpus_per_node=2,
        code_from="storage",
        ready_image=READY_IMAGE,
        shared_mount=str(root / "shared"),
    )


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_ready_image_runs_the_code_copied_to_the_shared_storage(ready, kind):
    proc = ready.cli("launch", "kubeflow", "--manifest", kind, "--dry-run", "schedule.max_steps=5")
    assert proc.returncode == 0, proc.stderr
    copy = re.fullmatch(r"note: submitting copies the project to (\S+)\n", proc.stderr).group(1)
    assert re.fullmatch(rf"{ready.answers['shared_mount']}/d/code/\d{{8}}T\d{{6}}Z-[0-9a-f]{{12}}", copy), copy
    shown, original = yaml.safe_load(proc.stdout), ready.manifest(kind)
    assert validation_errors(shown) == []
    containers = training_containers_of(shown)
    assert len(containers) == (2 if kind == "pytorchjob" else 1)
    for container in containers:
        assert container["image"] == READY_IMAGE
        assert container["command"] == [
            "python",
            f"{copy}/src/{ready.slug}/cluster/ready_image.py",
            "node",
            "schedule.max_steps=5",
        ]
    # The rendered manifest keeps the project's own image and command; only the submission changes.
    assert [c["command"] for c in training_containers_of(original)] == [[ready.slug, "node"]] * len(containers)
    assert not (ready.path.parent / "shared" / "d" / "code").exists()  # a dry run copies nothing
    # Another image for one job; or the project's own image, as before.
    other = ready.cli("launch", "kubeflow", "--manifest", kind, "--dry-run", "--image", "registry.example.com/pt:2.6")
    assert {c["image"] for c in training_containers_of(yaml.safe_load(other.stdout))} == {"registry.example.com/pt:2.6"}
    own = ready.cli("launch", "kubeflow", "--manifest", kind, "--dry-run", "--no-code-from-storage")
    assert yaml.safe_load(own.stdout) == original and own.stderr == ""
    refused = ready.cli("launch", "kubeflow", "--dry-run", "--no-code-from-storage", "--image", "x/y:1")
    assert refused.returncode == 1 and refused.stderr.startswith("error: --image runs a ready-made image"), (
        refused.stderr
    )


def training_containers_of(manifest: dict) -> list[dict]:
    if manifest["kind"] == "TrainJob":
        return [manifest["spec"]["trainer"]]
    return [r["template"]["spec"]["containers"][0] for r in replica_specs(manifest).values()]


@pytest.fixture(scope="module")
def placed(tmp_path_factory) -> Project:
    project = render_kubeflow(tmp_path_factory.mktemp("placed") / "p", **ANSWER_SETS["placement"])
    project.given = ANSWER_SETS["placement"]
    return project


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob", "mpijob"])
def test_dry_run_shows_the_placement(placed, kind):
    proc = placed.cli("launch", "kubeflow", "--manifest", kind, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    shown = yaml.safe_load(proc.stdout)
    assert shown == placed.manifest(kind) and validation_errors(shown) == []
    for text in ("rdma/hca_shared_devices_ib: 8", "nvidia.com/gpu.product", "NoExecute", "512Gi"):
        assert text in proc.stdout, (kind, text)
    if kind != "trainjob":
        assert "schedulerName: volcano" in proc.stdout and "minAvailable" in proc.stdout
    else:
        assert "scheduling.volcano.sh/queue-name: training" in proc.stdout


def test_bad_job_name_is_refused_before_any_cluster_call(solo):
    for name in ("Run_2", "2run", "r" * 60):
        proc = solo.cli("launch", "kubeflow", "--dry-run", "--name", name)
        assert proc.returncode == 1 and proc.stderr.startswith("error: job name") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("action", ["submit", "status", "logs", "cancel"])
def test_without_a_cluster_every_action_is_a_clear_error(solo, tmp_path, action):
    empty = tmp_path / "empty-kubeconfig"
    empty.write_text("")
    proc = solo.cli("launch", "kubeflow", "--action", action, env={"KUBECONFIG": str(empty)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: no Kubernetes cluster configured") and "Traceback" not in proc.stderr
    assert "KUBECONFIG" in proc.stderr and "--dry-run" in proc.stderr
    # A kubeconfig whose API server does not answer: a real connection is refused.
    unreachable = tmp_path / "unreachable-kubeconfig"
    unreachable.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
            }
        )
    )
    proc = solo.cli("launch", "kubeflow", "--action", action, "--kubeconfig", unreachable)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: cannot reach the Kubernetes API server at https://127.0.0.1:")
    assert "Connection refused" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_missing_kubernetes_package_names_the_install(solo):
    # A None entry in sys.modules makes `import kubernetes` fail as if it were not installed.
    code = (
        f"import sys; sys.modules['kubernetes'] = None; from {solo.slug}.cli import main; "
        "sys.exit(main(['launch', 'kubeflow']))"
    )
    proc = run([sys.executable, "-c", code], cwd=solo.path, env={"PYTHONPATH": str(solo.path / "src")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: launch kubeflow needs the kubernetes package, which is not installed here")
    assert "`pip install -e '.[kubeflow]'`" in proc.stderr and "kubectl apply -f -" in proc.stderr, proc.stderr


def test_generated_project_own_kubeflow_tests_pass(solo):
    # Its platform folder's tests: the manifests, its damaged launch files, the pods' variables read
    # (and a real two-node job started from them), the variables' bad values.
    log = run_project_suite(solo.path, *part_tests(), name="kubeflow-project", timeout=900)
    assert "test_a_damaged_launch_file_is_one_line_from_its_dry_run" in log and " SKIPPED" not in log
    assert "test_kubeflow_pytorchjob_worker_starts_first PASSED" in log and "[kubeflow master] PASSED" in log


# --- MPIJob (MPI Operator v2, DeepSpeed's own launcher) --------------------------------------------

MPI_LAUNCHER_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpi_specs(job: dict) -> dict:
    return job["spec"]["mpiReplicaSpecs"]


def mpi_container(job: dict, role: str) -> dict:
    (container,) = mpi_specs(job)[role]["template"]["spec"]["containers"]
    return container


@pytest.fixture(scope="module")
def ds_solo(tmp_path_factory) -> Project:
    return render_kubeflow(
        tmp_path_factory.mktemp("ds-solo") / "p", project_name="KF DS", nodes=2, gpus_per_node=2, strategy="deepspeed"
    )


def test_mpijob_exactly_for_deepspeed_projects(project):
    path = project.path / "launch" / "kubeflow" / "mpijob.yaml"
    assert path.is_file() == (project.answers["strategy"] == "deepspeed")
    if path.is_file():
        assert "mpijob.yaml" in (project.path / "launch" / "kubeflow" / "README.md").read_text()


def test_mpijob_passes_its_crd_schema_and_core_pods(project):
    if project.answers["strategy"] != "deepspeed":
        return  # no MPIJob here (test_mpijob_exactly_for_deepspeed_projects)
    job = project.manifest("mpijob")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert validation_errors(job) == []
    for role, spec in mpi_specs(job).items():
        assert core_errors(pod_template(f"{project.slug}-{role.lower()}", spec["template"])) == [], role
    # Names the operator derives (pods, their hostnames, the workers' Service) are RFC 1035 labels.
    name, nodes = job["metadata"]["name"], project.answers["nodes"]
    for value in [name, f"{name}-launcher", f"{name}-worker", *(f"{name}-worker-{i}" for i in range(nodes))]:
        assert DNS1035.fullmatch(value) and len(value) <= 63, value


def test_mpijob_says_what_the_answers_say(project):
    if project.answers["strategy"] != "deepspeed":
        return
    a, job = project.answers, project.manifest("mpijob")
    assert job["metadata"] == {
        "name": project.slug,
        "namespace": a["k8s_namespace"],
        "labels": {"app.kubernetes.io/name": project.slug},
    }
    spec = job["spec"]
    assert spec["slotsPerWorker"] == a["gpus_per_node"] and spec["mpiImplementation"] == "OpenMPI"
    assert spec["sshAuthMountPath"] == "/root/.ssh" and spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    run_policy = {k: v for k, v in spec["runPolicy"].items() if k != "schedulingPolicy"}  # the placement test's
    assert run_policy == {"backoffLimit": 3, "cleanPodPolicy": "Running"}
    assert set(mpi_specs(job)) == {"Launcher", "Worker"}
    for role in ("Launcher", "Worker"):  # the Launcher is a batch Job: OnFailure restarts count to backoffLimit
        assert mpi_specs(job)[role]["restartPolicy"] == "OnFailure"
        assert mpi_specs(job)[role]["template"]["spec"]["terminationGracePeriodSeconds"] == GRACE_SECONDS
    assert mpi_specs(job)["Launcher"]["replicas"] == 1 and mpi_specs(job)["Worker"]["replicas"] == a["nodes"]

    launcher, worker = mpi_container(job, "Launcher"), mpi_container(job, "Worker")
    assert launcher["image"] == worker["image"] == a["image"]
    # The Launcher: no GPU, DeepSpeed's runner with the operator's hostfile and the openmpi launcher,
    # every rank running this package's node launcher; the NCCL settings reach the ranks through -x.
    assert "nvidia.com/gpu" not in str(launcher["resources"])
    command = launcher["command"]
    assert command[:2] == ["bash", "-c"] and command[3:] == [f"{project.slug}-launcher"]
    script = command[2]
    assert "HOSTFILE=${MPI_HOSTFILE:-/etc/mpi/hostfile}" in script
    assert 'python3 -m deepspeed.launcher.runner --hostfile "$HOSTFILE" --launcher openmpi' in script
    assert "--force_multi --no_ssh_check" in script and f'--module {project.slug} node "$@"' in script
    env = {e["name"]: e["value"] for e in launcher["env"] if "valueFrom" not in e}
    nccl = project.nccl_env()
    assert env == {**nccl, "TRAIN_DEBUG": "0", **MPI_LAUNCHER_ENV}
    assert [e["name"] for e in launcher["env"] if "valueFrom" in e] == project.tracker_env()
    exported = re.search(r'exports="([^"]*)"', script).group(1).split()
    assert exported[::2] == ["-x"] * (len(exported) // 2)
    assert set(exported[1::2]) == {"MASTER_ADDR", "MASTER_PORT", "TRAIN_DEBUG", "PATH", *nccl}
    # The trackers' variables reach the ranks (through sshd: only by -x), those the secret sets.
    for name in project.tracker_env():
        assert f'if [ -n "${{{name}:-}}" ]; then exports="$exports -x {name}"; fi' in script
    # The Workers: sshd (start-sshd of images/cuda-pytorch), ready when port 22 answers; the GPUs,
    # RDMA, /dev/shm and the shared volume as in the PyTorchJob; no env, which sshd would not pass on.
    assert worker["command"][:2] == ["bash", "-c"] and worker["command"][2].endswith("exec start-sshd")
    assert worker["readinessProbe"]["tcpSocket"] == {"port": 22}
    assert "env" not in worker
    pod = mpi_specs(job)["Worker"]["template"]["spec"]
    plain = [{"name": k, "value": v} for k, v in {**nccl, "TRAIN_DEBUG": "0"}.items()]
    worker_with_env = {**worker, "env": plain + [e for e in launcher["env"] if "valueFrom" in e]}
    assert_pod_content(project, {**pod, "containers": [worker_with_env]}, worker_with_env)
    launcher_pod = mpi_specs(job)["Launcher"]["template"]["spec"]
    assert launcher_pod.get("imagePullSecrets") == pod.get("imagePullSecrets")


def test_mpijob_validators_reject_what_a_strict_api_server_rejects(ds_solo):
    job = ds_solo.manifest("mpijob")
    cases = {
        "spec: Additional properties are not allowed ('slotPerWorker'": lambda m: m["spec"].update(
            slotPerWorker=m["spec"].pop("slotsPerWorker")
        ),
        "spec.slotsPerWorker: '2' is not of type 'integer'": lambda m: m["spec"].update(slotsPerWorker="2"),
        "spec.mpiImplementation: 'openmpi' is not one of": lambda m: m["spec"].update(mpiImplementation="openmpi"),
        "spec.runPolicy: Additional properties are not allowed ('cleanPodPolicies'": lambda m: m["spec"][
            "runPolicy"
        ].update(cleanPodPolicies="All"),
        "containers.0: Additional properties are not allowed ('commands'": lambda m: mpi_container(
            m, "Launcher"
        ).update(commands=[]),
    }
    for expected, breaks in cases.items():
        broken = copy.deepcopy(job)
        breaks(broken)
        errors = validation_errors(broken)
        assert any(expected in e for e in errors), (expected, errors)
    template = copy.deepcopy(mpi_specs(job)["Worker"]["template"])
    template["spec"]["containers"][0]["readinessProbe"]["tcpSocket"]["port"] = 1.5
    assert core_errors(pod_template("x", template))


def test_mpijob_dry_run_and_overrides(ds_solo):
    proc = ds_solo.cli("launch", "kubeflow", "--kind", "mpijob", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == ds_solo.manifest("mpijob")
    proc = ds_solo.cli(
        "launch", "kubeflow", "--manifest", "mpijob", "--dry-run", "--name", "run-2", "schedule.max_steps=5"
    )
    changed, original = yaml.safe_load(proc.stdout), ds_solo.manifest("mpijob")
    assert validation_errors(changed) == [] and changed["metadata"]["name"] == "run-2"
    # Overrides reach the Launcher's command (the script's "$@"); the Workers only run sshd.
    assert mpi_container(changed, "Launcher")["command"] == mpi_container(original, "Launcher")["command"] + [
        "schedule.max_steps=5"
    ]
    assert mpi_container(changed, "Worker") == mpi_container(original, "Worker")
    proc = ds_solo.cli("launch", "kubeflow", "--manifest", "mpijob", "--dry-run", "--name", "r" * 55)
    assert proc.returncode == 1 and f"'{'r' * 55}-launcher'" in proc.stderr  # the longest derived name


def test_mpijob_missing_in_a_ddp_project_names_the_fix(solo):
    proc = solo.cli("launch", "kubeflow", "--manifest", "mpijob", "--dry-run")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "copier update --data strategy=deepspeed" in proc.stderr


def test_mpijob_without_a_cluster_is_a_clear_error(ds_solo, tmp_path):
    empty = tmp_path / "empty-kubeconfig"
    empty.write_text("")
    proc = ds_solo.cli("launch", "kubeflow", "--manifest", "mpijob", env={"KUBECONFIG": str(empty)})
    assert proc.returncode == 1 and proc.stderr.startswith("error: no Kubernetes cluster configured")


# --- Faults: grace period and restarts --------------------------------------------------------------


def test_pods_outlive_the_preemption_save(project):
    """Every pod of every manifest waits longer between SIGTERM and SIGKILL than the ranks may take to
    finish the step and save (cluster.stop_grace_seconds of the rendered config/train.yaml)."""
    stop = yaml.safe_load((project.path / "config" / "train.yaml").read_text())["cluster"]["stop_grace_seconds"]
    kinds = ["pytorchjob", "trainjob"] + (["mpijob"] if project.answers["strategy"] == "deepspeed" else [])
    for kind in kinds:
        job = project.manifest(kind)
        pods = (
            [
                r["template"]["spec"]
                for r in (job["spec"].get("pytorchReplicaSpecs") or job["spec"].get("mpiReplicaSpecs")).values()
            ]
            if kind != "trainjob"
            else [runtime_pod(job)["spec"]]
        )
        assert pods and all(pod["terminationGracePeriodSeconds"] > stop for pod in pods), kind
    readme = (project.path / "launch" / "kubeflow" / "README.md").read_text()
    assert f"resumes from `{project.answers['output_dir']}/checkpoints/latest`" in readme


def test_submit_refuses_a_grace_period_shorter_than_the_save(solo):
    proc = solo.cli("launch", "kubeflow", "--dry-run", "cluster.stop_grace_seconds=200")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: PyTorchJob Master pods get SIGKILL 180 s after SIGTERM")
    assert "cluster.stop_grace_seconds = 200 s" in proc.stderr
    proc = solo.cli("launch", "kubeflow", "--manifest", "trainjob", "--dry-run", "cluster.stop_grace_seconds=179")
    assert proc.returncode == 0, proc.stderr  # 180 > 179: fine
