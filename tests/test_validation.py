"""Bad answers are refused by copier before anything is written, with one line naming the field.

    pytest tests/test_validation.py -q

Each row of BAD_ANSWERS is a real `copier copy --defaults --data ...` into a folder that does not
exist: copier must exit non-zero and print one line, no traceback, naming the question
("Validation error for question '<field>': ...") with the reason and the fix, and leave no
destination behind. UNKNOWN_ANSWERS does the same for names no question has; UPDATES for `copier
update --data` in a generated project, which must stay byte for byte as it was. Cross-field rows go
through hooks/copier_extension.py, which runs the generated package's rules.py and fit.py
(hooks/answers.py); the last tests check that module directly and that a refused copy into an
existing folder leaves the user's file alone.
"""

from __future__ import annotations

import hashlib
import importlib.util
import keyword
import re
import sys
from pathlib import Path

import pytest
from conftest import BIN, TEMPLATE, copier_copy, run

SLUG40 = "a" * 40
GPT3 = {"model": "gpt3", "gpt3_layout": "custom"}

# (answers, field copier names, a word the reason must contain)
BAD_ANSWERS = [
    # single fields: names, paths, ranges, choices
    ({"project_slug": "My-Run"}, "project_slug", "lowercase"),
    ({"project_slug": "1run"}, "project_slug", "starting with a letter"),
    ({"project_slug": "my_run"}, "project_slug", "lowercase"),
    ({"project_slug": "a" * 41}, "project_slug", "40"),
    ({"project_name": "   "}, "project_name", "empty"),
    ({"nodes": 0}, "nodes", "at least 1"),
    ({"gpus_per_node": 0}, "gpus_per_node", "at least 1"),
    ({"data_dir": "relative/data"}, "data_dir", "absolute"),
    ({"output_dir": "runs"}, "output_dir", "absolute"),
    ({"shared_mount": "relative"}, "shared_mount", "absolute"),
    ({"shared_mount": "/mnt/shared/"}, "shared_mount", "trailing slash"),
    ({"shared_mount": "/mnt/$SHARED"}, "shared_mount", "read specially"),
    ({"data_dir": "/mnt/shared/v/data#1"}, "data_dir", "read specially"),
    ({"image": "Registry/Name:tag with space"}, "image", "image reference"),
    ({"base_image": "nvcr.io/nvidia/pytorch:bad tag"}, "base_image", "image reference"),
    ({"code_from": "storage", "ready_image": "nvcr.io/nvidia/pytorch:bad tag"}, "ready_image", "image reference"),
    ({"nccl_socket_ifname": "eth0; reboot"}, "nccl_socket_ifname", "interface"),
    ({"nccl_ib_hca": "mlx5 0"}, "nccl_ib_hca", "device names"),
    ({"fabric": "roce", "nccl_ib_gid_index": 300}, "nccl_ib_gid_index", "255"),
    ({"fabric": "roce", "nccl_ib_tc": -1}, "nccl_ib_tc", "255"),
    ({"fabric": "myrinet"}, "fabric", "not one of infiniband, roce, tcp"),
    ({"model": "t5"}, "model", "not one of bert, gpt, gpt3"),
    ({"model": "gpt", "model_size": "125M"}, "model_size", "gpt size"),
    ({"model": "bert", "model_size": "d12"}, "model_size", "bert size"),
    ({"model": "gpt3", "model_size": "1B"}, "model_size", "gpt3 size"),
    ({"model": "bert", "pretrained_dir": "models/bert"}, "pretrained_dir", "absolute"),
    ({"model": "gpt3", "gpt3_layout": "1b-2pp"}, "gpt3_layout", "not one of 125m-1gpu"),
    ({"strategy": "deepspeed", "zero_stage": 4}, "zero_stage", "not one of 0, 1, 2, 3"),
    ({"strategy": "megatron"}, "strategy", "not one of ddp, fsdp, deepspeed"),
    ({"gpu_type": "tpu-v5"}, "gpu_type", "not one of h100-80gb"),
    ({"platforms": "[]"}, "platforms", "at least one"),
    ({"platforms": "[devmachine, aws]"}, "platforms", "'aws' is not one of devmachine"),
    ({"platforms": "devmachine"}, "platforms", "not a list; give one such as platforms=["),
    # project_slug: a name the package would shadow (stdlib, dependencies, what it imports), a keyword
    ({"project_slug": "torch"}, "project_slug", "module torch the project imports"),
    ({"project_slug": "deepspeed"}, "project_slug", "e.g. 'deepspeedtrain'"),
    ({"project_slug": "json"}, "project_slug", "could not start"),
    ({"project_slug": "site"}, "project_slug", "standard-library module site"),
    ({"project_slug": "pyyaml"}, "project_slug", "pip install -e ."),
    ({"project_slug": "import"}, "project_slug", "Python keyword"),
    ({"project_slug": "match"}, "project_slug", "soft keyword"),
    ({"project_name": "Numpy"}, "project_slug", "project_slug 'numpy'"),  # the slug derived from the name
    # paths judged normalised: the root folder, outside the shared mount, data and outputs apart
    ({"shared_mount": "/mnt/.."}, "shared_mount", "root folder (that is /)"),
    ({"data_dir": "/"}, "data_dir", "root folder"),
    ({"output_dir": "/"}, "output_dir", "root folder"),
    (
        {"platforms": "[kubeflow]", "data_dir": "/mnt/shared/../etc/d"},
        "data_dir",
        "(that is /mnt/etc/d) must lie under",
    ),
    ({"platforms": "[kubeflow]", "output_dir": "/mnt/shared/v/../../r"}, "output_dir", "shared_mount /mnt/shared"),
    ({"output_dir": "/mnt/shared/v/data"}, "output_dir", "is data_dir itself"),
    ({"output_dir": "/mnt/shared/v/data/./"}, "output_dir", "is data_dir itself"),
    ({"output_dir": "/mnt/shared/v/data/runs"}, "output_dir", "lies inside data_dir '/mnt/shared/v/data'"),
    ({"output_dir": "/mnt/shared/v"}, "output_dir", "holds data_dir '/mnt/shared/v/data': keep them apart"),
    # numbers: whole, and within the question's bound
    ({"nodes": "two"}, "nodes", "not a whole number; give one such as nodes=1"),
    ({"nodes": "1.5"}, "nodes", "not a whole number"),
    ({"nodes": -2}, "nodes", "at least 1"),
    ({"gpus_per_node": "eight"}, "gpus_per_node", "gpus_per_node=8"),
    # the batch: a global batch the data-parallel GPUs cannot split names the nearest values that can
    ({"scaling": "sideways"}, "scaling", "not one of strong, weak"),
    ({"global_batch_size": 0}, "global_batch_size", "batch.global_batch_size=0 must be at least 1"),
    (
        {"gpus_per_node": 3, "global_batch_size": 256},
        "global_batch_size",
        "(16) x data-parallel size (3) = 48; set it to 240 or 288, or run on 2 or 4 data-parallel ranks",
    ),
    (
        {"scaling": "weak", "batch_per_gpu": 0},
        "batch_per_gpu",
        "the global batch is batch_per_gpu x the data-parallel GPUs",
    ),
    ({"gpus_per_node": -1}, "gpus_per_node", "at least 1"),
    ({**GPT3, "tensor_parallel": "1.5"}, "tensor_parallel", "not a whole number"),
    ({**GPT3, "tensor_parallel": 0}, "tensor_parallel", "parallel.tensor=0 must be at least 1"),
    ({**GPT3, "pipeline_parallel": "2x"}, "pipeline_parallel", "not a whole number"),
    ({**GPT3, "pipeline_parallel": 0}, "pipeline_parallel", "at least 1"),
    ({"strategy": "deepspeed", "zero_stage": "one"}, "zero_stage", "not a whole number"),
    ({"fabric": "roce", "nccl_ib_gid_index": "3a"}, "nccl_ib_gid_index", "not a whole number"),
    ({"fabric": "roce", "nccl_ib_tc": "1e2"}, "nccl_ib_tc", "not a whole number"),
    ({"platforms": "[slurm]", "slurm_cpus_per_gpu": "8.0"}, "slurm_cpus_per_gpu", "not a whole number"),
    (
        {"platforms": "[tione]", "tione_resource_group": "trsg-1", "tione_cpu_per_node": "many"},
        "tione_cpu_per_node",
        "not a whole number",
    ),
    # tensor / pipeline degrees against the world size and the model's shape
    ({**GPT3, "gpus_per_node": 4, "tensor_parallel": 8}, "tensor_parallel", "exceeds cluster.gpus_per_node=4"),
    ({**GPT3, "gpus_per_node": 4, "pipeline_parallel": 3}, "pipeline_parallel", "divide"),
    (
        {**GPT3, "nodes": 1, "gpus_per_node": 6, "tensor_parallel": 2, "pipeline_parallel": 4},
        "pipeline_parallel",
        "divide",
    ),
    ({**GPT3, "model_size": "125M", "tensor_parallel": 8}, "tensor_parallel", "attention heads"),
    ({**GPT3, "model_size": "350M", "gpus_per_node": 3, "tensor_parallel": 3}, "tensor_parallel", "attention heads"),
    ({**GPT3, "model_size": "1.3B", "gpus_per_node": 5, "pipeline_parallel": 5}, "pipeline_parallel", "layers"),
    ({**GPT3, "model_size": "2.7B", "gpus_per_node": 3, "pipeline_parallel": 3}, "pipeline_parallel", "layers"),
    # ZeRO and strategy against the layout
    (
        {"model": "gpt3", "gpt3_layout": "13b-4dp-4pp", "zero_stage": 2},
        "zero_stage",
        "use deepspeed.zero_stage=1 (or 0)",
    ),
    ({**GPT3, "pipeline_parallel": 2, "zero_stage": 3}, "zero_stage", "pipeline engine"),
    ({"model": "gpt3", "gpt3_layout": "13b-4dp-4pp", "strategy": "ddp"}, "strategy", "run.strategy=deepspeed"),
    ({**GPT3, "model_size": "tiny", "tensor_parallel": 2, "strategy": "ddp"}, "strategy", "run.strategy=deepspeed"),
    # a V100 trains in fp16 (no bf16), which DeepSpeed does not loss-scale at ZeRO 0
    ({"strategy": "deepspeed", "zero_stage": 0, "gpu_type": "v100-16gb"}, "zero_stage", "deepspeed.zero_stage=1"),
    # memory fit (plan): given and default GPU types
    (
        {**GPT3, "model_size": "13B", "nodes": 1, "gpus_per_node": 8, "gpu_type": "v100-16gb"},
        "gpu_type",
        "does not fit",
    ),
    ({**GPT3, "model_size": "13B", "nodes": 1, "gpus_per_node": 8}, "gpu_type", "does not fit"),
    ({**GPT3, "model_size": "175B", "gpu_type": "a100-80gb"}, "gpu_type", "does not fit"),
    ({"model": "gpt", "model_size": "d32", "gpus_per_node": 1, "gpu_type": "v100-16gb"}, "gpu_type", "does not fit"),
    # Kubernetes names: the job is the slug, its pods add the operators' suffixes (<= 63)
    ({"platforms": "[kubeflow]", "project_slug": SLUG40, "nodes": 10**16}, "nodes", "DNS-1123"),
    ({"platforms": "[kubeflow]", "k8s_namespace": "ML_Team"}, "k8s_namespace", "DNS-1123"),
    ({"platforms": "[kubeflow]", "k8s_namespace": "n" * 64}, "k8s_namespace", "63"),
    ({"platforms": "[kubeflow]", "pvc_name": "Shared Data"}, "pvc_name", "Kubernetes name"),
    ({"platforms": "[kubeflow]", "pvc_name": ""}, "pvc_name", "Kubernetes name"),
    ({"platforms": "[kubeflow]", "rdma_resource": "hca"}, "rdma_resource", "domain/name"),
    ({"platforms": "[kubeflow]", "image_pull_secret": "Bad_Secret"}, "image_pull_secret", "Secret"),
    # Kubernetes placement: counts, label and taint syntax, quantities, scheduler names
    ({"platforms": "[kubeflow]", "rdma_per_pod": 0}, "rdma_per_pod", "between 1 and 64"),
    ({"platforms": "[kubeflow]", "k8s_node_labels": "gpu=A800 SXM"}, "k8s_node_labels", "label value"),
    ({"platforms": "[kubeflow]", "k8s_node_labels": "Bad_Prefix/gpu=a"}, "k8s_node_labels", "DNS subdomain"),
    ({"platforms": "[kubeflow]", "k8s_tolerations": "nvidia.com/gpu:NoRun"}, "k8s_tolerations", "NoSchedule"),
    ({"platforms": "[kubeflow]", "k8s_tolerations": "=x:NoSchedule"}, "k8s_tolerations", "empty key"),
    ({"platforms": "[kubeflow]", "k8s_cpu_request": "64 cores"}, "k8s_cpu_request", "cpu quantity"),
    ({"platforms": "[kubeflow]", "k8s_cpu_request": "64", "k8s_cpu_limit": "32"}, "k8s_cpu_limit", "below the request"),
    ({"platforms": "[kubeflow]", "k8s_memory_request": "16GB"}, "k8s_memory_request", "512Gi"),
    ({"platforms": "[kubeflow]", "k8s_memory_request": "512"}, "k8s_memory_request", "512Gi"),
    ({"platforms": "[kubeflow]", "k8s_memory_limit": "9" * 30}, "k8s_memory_limit", "more than one machine has"),
    ({"platforms": "[kubeflow]", "k8s_cpu_request": "1e6"}, "k8s_cpu_request", "more than one machine has"),
    ({"platforms": "[kubeflow]", "k8s_cpu_limit": "2000"}, "k8s_cpu_limit", "1024 cores"),
    (
        {"platforms": "[kubeflow]", "k8s_memory_request": "64Gi", "k8s_memory_limit": "60000Mi"},
        "k8s_memory_limit",
        "below the request",
    ),
    ({"platforms": "[kubeflow]", "k8s_gang_scheduler": "yunikorn"}, "k8s_gang_scheduler", "not one of none, volcano"),
    (
        {"platforms": "[kubeflow]", "k8s_gang_scheduler": "volcano", "k8s_scheduler_name": "Volcano"},
        "k8s_scheduler_name",
        "scheduler name",
    ),
    ({"platforms": "[kubeflow]", "k8s_gang_scheduler": "volcano", "k8s_queue": "GPU queue"}, "k8s_queue", "queue"),
    ({"platforms": "[kubeflow]", "k8s_priority_class": "High"}, "k8s_priority_class", "PriorityClass"),
    # what each platform needs
    ({"platforms": "[kubeflow]", "data_dir": "/data/run"}, "data_dir", "shared_mount"),
    ({"platforms": "[kubeflow]", "output_dir": "/outputs"}, "output_dir", "shared_mount"),
    ({"platforms": "[tione]", "tione_mode": "horovod"}, "tione_mode", ""),
    ({"platforms": "[tione]", "tione_region": "Guangzhou"}, "tione_region", "region"),
    ({"platforms": "[tione]", "tione_project_id": "my project"}, "tione_project_id", "letters"),
    ({"platforms": "[tione]", "tione_resource_group": "trsg/1"}, "tione_resource_group", "letters"),
    ({"platforms": "[tione]", "tione_instance_type": "TI GN7"}, "tione_instance_type", "letters"),
    (
        {"platforms": "[tione]", "tione_resource_group": "trsg-1", "tione_gpu_type": "H800 SXM"},
        "tione_gpu_type",
        "letters",
    ),
    (
        {"platforms": "[tione]", "tione_resource_group": "trsg-1", "tione_cpu_per_node": 0},
        "tione_cpu_per_node",
        "at least 1",
    ),
    (
        {"platforms": "[tione]", "tione_resource_group": "trsg-1", "tione_memory_gb_per_node": 0},
        "tione_memory_gb_per_node",
        "at least 1",
    ),
    ({"platforms": "[tione]", "tione_storage_id": "cfs 1"}, "tione_storage_id", "letters"),
    ({"platforms": "[tione]", "tione_storage_path": "data"}, "tione_storage_path", "absolute"),
    ({"platforms": "[tione]", "tione_vpc_id": "my-vpc"}, "tione_vpc_id", "vpc-"),
    ({"platforms": "[tione]", "tione_vpc_id": "vpc-a1"}, "tione_subnet_id", "subnet-"),
    ({"platforms": "[tione]", "tione_cls_logset_id": "logs#1"}, "tione_cls_logset_id", "letters"),
    ({"platforms": "[tione]", "tione_cls_logset_id": "ls-1"}, "tione_cls_topic_id", "required"),
    ({"platforms": "[slurm]", "slurm_time": "one day"}, "slurm_time", "HH:MM:SS"),
    ({"platforms": "[slurm]", "slurm_time": "99:99:99"}, "slurm_time", "below 60"),
    ({"platforms": "[slurm]", "slurm_time": "24:00:00\n"}, "slurm_time", "HH:MM:SS"),
    ({"platforms": "[slurm]", "slurm_cpus_per_gpu": 100000}, "slurm_cpus_per_gpu", "at most 256"),
    ({"nodes": 100000}, "nodes", "at most 4096"),
    ({"gpus_per_node": 1000}, "gpus_per_node", "at most 16"),
    ({"nodes": "1" + "0" * 400}, "nodes", "at most 4096"),
    (
        {"platforms": "[tione]", "tione_resource_group": "trsg-1", "tione_memory_gb_per_node": 10**9},
        "tione_memory_gb_per_node",
        "at most 16384",
    ),
    ({"platforms": "[slurm]", "slurm_partition": "gpu;rm -rf /"}, "slurm_partition", "letters"),
    ({"platforms": "[slurm]", "slurm_account": "team a"}, "slurm_account", "letters"),
    ({"platforms": "[slurm]", "slurm_modules": "cuda; reboot"}, "slurm_modules", "module names"),
    ({"platforms": "[slurm]", "slurm_cpus_per_gpu": 0}, "slurm_cpus_per_gpu", "at least 1"),
    ({"platforms": "[slurm]", "slurm_gpu_request": "gpus"}, "slurm_gpu_request", "not one of gpus-per-node, gres"),
    ({"platforms": "[slurm]", "slurm_gpu_type": "gpu:v100:4"}, "slurm_gpu_type", "the type alone, e.g. v100"),
]


