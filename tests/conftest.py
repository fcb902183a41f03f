"""Shared helpers and session fixtures of the template's tests: render projects with the real
copier CLI, prepare the demo corpus once, run a generated project's own suite with a live log.

The suite runs on both cores (`./dev test`: pytest-xdist); GROUPS below says which tests run one
after another on one worker. Session fixtures are built once per worker.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from xdist.scheduler import LoadScopeScheduling

TEMPLATE = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# PATH of a new login on a stand-in "remote host" (ssh, mpirun's agent, TI-ONE's exec): a fresh
# environment with this Python environment's bin first, as a cluster login that activates it in its
# shell profile gives. Also one ninja for every rank: torch rebuilds DeepSpeed's CPU op (~100 s of CPU)
# whenever the other of two ninja versions (this environment's, the system's) built it last.
LOGIN_PATH = os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin"])
# A generated project's own suite writes its progress here, one line per test (tail -f while it runs).
PROJECT_SUITE_LOGS = TEMPLATE / "build" / "test-logs"


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


def copy_template(copy: Path) -> Path:
    """This template's files (copier.yml, hooks, template, migrations) copied to `copy`, a fork to add
    a family or a platform to."""
    copy.mkdir(parents=True, exist_ok=True)
    for name in ("copier.yml", "hooks", "template", "migrations"):
        source = TEMPLATE / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, copy / name)
    return copy


@pytest.fixture(scope="session")
def every_part_project(tmp_path_factory) -> Path:
    """The default project with every family's folder and DeepSpeed's copied in, as the benches that
    compare them all render it (bench/gpt_vs_hf.py's render_project)."""
    sys.path.insert(0, str(TEMPLATE / "bench"))
    from gpt_vs_hf import render_project

    project = tmp_path_factory.mktemp("every-part") / "project"
    render_project(project, "HEAD", every_part=True)
    return project


def slug_of(project: Path) -> str:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())["project_slug"]


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; closed again when the socket is)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git(cwd: Path, *args: str) -> str:
    """git with a fixed identity; fails the test with git's message."""
    result = run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd)
    assert result.returncode == 0, f"git {' '.join(args)} in {cwd}: {result.stdout}{result.stderr}"
    return result.stdout


# Tests that share a service one per machine run one after another on one worker (a scope of
# GroupScheduling each), by node id prefix: the Slurm cluster, podman's API with the registry on :5000,
# Open MPI (mpirun and its stand-in hosts share /tmp), Ray (`ray stop --force` ends every Ray cluster
# here); and tests that read one costly module fixture, made once that way. Every other test is a
# scope of its own. (Two "lanes" that held all the long work, one per worker, were slower: the short
# tests waited for a lane to end, and the two CPU-bound lanes fought.)
GROUPS = {
    "slurm": ["tests/test_slurm.py"],
    "registry": ["tests/test_image_build.py"],
    "mpi": [
        "tests/test_mpijob.py",
        "tests/test_deepspeed_launcher.py::test_openmpi_starts_both_hosts",
        "tests/test_tione.py::test_mpi_",
    ],
    "ray": ["tests/test_tione.py::test_ray_on_a_cluster", "tests/test_tione.py::test_ray_script"],
    # One worker trains test_tione.py's ddp_task run once for the tests that read it.
    "tione-ddp": ["tests/test_tione.py::test_ddp_task_", "tests/test_tione.py::test_status_of_a_task_the_api"],
}


# The long work, longest first (measured wall time on 2 cores): handed out before everything else,
# and never queued on a worker behind another long one (xdist keeps one test queued behind the
# running one), so the short tests fill the gaps around them.
LONG_WORK = [
    "tests/test_generated_project.py::test_generated_project_own_tests_pass",  # two halves, ~9 min each
    "slurm",  # ~8 min, mostly waiting on the cluster
    "tests/test_generated_project.py::test_deepspeed_project_own_tests_pass",  # ~15 min
    "tests/test_lm_eval.py",  # ~4 min with lm-eval's own environment made on a fresh machine
    "tests/test_bert_project.py::test_bert_deepspeed_zero3_project_own_tests_pass",  # ~2.5 min
    "tests/test_generated_project.py::test_gpt3_project_layouts_match_one_process",  # ~6 min
    "ray",
    "mpi",
    "registry",
]


