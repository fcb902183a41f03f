"""ruff lint and format, with the settings of ruff.toml (this repository) and of the generated
pyproject.toml (a project), over the template's Python and over rendered projects, where the files
with Jinja names become Python files.

    python -m pytest -q tests/test_lint.py
    ruff check . && ruff format --check .      # the same, by hand; `ruff format .` fixes the format
"""

from __future__ import annotations

import pytest
from conftest import BIN, TEMPLATE, render, run

RUFF = BIN / "ruff"
# Between them, every Jinja-named Python file of the template is rendered.
PROJECTS = {
    "gpt-every-platform": {"platforms": "[devmachine,kubeflow,slurm,tione]"},
    "gpt3-deepspeed": {"model": "gpt3", "gpt3_layout": "125m-1gpu"},
    "bert-deepspeed": {"model": "bert", "strategy": "deepspeed"},
}


def ruff(*args: str, cwd):
    assert RUFF.exists(), f"ruff is not next to the test's Python ({RUFF}): pip install -r requirements-dev.txt"
    return run([str(RUFF), *args], cwd=cwd)


@pytest.mark.quick
@pytest.mark.parametrize("command", [("check", "."), ("format", "--check", ".")], ids=["check", "format"])
def test_template_sources_pass_ruff(command):
    result = ruff(*command, cwd=TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", PROJECTS)
def test_generated_project_passes_ruff(tmp_path, name):
    project = render(
        tmp_path / "p",
        project_name="Lint",
        shared_mount=str(tmp_path),
        data_dir=str(tmp_path / "d"),
        output_dir=str(tmp_path / "r"),
        **PROJECTS[name],
    )
    for command in (("check", "."), ("format", "--check", ".")):
        result = ruff(*command, cwd=project)
        assert result.returncode == 0, f"ruff {' '.join(command)} in a {name} project:\n{result.stdout}{result.stderr}"
