"""scripts/install.sh: a new project installs what its answers chose with one command.

    python -m pytest -q tests/test_install.py

A fresh virtual environment sees this repository's environment through a .pth file (torch,
DeepSpeed, kubernetes, docker are already there, so nothing large is downloaded), and the generated
script installs the project into it for real with pip.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from conftest import render, run

SLUG = "inst"


def fresh_venv(path: Path, see_this_environment: bool) -> Path:
    assert run([sys.executable, "-m", "venv", str(path)]).returncode == 0
    if see_this_environment:
        site = next(path.glob("lib/python3*/site-packages"))
        (site / "dev-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin" / "python"


def test_install_script_installs_the_chosen_extras(tmp_path):
    project = render(
        tmp_path / "project",
        project_name="Inst",
        project_slug=SLUG,
        strategy="deepspeed",
        platforms="[devmachine,kubeflow]",
        shared_mount=str(tmp_path),
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    python = fresh_venv(tmp_path / "venv", see_this_environment=True)
    installed = run(["bash", "scripts/install.sh", "test"], cwd=project, env={"PYTHON": str(python)})
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"installed {SLUG} [image,deepspeed,kubeflow,test]" in installed.stdout
    # The console script, and every extra's import, from outside the project folder.
    check = run([str(python.parent / SLUG), "check", "--config", str(project / "config/train.yaml")], cwd=tmp_path)
    assert check.returncode == 0 and check.stdout.startswith("config OK"), check.stdout + check.stderr
    imports = run(
        [str(python), "-c", f"import deepspeed, kubernetes, docker, pytest, {SLUG}; print({SLUG}.__file__)"],
        cwd=tmp_path,
    )
    assert imports.returncode == 0, imports.stderr
    assert Path(imports.stdout.strip().splitlines()[-1]).is_relative_to(project / "src")  # editable: its source


def test_install_script_without_torch_says_what_to_do(tmp_path):
    project = render(
        tmp_path / "project",
        project_name="Inst",
        project_slug=SLUG,
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    python = fresh_venv(tmp_path / "venv", see_this_environment=False)
    refused = run(["bash", "scripts/install.sh"], cwd=project, env={"PYTHON": str(python)})
    assert refused.returncode == 1
    assert (
        refused.stderr.startswith("error: torch is not installed for ")
        and "install the build for your CUDA" in refused.stderr
    )
    listed = run([str(python), "-m", "pip", "list"]).stdout
    assert SLUG not in listed  # nothing half-installed