def group_of(nodeid: str) -> str | None:
    return next((group for group, prefixes in GROUPS.items() if nodeid.startswith(tuple(prefixes))), None)


@functools.cache
def long_rank(scope: str) -> int | None:
    """Place of the scope in LONG_WORK (None: short work)."""
    return next((i for i, prefix in enumerate(LONG_WORK) if scope.startswith(prefix)), None)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with GROUPS as the scopes and every other test a scope of its own.
    (xdist's own `--dist loadgroup` groups nothing under pytest 9.2: it renames node ids through an
    attribute pytest no longer reads, so its xdist_group marks are silently ignored.) LONG_WORK goes
    first, one long scope per worker at a time; a worker holds at most one test beyond the running one."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid

    def _holds_long_work(self, node) -> bool:
        return any(
            long_rank(scope) is not None and not all(done.values())
            for scope, done in self.assigned_work.get(node, {}).items()
        )

    def _assign_work_unit(self, node) -> None:
        longs = sorted((s for s in self.workqueue if long_rank(s) is not None), key=long_rank)
        shorts = [s for s in self.workqueue if long_rank(s) is None]
        choice = (shorts + longs) if self._holds_long_work(node) else (longs + shorts)
        scope = choice[0]
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) <= 1:
            self._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """quick_only tests (a slice of a test the full run has whole) run only when the quick tier is asked for."""
    if "quick" in (config.option.markexpr or ""):
        return
    dropped = [item for item in items if item.get_closest_marker("quick_only")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("quick_only")]


def pytest_report_header(config):
    return f"generated projects' own suites log to {PROJECT_SUITE_LOGS}/ (one line per test)"


def run_project_suite(project: Path, *args: str, name: str, timeout: int = 1800) -> str:
    """The generated project's own pytest (args: files, -k), as its user runs it from its root.

    Its progress goes line by line to build/test-logs/<name>.log. A failure, or no end within
    `timeout` seconds (the whole process group is killed then), fails the test with the log's tail;
    returns the log."""
    PROJECT_SUITE_LOGS.mkdir(parents=True, exist_ok=True)
    log = PROJECT_SUITE_LOGS / f"{name}.log"
    # Its own temporary folder: pytest prunes old numbered ones, and several suites run at once here.
    basetemp = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    cmd = [
        str(BIN / "python"),
        "-m",
        "pytest",
        "-v",
        "-p",
        "no:cacheprovider",
        "--durations=10",
        f"--basetemp={basetemp}",
        "-n",  # one process: this suite already runs its groups on both cores, and the log reads
        "0",  # "test PASSED" lines in file order
    ]
    cmd += args
    # Without this suite's xdist variables: the project's own session decides whether it has workers.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    text = log.read_text(errors="replace")
    if code == 0:
        shutil.rmtree(basetemp, ignore_errors=True)
    if code is None:
        pytest.fail(f"{project.name}'s own suite did not end within {timeout} s; the end of {log}:\n{text[-6000:]}")
    assert code == 0, f"{project.name}'s own suite failed (exit {code}); the end of {log}:\n{text[-8000:]}"
    assert " passed" in text and " failed" not in text.splitlines()[-1], text[-3000:]
    return text


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory, default_project) -> Path:
    """The demo corpus as a default project prepares it (`prepare-data --demo-corpus`, 2048-token BPE,
    5% held out), once per session: tests that train a project copy it to its data_dir
    (copy_demo_corpus) instead of preparing the same tokens again."""
    data = tmp_path_factory.mktemp("demo-corpus") / "data"
    result = run(
        [
            str(BIN / "python"),
            "-m",
            slug_of(default_project),
            "prepare-data",
            "--demo-corpus",
            f"data.dir={data}",
            "data.vocab_size=2048",
            "data.val_fraction=0.05",
        ],
        cwd=default_project,
        env={"PYTHONPATH": str(default_project / "src")},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return data


def copy_demo_corpus(corpus: Path, data_dir: Path) -> Path:
    """The prepared corpus (tokenizer, shards, meta.json) at data_dir, as `prepare-data` leaves it."""
    shutil.copytree(corpus, data_dir)
    return data_dir
