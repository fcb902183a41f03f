"""A generated project installs, exposes its console script, and passes its own test suite.

The project's suite is run once per distinct project shape: in full for the default (gpt, DDP; in two
halves, see below), and in the other shapes the tests of the parts only they hold (`-m part`: the
tests marked with a family, DeepSpeed or a platform, collected where the project holds it; bert's in
test_bert_project.py, Slurm's in test_slurm.py, Kubeflow's in test_kubeflow.py). Each run's progress
is in build/test-logs/<name>.log.
"""

from __future__ import annotations

import pytest
import yaml
from conftest import BIN, render, run, run_project_suite, slug_of

# Part tests another run already covers: the dev machine's (the default project's) and, outside the
# DeepSpeed project, DeepSpeed's own files.
DEVMACHINE_FILES = ["--ignore=tests/test_launch.py", "--ignore=tests/test_devmachine_script.py"]
DEEPSPEED_FILES = [
    "--ignore=tests/test_deepspeed.py",
    "--ignore=tests/test_host_syncs_deepspeed.py",
    "--ignore=tests/test_deepspeed_launcher.py",
]


def part_tests(*ignored: str) -> list[str]:
    """The arguments that run a project's tests of its optional parts (conftest.py's `part` marker)."""
    return ["-m", "part", "tests", "src", *DEVMACHINE_FILES, *ignored]


@pytest.mark.quick
def test_console_script_and_module_entry(default_project):
    slug = slug_of(default_project)
    install = run([str(BIN / "python"), "-m", "pip", "install", "-q", "--no-deps", "-e", str(default_project)])
    assert install.returncode == 0, install.stderr
    script = run([str(BIN / slug), "--help"])
    module = run([str(BIN / "python"), "-m", slug, "--help"], cwd=default_project.parent)
    assert script.returncode == 0 and module.returncode == 0, script.stderr + module.stderr
    for command in ("prepare-data", "train", "eval", "sample", "launch", "check"):
        assert command in script.stdout
    assert script.stdout == module.stdout.replace("__main__.py", slug)


# The default project's suite is the longest work here (~25 minutes of one core): two halves of about
# equal time, on two workers at once. Each half runs in a render of its own (the default answers, another
# name): two jobs of ONE project on one machine would be one job to `debug-dump`, which dumps every rank
# of its project here. Each half prepares its corpus and trains its reference runs for itself (~40 s).
FIRST_HALF = [
    "tests/test_faults.py",
    "tests/test_dropout.py",
    "tests/test_precision.py",
    "tests/test_tasks.py",
    "tests/test_export.py",
    "tests/test_epochs.py",
    "tests/test_bad_paths.py",
    "tests/test_bad_files.py",
]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("half", ["faults-dropout-precision-tasks-export-epochs-bad-paths-files", "the-rest"])
def test_generated_project_own_tests_pass(default_project, tmp_path, half):
    if half == "the-rest":
        run_project_suite(default_project, *[f"--ignore={path}" for path in FIRST_HALF], name=f"default-project-{half}")
        return
    project = render(
        tmp_path / "project",
        project_name="CI Run Faults",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    run_project_suite(project, *FIRST_HALF, name=f"default-project-{half}")


# The quick tier's slice of the run above: the full run deselects it (conftest), having the whole suite.
QUICK_SLICE = [
    "tests/test_rules.py",
    "tests/test_config.py",
    "tests/test_topology.py",
    "tests/test_launch.py::test_dry_run_one_node_is_standalone",
    "tests/test_launch.py::test_dry_run_two_nodes_uses_c10d_rendezvous_at_the_master",
    "tests/test_training.py::test_two_processes_train_and_log",
]


@pytest.mark.quick
@pytest.mark.quick_only
def test_generated_project_quick_slice(default_project):
    """Rules, config, topology, the dev-machine launch dry-run and one tiny 2-process training."""
    run_project_suite(default_project, *QUICK_SLICE, name="default-project-quick")


@pytest.mark.timeout(2400)  # resizing the ZeRO runs to 1 and to 4 processes: ~10 minutes more
def test_deepspeed_project_own_tests_pass(tmp_path):
    """strategy=deepspeed renders its DeepSpeed tests (ZeRO 0-3 against DDP on CPU, host syncs); they pass."""
    project = render(
        tmp_path / "ds",
        project_name="Zero Run",
        strategy="deepspeed",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    assert yaml.safe_load((project / "config/train.yaml").read_text())["run"]["strategy"] == "deepspeed"
    log = run_project_suite(project, *part_tests(), name="deepspeed-project")
    assert (
        "test_deepspeed.py::" in log and "test_data_safety.py::test_a_run_refuses_data_prepared_again[deepspeed]" in log
    )


def test_gpt3_project_layouts_match_one_process(tmp_path):
    """model=gpt3 renders its layout tests (pipeline 2 and tensor 2 against one process); they pass."""
    project = render(
        tmp_path / "g3",
        project_name="Layouts",
        model="gpt3",
        gpt3_layout="custom",
        model_size="tiny",
        gpus_per_node=2,
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    train_yaml = yaml.safe_load((project / "config/train.yaml").read_text())
    assert train_yaml["model"]["arch"] == "gpt3" and train_yaml["run"]["strategy"] == "deepspeed"
    log = run_project_suite(project, *part_tests(*DEEPSPEED_FILES), name="gpt3-project")
    assert "models/gpt3/tests/test_gpt3.py::" in log and "test_plan.py::test_refused_layouts" in log