# Names that are no question (copier and cookiecutter would drop them silently) and derived ones
# (an answer would replace the derivation): (answers, the one line printed)
UNKNOWN_ANSWERS = [
    ({"node": 4}, "unknown answer 'node': did you mean 'nodes'?"),
    ({"gpus-per-node": 4}, "unknown answer 'gpus-per-node': did you mean 'gpus_per_node'?"),
    ({"nodes": 2, "Model": "bert"}, "unknown answer 'Model': did you mean 'model'?"),
    ({"foo": "bar"}, "unknown answer 'foo': no question has that name (README.md lists them)"),
    ({"answers_check": "ok"}, "answer 'answers_check' is computed from the other answers, not asked; leave it out"),
]

# What copier prints besides the refusal: the template's uncommitted changes, the version it renders.
COPIER_NOISE = re.compile(r"DirtyLocalWarning|^\s+warn\($|^(Copying from|Keeping|Updating to) template version")


def refusal_line(result) -> str:
    """The one line a refused copier run prints; fails on a traceback, a zero exit or more lines."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-2000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if line.strip() and not COPIER_NOISE.search(line)]
    assert len(lines) == 1, output[-2000:]
    return lines[0]


VALID = {"project_name": "Valid Name", "data_dir": "/mnt/shared/v/data", "output_dir": "/mnt/shared/v/runs"}


def _id(row) -> str:
    answers, field, _ = row
    return f"{field}:" + ",".join(f"{k}={str(v)[:12]}" for k, v in answers.items())


@pytest.mark.parametrize("answers, field, reason", BAD_ANSWERS, ids=[_id(r) for r in BAD_ANSWERS])
def test_bad_answers_are_refused_before_writing(tmp_path, answers, field, reason):
    dst = tmp_path / "project"
    result = copier_copy(dst, {**VALID, **answers})
    line = refusal_line(result)
    validation = re.fullmatch(rf"Validation error for question '{field}': (.+)", line)
    assert validation, line
    message = validation.group(1).strip()  # the answer, why and what to do
    assert len(message) > 20 and field in message and reason in message, message
    assert not dst.exists(), f"copier left {sorted(p.name for p in dst.iterdir())}"


@pytest.mark.parametrize("answers, expected", UNKNOWN_ANSWERS, ids=[next(iter(a)) for a, _ in UNKNOWN_ANSWERS])
def test_unknown_answer_names_are_refused_with_the_closest_question(tmp_path, answers, expected):
    dst = tmp_path / "project"
    assert refusal_line(copier_copy(dst, {**VALID, **answers})) == expected
    assert not dst.exists()


# --data-file answers are YAML: copier would truncate 1.5 to 1, take true as 1 and fail on null
DATA_FILES = [
    (
        "nodes: 1.5\n",
        "Validation error for question 'nodes': nodes '1.5' is not a whole number; give one such as nodes=1",
    ),
    (
        "nodes: true\n",
        "Validation error for question 'nodes': nodes 'True' is not a whole number; give one such as nodes=1",
    ),
    (
        "project_slug:\n",
        "Validation error for question 'project_slug': project_slug has no value; give one or leave project_slug out for its default",
    ),
    (
        "platforms: [devmachine, aws]\n",
        "Validation error for question 'platforms': platforms item 'aws' is not one of devmachine, kubeflow, slurm, tione; e.g. platforms=[devmachine, kubeflow]",
    ),
    ("nodes: 2\nnode: 4\n", "unknown answer 'node': did you mean 'nodes'?"),
]


@pytest.mark.parametrize(
    "text, expected", DATA_FILES, ids=[t.split(":")[0] + ":" + t.split(":")[1].strip()[:8] for t, _ in DATA_FILES]
)
def test_data_file_answers_are_refused_like_data(tmp_path, text, expected):
    (tmp_path / "answers.yml").write_text(text)
    dst = tmp_path / "project"
    assert refusal_line(copier_copy(dst, VALID, extra=["--data-file", str(tmp_path / "answers.yml")])) == expected
    assert not dst.exists()


# Interactive runs (no --defaults) with answers given by --data: a given answer that its question's
# validator refuses, judged on given answers only, is one line before the first question is asked.
INTERACTIVE = [
    ({"project_slug": "torch"}, "project_slug", "the name of the module torch"),
    ({"project_slug": "Bad-Slug"}, "project_slug", "1-40 lowercase letters and digits"),
    ({"project_name": " "}, "project_name", "must not be empty"),
    (
        {"project_slug": "x", "platforms": "[devmachine]", "shared_mount": "/mnt/shared", "data_dir": "/a/.."},
        "data_dir",
        "is the root folder (that is /)",
    ),
]


@pytest.mark.parametrize(
    "given, field, reason", INTERACTIVE, ids=[r[1] + "-" + str(i) for i, r in enumerate(INTERACTIVE)]
)
def test_interactive_copy_refuses_a_bad_given_answer_in_one_line(tmp_path, given, field, reason):
    dst = tmp_path / "project"
    cmd = [str(BIN / "copier"), "copy", "--trust", "--vcs-ref=HEAD", "--data", "project_name=X"]
    cmd += [arg for key, value in given.items() for arg in ("--data", f"{key}={value}")]
    line = refusal_line(run([*cmd, str(TEMPLATE), str(dst)]))
    assert line.startswith(f"Validation error for question '{field}': ") and reason in line, line
    assert not dst.exists()


# `copier update --data` in a generated, committed project: (answer given, the line printed)
UPDATES = [
    ("project_slug=json", "Validation error for question 'project_slug': project_slug 'json' is the name"),
    ("project_slug=class", "Validation error for question 'project_slug': project_slug 'class' is a Python keyword"),
    ("node=4", "unknown answer 'node': did you mean 'nodes'?"),
    ("nodes=two", "Validation error for question 'nodes': nodes 'two' is not a whole number"),
    ("nodes=0", "Validation error for question 'nodes': nodes=0: cluster.nodes=0 must be at least 1"),
    ("output_dir=/", "Validation error for question 'output_dir': output_dir '/' is the root folder"),
    # strong scaling keeps 256 sequences per step, which 3 nodes x 8 GPUs cannot split
    (
        "nodes=3",
        "Validation error for question 'global_batch_size': global_batch_size=256: batch.global_batch_size=256 is not "
        "a multiple of batch.micro_batch_size (16) x data-parallel size (24) = 384; set it to 384, or run on 8 or 16 "
        "data-parallel ranks",
    ),
]


def _tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file of the work tree (git's own index is refreshed by any `git status`)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


@pytest.fixture(scope="module")
def committed_project(tmp_path_factory) -> Path:
    from test_update import commit_all, git, snapshot_template

    root = tmp_path_factory.mktemp("update")
    (root / "template").mkdir()
    template = snapshot_template(root / "template")
    commit_all(template, "template", tag="v1.0.0")
    project = root / "project"
    data = {**VALID, "project_name": "Upd", "data_dir": f"{root}/data", "output_dir": f"{root}/runs"}
    result = copier_copy(project, data, src=f"git+file://{template}")
    assert result.returncode == 0, result.stdout + result.stderr
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "generated")
    return project


@pytest.mark.parametrize("given, expected", UPDATES, ids=[g for g, _ in UPDATES])
def test_update_with_a_bad_answer_is_refused_and_changes_nothing(committed_project, given, expected):
    def state():
        head = run(["git", "rev-parse", "HEAD"], cwd=committed_project).stdout
        return _tree_digest(committed_project), head, run(["git", "stash", "list"], cwd=committed_project).stdout

    before = state()
    result = run([str(BIN / "copier"), "update", "--trust", "--defaults", "--data", given], cwd=committed_project)
    assert refusal_line(result).startswith(expected), result.stderr[-2000:]
    assert state() == before
    assert run(["git", "status", "--porcelain"], cwd=committed_project).stdout == ""


@pytest.mark.quick
def test_table_covers_forty_sets_and_every_question_with_a_rule():
    assert len(BAD_ANSWERS) >= 40
    fields = {field for _, field, _ in BAD_ANSWERS}
    copier_yml = (TEMPLATE / "copier.yml").read_text()
    validated = set(re.findall(r"^([a-z][a-z0-9_]*):\n(?:  .*\n)*?  validator:", copier_yml, re.M))
    assert validated - fields == set(), f"questions with a validator but no bad answer: {validated - fields}"


def test_refused_copy_into_an_existing_folder_keeps_exactly_the_users_file(tmp_path):
    dst = tmp_path / "existing"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine\n")
    result = copier_copy(
        dst,
        {
            "project_name": "X",
            **GPT3,
            "model_size": "13B",
            "nodes": 1,
            "gpus_per_node": 8,
            "gpu_type": "v100-16gb",
            "data_dir": "/mnt/shared/x/data",
            "output_dir": "/mnt/shared/x/runs",
        },
    )
    assert result.returncode != 0
    assert "Validation error for question 'gpu_type'" in result.stderr, result.stderr[-2000:]
    assert sorted(p.name for p in dst.iterdir()) == ["notes.txt"]
    assert (dst / "notes.txt").read_text() == "mine\n"


def test_refused_copy_into_an_existing_empty_folder_leaves_it_empty(tmp_path):
    dst = tmp_path / "empty"
    dst.mkdir()
    result = copier_copy(dst, {"project_name": "X", "platforms": "[kubeflow]", "project_slug": SLUG40, "nodes": 10**16})
    assert result.returncode != 0 and "Validation error for question 'nodes'" in result.stderr
    assert list(dst.iterdir()) == []


# --- hooks/answers.py on its own: what cookiecutter's pre-generation hook calls --------------------


def _answers_module():
    spec = importlib.util.spec_from_file_location("answers_under_test", TEMPLATE / "hooks" / "answers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.quick
def test_answers_module_uses_the_generated_packages_rules_not_a_copy():
    answers = _answers_module()
    package = answers.package()
    src = TEMPLATE / "template" / "src" / "{{project_slug}}"
    for name, path in {"config": "settings", "rules": "planning", "fit": "planning", "family": "models"}.items():
        assert Path(package[name].__file__) == src / path / f"{name}.py"
    assert "def check_config" not in (TEMPLATE / "hooks" / "answers.py").read_text()
    # its train.yaml is the template's: the default answers give the file copier renders
    assert answers.problems({}) == []
    assert answers.problems({"model": "bert"}) == [] and answers.problems({"model": "gpt3"}) == []


def test_answers_module_reads_questions_order_and_defaults_from_copier_yml():
    """No question list or default is copied into hooks/: they come from copier.yml."""
    import yaml

    answers = _answers_module()
    spec = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    assert answers.question_order() == [k for k in spec if not k.startswith("_")]
    for name in ("hooks/answers.py", "hooks/copier_extension.py"):
        text = (TEMPLATE / name).read_text()
        assert "125m-1gpu" not in text and "h100-80gb" not in text and "/mnt/shared" not in text, name


# Answers whose defaults depend on others in every way copier.yml has: Jinja filters, the layout table,
# arithmetic, questions asked only for some platforms.
DEFAULT_SETS = {
    "defaults": {},
    "gpt3": {"model": "gpt3"},
    "bert": {"model": "bert"},
    "gpt3-13b-all-platforms": {
        "project_name": "Big 13B",
        "model": "gpt3",
        "gpt3_layout": "13b-4dp-4pp",
        "platforms": "[devmachine, kubeflow, tione, slurm]",
        "tione_resource_group": "trsg-1",
        "fabric": "roce",
    },
}


@pytest.mark.parametrize("name", DEFAULT_SETS)
def test_completed_answers_are_what_copier_records(tmp_path, name):
    """hooks/answers.py fills a missing answer with the value `copier copy --defaults` records for it."""
    import yaml

    given = DEFAULT_SETS[name]
    result = copier_copy(tmp_path / "p", given, extra=["--skip-tasks"])
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    recorded = yaml.safe_load((tmp_path / "p" / ".copier-answers.yml").read_text())
    recorded = {k: v for k, v in recorded.items() if not k.startswith("_")}
    completed = _answers_module().complete(given)
    assert {k: completed.get(k) for k in recorded} == recorded


@pytest.mark.quick
def test_answers_problems_are_one_line_each_naming_field_and_value():
    answers = _answers_module()
    found = answers.problems(
        {
            **GPT3,
            "model_size": "13B",
            "nodes": 1,
            "gpus_per_node": 8,
            "gpu_type": "v100-16gb",
            "platforms": ["kubeflow"],
            "pvc_name": "",
        }
    )
    assert found[0].startswith("pvc_name=: ") and "PersistentVolumeClaim" in found[0]
    assert found[1].startswith("gpu_type=v100-16gb: does not fit") and "smallest change" in found[1]
    assert all("\n" not in line for line in found)
    # a note, not an error: TI-ONE's HCC machines set their own NCCL variables
    assert answers.problems({"platforms": ["tione"]}) == []
    assert "NCCL" in answers.notes({"platforms": ["tione"]})[0]


# --- Why the validators come first: copier's cleanup after a failed post-copy task ------------------


def _template_without_early_checks(tmp_path: Path) -> Path:
    """A copy of this template whose only check is the post-copy task (check_project)."""
    import shutil

    src = tmp_path / "late-template"
    shutil.copytree(TEMPLATE / "template", src / "template", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(TEMPLATE / "hooks", src / "hooks", ignore=shutil.ignore_patterns("__pycache__"))
    text = (TEMPLATE / "copier.yml").read_text()
    text = re.sub(r"\{\{ answer_problems\([^)]*\) \}\}", "", text).replace("{{ refuse_bad_answers() }}", "ok")
    text = text.replace("{{ refuse_bad_given_answers() }}", "ok")
    (src / "copier.yml").write_text(text)
    return src


def test_post_copy_check_is_the_second_line_and_copier_cleans_only_new_folders(tmp_path):
    src = _template_without_early_checks(tmp_path)
    data = {
        "project_name": "Late",
        **GPT3,
        "model_size": "13B",
        "nodes": 1,
        "gpus_per_node": 8,
        "gpu_type": "v100-16gb",
        "data_dir": "/mnt/shared/l/data",
        "output_dir": "/mnt/shared/l/runs",
    }
    args = [str(BIN / "copier"), "copy", "--trust", "--defaults"] + [f"--data={k}={v}" for k, v in data.items()]
    # (a) a new destination: check_project refuses the layout, copier removes the folder it created
    new = tmp_path / "new"
    result = run(args + [str(src), str(new)])
    assert result.returncode != 0 and "does not fit" in result.stderr, result.stderr[-1500:]
    assert not new.exists()
    # (b) an existing folder: copier keeps everything it rendered there -- hence the validators above,
    # which refuse the same answers before a single file is written
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine\n")
    result = run(args + [str(src), str(existing)])
    assert result.returncode != 0 and "does not fit" in result.stderr
    assert (existing / "config" / "train.yaml").exists() and (existing / "notes.txt").read_text() == "mine\n"


# --- The validators copier shows while asking (interactive: refused inline, asked again) -----------


def _validator(field: str, answers: dict, defaults: bool = False) -> str:
    """Render copier.yml's validator of `field` as copier does, with the RulesExtension loaded."""
    import jinja2
    import yaml

    spec = importlib.util.spec_from_file_location(
        "copier_extension_under_test", TEMPLATE / "hooks" / "copier_extension.py"
    )
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    questions = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    env = jinja2.Environment(
        extensions=["jinja2_ansible_filters.AnsibleCoreFiltersExtension", extension.RulesExtension]
    )
    context = {
        "_copier_conf": {"defaults": defaults},
        "project_slug": "run",
        "platforms": ["devmachine"],
        **answers,
    }
    return env.from_string(questions[field]["validator"]).render(context).strip()


