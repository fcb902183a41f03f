"""A generated project installs, exposes its console script, and passes its own test suite."""

from __future__ import annotations

import yaml
from conftest import BIN, render, run


def test_console_script_and_module_entry(default_project):
    slug = yaml.safe_load((default_project / ".copier-answers.yml").read_text())["project_slug"]
    install = run([str(BIN / "python"), "-m", "pip", "install", "-q", "--no-deps", "-e", str(default_project)])
    assert install.returncode == 0, install.stderr
    script = run([str(BIN / slug), "--help"])
    module = run([str(BIN / "python"), "-m", slug, "--help"], cwd=default_project.parent)
    assert script.returncode == 0 and module.returncode == 0, script.stderr + module.stderr
    for command in ("prepare-data", "train", "eval", "sample", "launch", "check"):
        assert command in script.stdout
    assert script.stdout == module.stdout.replace("__main__.py", slug)


def test_generated_project_own_tests_pass(default_project):
    result = run(
        [str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=default_project, timeout=1800
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


def test_deepspeed_project_own_tests_pass(tmp_path):
    """strategy=deepspeed renders its DeepSpeed tests (ZeRO 0-3 against DDP on CPU); they pass."""
    project = render(
        tmp_path / "ds",
        project_name="Zero Run",
        strategy="deepspeed",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    assert yaml.safe_load((project / "config/train.yaml").read_text())["run"]["strategy"] == "deepspeed"
    result = run(
        [str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_deepspeed.py"],
        cwd=project,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout


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
    result = run(
        [str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpt3.py"],
        cwd=project,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
