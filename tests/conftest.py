"""Shared helpers for the template's tests: render projects with the real copier CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(
    cmd: list[str], cwd: Path | None = None, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run a command, capture its output as text, never raise on a non-zero exit."""
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def copier_copy(
    dst: Path, data: dict | None = None, src: str | Path = TEMPLATE, extra: list[str] = ()
) -> subprocess.CompletedProcess:
    """`copier copy --trust --defaults` with --data answers; renders the working tree (HEAD plus
    uncommitted changes) of a local template."""
    cmd = [str(BIN / "copier"), "copy", "--trust", "--defaults", *extra]
    if Path(str(src)).is_dir():
        cmd.append("--vcs-ref=HEAD")
    for key, value in (data or {}).items():
        cmd += ["--data", f"{key}={value}"]
    return run(cmd + [str(src), str(dst)])


def render(dst: Path, **data) -> Path:
    """Render a project and fail the test with copier's output if it does not succeed."""
    result = copier_copy(dst, data)
    assert result.returncode == 0, f"copier copy failed:\n{result.stdout}\n{result.stderr}"
    return dst


@pytest.fixture(scope="session")
def default_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("default")
    return render(root / "project", project_name="CI Run", data_dir=str(root / "data"), output_dir=str(root / "runs"))
