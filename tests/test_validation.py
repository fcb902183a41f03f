"""Bad answers are refused by copier with a message naming the field, and nothing is written."""

from __future__ import annotations

import pytest

from conftest import copier_copy

BAD_ANSWERS = [
    ({"project_slug": "My-Run"}, "project_slug"),
    ({"project_slug": "1run"}, "project_slug"),
    ({"project_slug": "my_run"}, "project_slug"),
    ({"project_slug": "a" * 41}, "project_slug"),
    ({"project_name": "   "}, "project_name"),
    ({"nodes": 0}, "nodes"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"data_dir": "relative/data"}, "data_dir"),
    ({"output_dir": "runs"}, "output_dir"),
    ({"model": "t5"}, "model"),
    ({"model": "gpt", "model_size": "125M"}, "model_size"),
    ({"model": "bert", "model_size": "d12"}, "model_size"),
    ({"model": "gpt3", "model_size": "1B"}, "model_size"),
    ({"model": "bert", "pretrained_dir": "models/bert"}, "pretrained_dir"),
    ({"model": "gpt3", "gpt3_layout": "1b-2pp"}, "gpt3_layout"),
    ({"model": "gpt3", "gpt3_layout": "custom", "gpus_per_node": 4, "tensor_parallel": 8}, "tensor_parallel"),
    ({"model": "gpt3", "gpt3_layout": "custom", "gpus_per_node": 4, "pipeline_parallel": 3}, "pipeline_parallel"),
    ({"strategy": "deepspeed", "zero_stage": 4}, "zero_stage"),
    ({"strategy": "megatron"}, "strategy"),
    ({"platforms": "[]"}, "platforms"),
]


@pytest.mark.parametrize("answers, field", BAD_ANSWERS, ids=[f"{f}={list(a.values())[0]}" for a, f in BAD_ANSWERS])
def test_bad_answer_is_refused_before_writing(tmp_path, answers, field):
    dst = tmp_path / "project"
    result = copier_copy(dst, {"project_name": "Valid Name", **answers})
    assert result.returncode != 0
    output = result.stdout + result.stderr
    # copier 9 ends its output with "ValueError: Validation error for question '<field>': <message>"
    # (or "Invalid choice for '<field>'" for a value outside a question's choices).
    named = (f"Validation error for question '{field}'", f"Invalid choice for '{field}'")
    assert any(n in output for n in named), output[-2000:]
    assert not dst.exists(), f"copier left {sorted(p.name for p in dst.iterdir())}"


PLATFORM_BAD_ANSWERS = [
    ({"platforms": "[kubeflow]", "k8s_namespace": "ML_Team"}, "k8s_namespace"),
    ({"platforms": "[kubeflow]", "pvc_name": "Shared Data"}, "pvc_name"),
    ({"platforms": "[kubeflow]", "rdma_resource": "hca"}, "rdma_resource"),
    ({"platforms": "[kubeflow]", "image": "Registry/Name:tag with space"}, "image"),
    ({"platforms": "[kubeflow]", "image_pull_secret": "Bad_Secret"}, "image_pull_secret"),
    ({"platforms": "[kubeflow]", "data_dir": "/data/run"}, "data_dir"),
    ({"platforms": "[kubeflow]", "output_dir": "/outputs"}, "output_dir"),
    ({"shared_mount": "relative"}, "shared_mount"),
    ({"platforms": "[tione]", "tione_mode": "horovod"}, "tione_mode"),
    ({"platforms": "[slurm]", "slurm_time": "one day"}, "slurm_time"),
    ({"platforms": "[slurm]", "slurm_partition": "gpu;rm -rf /"}, "slurm_partition"),
    ({"platforms": "[slurm]", "slurm_modules": "cuda; reboot"}, "slurm_modules"),
    ({"platforms": "[slurm]", "slurm_cpus_per_gpu": 0}, "slurm_cpus_per_gpu"),
]


@pytest.mark.parametrize("answers, field", PLATFORM_BAD_ANSWERS,
                         ids=[f"{f}={list(a.values())[-1]}" for a, f in PLATFORM_BAD_ANSWERS])
def test_bad_platform_answer_is_refused_before_writing(tmp_path, answers, field):
    test_bad_answer_is_refused_before_writing(tmp_path, answers, field)