INTERACTIVE = [
    (
        "tensor_parallel",
        {**GPT3, "model_size": "125M", "nodes": 1, "gpus_per_node": 8, "tensor_parallel": 8},
        "attention heads",
    ),
    (
        "pipeline_parallel",
        {**GPT3, "model_size": "1.3B", "nodes": 1, "gpus_per_node": 5, "tensor_parallel": 1, "pipeline_parallel": 5},
        "layers",
    ),
    (
        "strategy",
        {"model": "gpt3", "gpt3_layout": "13b-4dp-4pp", "model_size": "13B", "strategy": "ddp"},
        "run.strategy=deepspeed",
    ),
    (
        "zero_stage",
        {**GPT3, "model_size": "125M", "strategy": "deepspeed", "zero_stage": 3, "pipeline_parallel": 2},
        "pipeline engine",
    ),
    ("nodes", {"platforms": ["kubeflow"], "project_slug": SLUG40, "nodes": 10**16}, "DNS-1123"),
    (
        "gpu_type",
        {
            **GPT3,
            "model_size": "13B",
            "strategy": "deepspeed",
            "zero_stage": 1,
            "nodes": 1,
            "gpus_per_node": 8,
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "gpu_type": "v100-16gb",
        },
        "does not fit",
    ),
]


@pytest.mark.quick
@pytest.mark.parametrize("field, answers, reason", INTERACTIVE, ids=[f for f, _, _ in INTERACTIVE])
def test_interactive_validator_refuses_at_the_question(field, answers, reason):
    message = _validator(field, answers)
    assert message.startswith(f"{field}=") and reason in message, message
    # with --defaults the validator stays silent and the hidden last question reports it instead
    assert _validator(field, answers, defaults=True) == ""


