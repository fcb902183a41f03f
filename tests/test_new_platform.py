"""A platform is one folder of the template: PBS (qsub) added as template/src/<package>/launch/pbs/
(its launcher, its node-environment reader, its README part) beside its launch file
(template/launch/pbs/train.pbs.jinja) to a copy of this template, with no edit anywhere else, is
offered by copier, renders, and in its project `check`, `launch pbs --dry-run` and `node --dry-run`
under PBS's variables work, the project holds no other platform's code, and its suite passes.

    .venv/bin/python -m pytest -q tests/test_new_platform.py      # about 2 minutes on 2 cores
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import BIN, copy_template, run, run_project_suite, slug_of

PACKAGE_INIT = '''"""`launch pbs`: platform.py (qsub of launch/pbs/train.pbs), environment.py (what PBS tells a node:
PBS_NODEFILE, PBS_NODENUM). launch/ finds the platform by PLATFORM."""

from .platform import PLATFORM

__all__ = ["PLATFORM"]
'''

PLATFORM = '''"""PBS and Torque: the job is launch/pbs/train.pbs, submitted with qsub."""

from __future__ import annotations

import shlex
import subprocess

from ...settings.config import project_root
from ..base import Platform

SCRIPT = "launch/pbs/train.pbs"


class Pbs(Platform):
    name = "pbs"

    def command(self) -> list[str]:
        return ["qsub", SCRIPT]

    def dry_run(self) -> int:
        print(f"$ {shlex.join(self.command())}")
        print((project_root() / SCRIPT).read_text(), end="")
        return 0

    def submit(self) -> int:
        return subprocess.run(self.command(), cwd=project_root()).returncode


PLATFORM = Pbs
'''

ENVIRONMENT = '''"""What PBS tells a node: PBS_NODEFILE (a host per line, once per slot), PBS_NODENUM (this node's
index in it), as a Topology. Plain Python."""

from __future__ import annotations

from collections.abc import Mapping

from ...settings.topology import Platform, Topology, TopologyError, check_rank, port_of, whole_number


def read_pbs(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    path = env["PBS_NODEFILE"]
    try:
        slots = [line.strip() for line in open(path) if line.strip()]
    except OSError as exc:
        raise TopologyError(f"PBS_NODEFILE={path} cannot be read: {exc.strerror}") from None
    hosts = list(dict.fromkeys(slots))
    node_rank = whole_number(env, "PBS_NODENUM") if env.get("PBS_NODENUM") else 0
    check_rank("pbs", "PBS_NODENUM", node_rank, "the hosts of PBS_NODEFILE", len(hosts))
    return Topology("pbs", len(hosts), node_rank, slots.count(hosts[0]), hosts[0], port_of(env, "MASTER_PORT"))


ROWS = [Platform("pbs", ("PBS_JOBID", "PBS_NODEFILE"), read_pbs)]
'''

README = """### PBS (qsub)

```bash
{{ project_slug }} launch pbs --dry-run     # the qsub command and launch/pbs/train.pbs
{{ project_slug }} launch pbs               # qsub launch/pbs/train.pbs
```
"""

SCRIPT = """#!/bin/bash
#PBS -N {{ project_slug }}
#PBS -l nodes={{ nodes }}:ppn={{ gpus_per_node }}
cd "$PBS_O_WORKDIR"
pbsdsh -u {{ project_slug }} node
"""


@pytest.fixture(scope="module")
def template_with_pbs(tmp_path_factory) -> Path:
    """A copy of this template with PBS's folder and launch file added, and nothing else changed."""
    copy = copy_template(tmp_path_factory.mktemp("template-with-pbs"))
    folder = copy / "template" / "src" / "{{project_slug}}" / "launch" / "pbs"
    folder.mkdir()
    for name, text in (("__init__.py", PACKAGE_INIT), ("platform.py", PLATFORM), ("environment.py", ENVIRONMENT)):
        (folder / name).write_text(text)
    (folder / "README.md.jinja").write_text(README)
    launch_files = copy / "template" / "launch" / "{% if 'pbs' in platforms %}pbs{% endif %}"
    launch_files.mkdir()
    (launch_files / "train.pbs.jinja").write_text(SCRIPT)
    return copy