PATH_ANSWERS = [
    ("pretrained_dir", {"model": "bert"}),
    ("shared_mount", {}),
    ("data_dir", {"shared_mount": "/mnt"}),
    ("output_dir", {"shared_mount": "/mnt"}),
]


@pytest.mark.quick
@pytest.mark.parametrize("field, others", PATH_ANSWERS, ids=[f for f, _ in PATH_ANSWERS])
@pytest.mark.parametrize(
    "path", ["/mnt/a'b", '/mnt/a"b', "/mnt/$HOME", "/mnt/a`b`", "/mnt/50%", "/mnt/a#b", "/mnt/a\\b", "/mnt/a\x01b"]
)
def test_every_path_answer_refuses_characters_shells_read(field, others, path):
    message = _validator(field, {**others, field: path})
    shown = repr(path) if "\x01" in path else f"'{path}'"  # a control character is shown escaped
    assert message.startswith(f"{field} {shown} holds a character"), message


@pytest.mark.quick
@pytest.mark.parametrize(
    "field, example",
    [
        ("image", "registry.example.com/run:v1"),
        ("base_image", "nvcr.io/nvidia/pytorch:25.01-py3"),
        ("ready_image", "nvcr.io/nvidia/pytorch:25.01-py3"),
    ],
)
def test_every_image_answer_uses_the_one_reference_rule(field, example):
    for good in ("registry.example.com/run:latest", "localhost:5000/a/b", f"r.io/x@sha256:{'0' * 64}"):
        assert _validator(field, {field: good}) == "", good
    message = _validator(field, {field: "Registry/Name:tag with space"})
    assert (
        message == f"{field} 'Registry/Name:tag with space' is not a valid image reference; use "
        f"registry/name:tag, e.g. {example}."
    )


@pytest.mark.quick
def test_path_and_image_rules_are_written_once():
    copier_yml = (TEMPLATE / "copier.yml").read_text()
    assert "`$%#" not in copier_yml and "sha256" not in copier_yml  # the patterns live in copier_extension.py
    assert copier_yml.count("path_characters_problem(") == 4 and copier_yml.count("image_reference_problem(") == 3
    assert copier_yml.count("path_placement_problem(") == 3 and copier_yml.count("paths_apart_problem(") == 1


# (field, answers, the message): paths judged on their normalised form, while the user answers
PLACEMENTS = [
    ("shared_mount", {"shared_mount": "/srv/.."}, "shared_mount '/srv/..' is the root folder (that is /); give"),
    ("data_dir", {"shared_mount": "/mnt", "data_dir": "//"}, "data_dir '//' is the root folder (that is /); give"),
    (
        "data_dir",
        {"platforms": ["kubeflow"], "shared_mount": "/mnt/s", "data_dir": "/mnt/s/../etc"},
        "data_dir '/mnt/s/../etc' (that is /mnt/etc) must lie under shared_mount /mnt/s, where the pods mount "
        "the shared volume; e.g. /mnt/s/run/data.",
    ),
    (
        "output_dir",
        {"shared_mount": "/m", "data_dir": "/m/d", "output_dir": "/m/d/../d/r"},
        "output_dir '/m/d/../d/r' lies inside data_dir '/m/d': keep them apart so that cleaning one never "
        "deletes the other and token shards never mix with checkpoints; e.g. output_dir=/m/runs.",
    ),
    (
        "output_dir",
        {"shared_mount": "/m", "data_dir": "/m/runs", "output_dir": "/m"},
        "output_dir '/m' holds data_dir '/m/runs': keep them apart so that cleaning one never deletes the other "
        "and token shards never mix with checkpoints; e.g. output_dir=/m/outputs.",
    ),
]