@pytest.fixture(scope="module")
def pbs_project(template_with_pbs, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pbs")
    answers = {"project_name": "Pbs Run", "platforms": "[pbs]", "nodes": 2, "gpus_per_node": 2}
    answers |= {"data_dir": root / "data", "output_dir": root / "runs"}
    cmd = [str(BIN / "copier"), "copy", "--trust", "--defaults"]
    for key, value in answers.items():
        cmd += ["--data", f"{key}={value}"]
    done = run([*cmd, str(template_with_pbs), str(root / "project")])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / "project"


def project_command(project: Path, *args: str, env: dict | None = None, expect: int = 0) -> str:
    done = run(
        [str(BIN / "python"), "-m", slug_of(project), *args],
        cwd=project,
        env={"PYTHONPATH": str(project / "src"), **(env or {})},
    )
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{' '.join(args)}: exit {done.returncode}\n{output[-4000:]}"
    return output


def test_copier_offers_the_platform_and_writes_its_folder_only(template_with_pbs, pbs_project):
    assert "pbs" not in (template_with_pbs / "copier.yml").read_text().lower()  # the menu comes from the folders
    launch = pbs_project / "src" / slug_of(pbs_project) / "launch"
    assert sorted(p.name for p in launch.iterdir() if p.is_dir() and p.name != "__pycache__") == ["pbs"]
    assert "#PBS -l nodes=2:ppn=2" in (pbs_project / "launch" / "pbs" / "train.pbs").read_text()
    assert not (launch / "pbs" / "README.md").exists()  # its README part is in the project's README
    readme = (pbs_project / "README.md").read_text()
    assert "### PBS (qsub)" in readme and "launch pbs --dry-run" in readme and "    pbs/" in readme
    menu = run([str(BIN / "copier"), "copy", "--trust", "--defaults", "--data", "platforms=[lsf]",
                str(template_with_pbs), str(pbs_project.parent / "refused")])  # fmt: skip
    assert menu.returncode != 0 and "pbs" in menu.stdout + menu.stderr


def test_check_launch_and_node_work_in_its_project(pbs_project, tmp_path):
    project_command(pbs_project, "check")
    dry = project_command(pbs_project, "launch", "pbs", "--dry-run")
    assert "$ qsub launch/pbs/train.pbs" in dry and "#PBS -l nodes=2:ppn=2" in dry
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("pbs-a\npbs-a\npbs-b\npbs-b\n")
    env = {"PBS_JOBID": "7.head", "PBS_NODEFILE": str(nodefile), "PBS_NODENUM": "1"}
    node = project_command(pbs_project, "node", "--dry-run", env=env)
    assert [line.split() for line in node.splitlines()[:5]] == [
        ["platform", "pbs"], ["nodes", "2"], ["node", "rank", "1"], ["processes", "per", "node", "2"],
        ["master", "pbs-a:29500"],
    ]  # fmt: skip
    assert "--rdzv-conf is_host=false,node_rank=1" in node
    other = project_command(pbs_project, "launch", "slurm", "--dry-run", expect=1)
    assert other.strip() == (
        "error: launch slurm: this project was made without the slurm platform; run "
        "`copier update --data 'platforms=[pbs, slurm]'` (list every platform you want) (commit first; "
        "copier merges the update into your edits)"
    )


def test_the_project_suite_passes_with_the_platform(pbs_project):
    """The package's shape and README list, the topology and rules of its shared suite."""
    suite = ["tests/test_package_shape.py", "tests/test_topology.py", "tests/test_rules.py"]
    log = run_project_suite(pbs_project, *suite, name="pbs-project", timeout=900)
    assert "test_readme_lists_every_module PASSED" in log and "test_every_import_points_down_the_folders PASSED" in log