@pytest.mark.parametrize("field, answers, message", PLACEMENTS, ids=[f"{f}:{a[f]}" for f, a, _ in PLACEMENTS])
def test_interactive_path_validators_judge_the_normalised_path(field, answers, message):
    assert _validator(field, answers).startswith(message)


def test_paths_apart_from_each_other_and_under_the_mount_pass():
    good = {"platforms": ["kubeflow"], "shared_mount": "/m", "data_dir": "/m/a/../data", "output_dir": "/m/data2"}
    for field in ("shared_mount", "data_dir", "output_dir"):
        assert _validator(field, good) == "", field


@pytest.mark.quick
def test_slug_refusals_are_derived_from_python_and_the_package_not_typed():
    """The reserved slugs come from the standard library of the running Python, the keywords, the
    modules the package and its tests import, and template/pyproject.toml.jinja's requirements."""
    answers = _answers_module()
    reserved = answers.reserved_slugs()
    slug = re.compile(r"[a-z][a-z0-9]{0,39}")
    assert {name for name in sys.stdlib_module_names if slug.fullmatch(name)} <= set(reserved)
    assert {name for name in keyword.kwlist + keyword.softkwlist if slug.fullmatch(name)} <= set(reserved)
    expected = {"torch", "numpy", "yaml", "deepspeed", "transformers", "tokenizers", "pytest", "pyarrow", "tensorboard"}
    assert expected | {"pyyaml", "setuptools", "kubernetes", "docker", "ray", "tencentcloud"} <= set(reserved)
    hooks = (TEMPLATE / "hooks" / "answers.py").read_text() + (TEMPLATE / "hooks" / "copier_extension.py").read_text()
    assert not [name for name in expected - {"yaml", "deepspeed"} if name in hooks]  # those two name other things
    assert _validator("project_slug", {"project_slug": "torch"}).endswith("choose another, e.g. 'torchtrain'.")
    assert _validator("project_slug", {"project_slug": "a" * 36}) == ""
    for fine in ("gptpretrain", "run", "bertmlm", "cirun", "upd"):
        assert _validator("project_slug", {"project_slug": fine}) == "", fine


@pytest.mark.quick
def test_interactive_validators_accept_good_answers():
    good = {
        "model": "gpt3",
        "gpt3_layout": "13b-4dp-4pp",
        "model_size": "13B",
        "strategy": "deepspeed",
        "zero_stage": 1,
        "nodes": 2,
        "gpus_per_node": 8,
        "tensor_parallel": 1,
        "pipeline_parallel": 4,
        "gpu_type": "a100-80gb",
    }
    for field in (
        "model_size",
        "strategy",
        "zero_stage",
        "nodes",
        "gpus_per_node",
        "tensor_parallel",
        "pipeline_parallel",
        "gpu_type",
    ):
        assert _validator(field, good) == "", field


# --- Routing: the answer a problem is blamed on -----------------------------------------------------


def _config_keys(pkg) -> set[str]:
    import dataclasses

    cfg = pkg["config"].Config()
    return {
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(cfg)
        for f in dataclasses.fields(getattr(cfg, section.name))
    }


# (answers, the answer blamed first): every kind of rule the answers can break
ROUTED = [(a, field) for field, a, _ in INTERACTIVE if field != "nodes"] + [
    ({**GPT3, "gpus_per_node": 4, "tensor_parallel": 8}, "tensor_parallel"),
    ({**GPT3, "nodes": 1, "gpus_per_node": 6, "tensor_parallel": 2, "pipeline_parallel": 4}, "pipeline_parallel"),
    ({**GPT3, "pipeline_parallel": 2, "zero_stage": 3}, "zero_stage"),
    ({"model": "gpt", "model_size": "d32", "gpus_per_node": 1, "gpu_type": "v100-16gb"}, "gpu_type"),
    ({"strategy": "deepspeed", "zero_stage": 4}, "zero_stage"),  # load_config's ConfigError, by its key
]


@pytest.mark.quick
def test_the_answer_blamed_comes_from_the_problems_keys_not_their_wording(monkeypatch):
    """Rewording every rule's message changes no answer blamed: CONFIG_ANSWERS maps the config keys
    each problem carries (config key -> copier question), and the text is never read."""
    answers = _answers_module()
    pkg = answers.package()
    settings = _config_keys(pkg)
    assert set(answers.CONFIG_ANSWERS) <= settings
    assert set(answers.CONFIG_ANSWERS.values()) <= set(answers.question_order())
    before = []
    for given, field in ROUTED:
        found = answers.field_problems(given)
        assert found and found[0][0] == field, (given, found)
        for _, problem in found:
            assert set(getattr(problem, "keys", ())) <= settings, (problem, problem.keys)
        before.append([blamed for blamed, _ in found])

    class Reworded(pkg["rules"].Problem):
        def __new__(cls, message, *keys):
            return super().__new__(cls, "reworded", *keys)

    original = pkg["rules"].Problem
    for name, module in list(sys.modules.items()):  # every module that makes Problems: rules, fit, family, strategy
        if name.startswith(answers.PACKAGE + ".") and getattr(module, "Problem", None) is original:
            monkeypatch.setattr(module, "Problem", Reworded)
    monkeypatch.setattr(answers, "_CONFIG_PROBLEMS", {})  # findings kept from before the rewording
    after = []
    for given, _ in ROUTED[:-1]:  # the last is load_config's error, not a rule's problem
        found = answers.field_problems(given)
        assert {message for _, message in found} == {"reworded"}, found
        after.append([blamed for blamed, _ in found])
    assert after == before[:-1]


# A valid value of every answer copier.yml checks with a pattern; the same value with a trailing newline
# must be refused (a pattern ending in `$` would let it through into scripts and manifests).
PATTERN_ANSWERS = {
    "project_slug": ("run", {}),
    "shared_mount": ("/mnt/shared", {}),
    "nccl_socket_ifname": ("eth0", {}),
    "nccl_ib_hca": ("mlx5_0:1", {}),
    "k8s_namespace": ("ml-training", {}),
    "pvc_name": ("shared-data", {}),
    "rdma_resource": ("rdma/hca", {}),
    "image_pull_secret": ("regcred", {}),
    "k8s_scheduler_name": ("volcano", {}),
    "k8s_queue": ("training", {}),
    "k8s_priority_class": ("high-priority", {}),
    "tione_region": ("ap-guangzhou", {}),
    "tione_project_id": ("p-1", {}),
    "tione_resource_group": ("trsg-abcd1234", {}),
    "tione_instance_type": ("TI.GN7.20XLARGE320", {}),
    "tione_gpu_type": ("H800", {}),
    "tione_storage_id": ("cfs-abcd1234", {}),
    "tione_storage_path": ("/team", {}),
    "tione_vpc_id": ("vpc-abc123", {"tione_subnet_id": "subnet-abc123"}),
    "tione_subnet_id": ("subnet-abc123", {"tione_vpc_id": "vpc-abc123"}),
    "tione_cls_logset_id": ("logset-1", {"tione_cls_topic_id": "topic-1"}),
    "tione_cls_topic_id": ("topic-1", {"tione_cls_logset_id": "logset-1"}),
    "slurm_partition": ("gpu", {}),
    "slurm_account": ("team-a", {}),
    "slurm_time": ("2-00:00:00", {}),
    "slurm_gpu_type": ("v100", {}),
    "slurm_modules": ("cuda/12.4 nccl/2.21", {}),
}


@pytest.mark.quick
def test_pattern_answers_cover_every_pattern_in_copier_yml():
    import yaml

    spec = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    questions = {name: q for name, q in spec.items() if isinstance(q, dict)}
    # project_name's search for control characters refuses a newline anywhere already
    patterned = {name for name, q in questions.items() if "regex_search('^" in str(q.get("validator", ""))}
    assert patterned == set(PATTERN_ANSWERS)
    assert all("$'" not in str(q.get("validator", "")) for q in questions.values()), "anchor patterns with \\Z"


@pytest.mark.quick
@pytest.mark.parametrize("field", PATTERN_ANSWERS)
def test_every_pattern_answer_refuses_a_trailing_newline(field):
    value, others = PATTERN_ANSWERS[field]
    assert _validator(field, {**others, field: value}) == ""
    refused = _validator(field, {**others, field: value + "\n"})
    assert refused.startswith(field), refused


# Answers that make every question of the template asked: each platform, the GPT-3 family with a custom
# layout under DeepSpeed.
EVERY_QUESTION = {
    "platforms": ["devmachine", "kubeflow", "tione", "slurm"],
    "model": "gpt3",
    "gpt3_layout": "custom",
    "strategy": "deepspeed",
    "tione_resource_group": "trsg-1",
}


@pytest.mark.quick
def test_every_answer_given_generated_bad_values_is_refused_in_one_line_or_taken():
    """Every number and text question, asked, given a negative, zero, 10^13, 400 digits (numbers) or
    empty text, a newline, non-ASCII, a space, 400 characters (text): the validators and the last
    check end in lines naming the answer, never an exception; a negative count, 400 digits and
    400 characters are refused."""
    answers = _answers_module()
    refused_for_sure = {-1, 10**400, "9" * 400}
    failures, tried = [], 0
    for field, question in answers.questions().items():
        kind = question.get("type", "str")
        if field in answers.computed_names() or question.get("choices") or kind not in ("int", "str"):
            continue
        values = [-1, 0, 10**13, 10**400] if kind == "int" else ["", "x\n", "\u00e9", "a b", "9" * 400]
        for value in values:
            given = answers.complete({**EVERY_QUESTION, field: value})
            if answers._default_template(str(question.get("when", True))).render(given).strip().lower() == "false":
                break  # not asked with these answers
            tried += 1
            try:
                # the question's own validator speaks first; the check of all answers after it
                lines = list(filter(None, [_validator(field, given)])) or answers.problems(given)
            except Exception as exc:  # noqa: BLE001 - any exception is the failure reported
                failures.append(f"{field}={value!r:.30}: {type(exc).__name__}: {exc}")
                continue
            if any("\n" in line for line in lines):
                failures.append(f"{field}={value!r:.30}: a message of several lines: {lines}")
            if value in refused_for_sure and not any(line.startswith(f"{field}") for line in lines):
                failures.append(f"{field}={value!r:.30} was taken: {lines}")
    assert tried > 150
    assert not failures, "\n".join(failures)
