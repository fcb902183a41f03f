"""A real image build and push: `<slug> image build --push` of a generated project, through the docker
SDK against podman's Docker API, into a real registry, FROM a local base image that holds torch.

    ./dev test -k image_build        # or: .venv/bin/python -m pytest -q tests/test_image_build.py

tests/infra/podman.sh starts the engine (`podman system service`), Debian's `docker-registry` on
127.0.0.1:5000 and builds the base image once (debootstrap + the CPU torch wheel; ~3 min, cached
under /tmp/dtt-podman). Needs root and podman, runc, docker-registry, debootstrap
(tests/infra/install-system.sh installs them). One build and one rebuild keep it to about a minute
once the base exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import TEMPLATE, free_port, render, run

INFRA = TEMPLATE / "tests" / "infra" / "podman.sh"
BASE = "localhost/test-base:bookworm"
REGISTRY = "127.0.0.1:5000"
SLUG = "imagebuild"
IMAGE_TAG = "test"
REPOSITORY = f"{REGISTRY}/{SLUG}"
PASSWORD = "s3cret-never-shown"


@pytest.fixture(scope="session")
def engine() -> dict[str, str]:
    """DOCKER_HOST of the podman service podman.sh started (with the registry and the base image)."""
    start = time.time()
    proc = run(["bash", str(INFRA)], timeout=1800, env={"PYTHON": sys.executable})
    assert proc.returncode == 0, (
        f"tests/infra/podman.sh could not start the engine, the registry or the base image "
        f"(install: bash tests/infra/install-system.sh; needs root):\n{proc.stdout}\n{proc.stderr}"
    )
    host = re.findall(r"^DOCKER_HOST=(\S+)$", proc.stdout, re.M)
    assert host, f"podman.sh printed no DOCKER_HOST line:\n{proc.stdout}"
    print(f"\nengine + registry + base ready in {time.time() - start:.0f} s", file=sys.stderr)
    return {"DOCKER_HOST": host[-1]}


@pytest.fixture(scope="module")
def docker_client(engine):
    import docker  # requirements-dev.txt; a missing package fails here, loudly

    client = docker.DockerClient(base_url=engine["DOCKER_HOST"], timeout=600)
    yield client
    client.close()


class Project:
    def __init__(self, path: Path):
        self.path = path

    def cli(self, *args: str, env: dict | None = None, stdin: str | None = None, timeout: int = 1200):
        cmd = [sys.executable, "-m", SLUG, "image", *args]
        full = {**os.environ, "PYTHONPATH": str(self.path / "src"), **(env or {})}
        return subprocess.run(
            cmd, cwd=self.path, env=full, input=stdin, capture_output=True, text=True, timeout=timeout
        )

    def git(self, *args: str) -> str:
        proc = run(["git", "-c", "user.name=Image Test", "-c", "user.email=image@test.invalid", *args], cwd=self.path)
        assert proc.returncode == 0, f"git {' '.join(args)} failed:\n{proc.stderr}"
        return proc.stdout.strip()

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    root = tmp_path_factory.mktemp("image")
    render(
        root / "project",
        project_name="Image Build",
        image=f"{REPOSITORY}:{IMAGE_TAG}",
        data_dir=str(root / "data"),
        output_dir=str(root / "runs"),
    )
    proj = Project(root / "project")
    proj.git("init", "-q")
    proj.commit("generated")
    return proj


def timed(label: str, fn):
    start = time.time()
    result = fn()
    print(f"\n{label}: {time.time() - start:.0f} s", file=sys.stderr)
    return result


@pytest.fixture(scope="module")
def first_build(project, engine, docker_client):
    """`image build --push` of the freshly committed project: (output, commit, image id)."""
    commit = project.git("rev-parse", "HEAD")
    proc = timed("image build --push (first)", lambda: project.cli("build", "--push", "--base-image", BASE, env=engine))
    assert proc.returncode == 0, f"image build --push failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    image_id = docker_client.images.get(f"{REPOSITORY}:{commit[:7]}").id
    yield proc.stdout, commit, image_id
    for ref in (image_id,):
        try:
            docker_client.images.remove(ref, force=True)
        except Exception:  # noqa: BLE001 - cleanup only; the image may be gone with the rebuild's
            pass


@pytest.fixture(scope="module")
def rebuild(project, engine, docker_client, first_build):
    """A one-line change to a .py file, committed, then `image build` again: (output, commit, image id)."""
    path = project.path / "src" / SLUG / "training" / "train.py"
    path.write_text(path.read_text() + "\n# a code-only change: the image rebuilds one thin layer\n")
    commit = project.commit("code change")
    proc = timed("image build (code change)", lambda: project.cli("build", "--base-image", BASE, env=engine))
    assert proc.returncode == 0, f"rebuild failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    image_id = docker_client.images.get(f"{REPOSITORY}:{commit[:7]}").id
    yield proc.stdout, commit, image_id
    try:
        docker_client.images.remove(image_id, force=True)
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def build_steps(output: str) -> list[str]:
    """The build log cut into one text per Dockerfile step (podman: 'STEP n/m:', Docker: 'Step n/m :')."""
    parts = re.split(r"^(?=(?:STEP|Step) \d+/\d+ ?:)", output, flags=re.M)
    return [p for p in parts if re.match(r"(?:STEP|Step) \d+/\d+", p)]


def registry_json(path: str) -> dict:
    with urllib.request.urlopen(f"http://{REGISTRY}{path}", timeout=10) as response:
        return json.load(response)


# --- The build --------------------------------------------------------------------------------------


def test_build_streams_progress_and_tags_version_commit_and_answer(first_build, docker_client):
    output, commit, image_id = first_build
    steps = build_steps(output)
    assert len(steps) >= 5, f"no build progress was streamed:\n{output[-3000:]}"
    assert f"FROM {BASE}" in steps[0]
    assert "pip install" in output and "from the base image, kept" in output  # the dependency step ran
    image = docker_client.images.get(image_id)
    expected = {f"{REPOSITORY}:0.1.0", f"{REPOSITORY}:{commit[:7]}", f"{REPOSITORY}:{IMAGE_TAG}"}
    assert expected <= set(image.tags), image.tags
    labels = image.labels
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.revision"] == commit
    assert labels["org.opencontainers.image.base.name"] == BASE
    for ref in expected:
        assert f"pushed {ref}" in output


def test_registry_lists_the_pushed_tags(first_build):
    _, commit, _ = first_build
    assert SLUG in registry_json("/v2/_catalog")["repositories"]
    tags = set(registry_json(f"/v2/{SLUG}/tags/list")["tags"])
    assert {"0.1.0", commit[:7], IMAGE_TAG} <= tags, tags


def test_image_keeps_the_base_torch_and_holds_the_package(first_build, docker_client):
    _, _, image_id = first_build
    code = f"import torch, {SLUG}; print(torch.__version__, {SLUG}.__file__)"
    base = (
        docker_client.containers.run(
            BASE, ["python3", "-c", "import torch; print(torch.__version__)"], remove=True, network_mode="none"
        )
        .decode()
        .split()
    )
    ours = (
        docker_client.containers.run(image_id, entrypoint=["python3", "-c", code], remove=True, network_mode="none")
        .decode()
        .split()
    )
    assert base[0].startswith("2."), base
    assert ours[0] == base[0], f"the project image replaced the base's torch {base[0]} with {ours[0]}"
    assert ours[1].endswith(f"/{SLUG}/__init__.py"), ours


def test_code_change_rebuilds_only_the_code_layers(first_build, rebuild, docker_client):
    """Deps before code: after a committed .py change the dependency step comes from the cache, and
    the image shares every layer with the first one up to the code."""
    _, _, first_id = first_build
    output, commit, image_id = rebuild
    steps = build_steps(output)
    step = re.compile(r"(?:STEP|Step) \d+/\d+ ?: ?")
    runs = [i for i, s in enumerate(steps) if step.sub("", s).startswith("RUN ")]
    code = [i for i, s in enumerate(steps) if step.sub("", s).startswith("COPY . .")]
    assert runs and code, f"RUN or `COPY . .` step not found in the build log:\n{output[-4000:]}"
    deps = steps[runs[0]]  # the first RUN installs the dependencies
    assert runs[0] < code[0], "the code is copied before the dependencies are installed"
    assert "Using cache" in deps, f"the dependency layer was rebuilt for a code change:\n{deps[-2000:]}"
    assert "Using cache" not in steps[code[0]], "the code layer came from the cache although a .py file changed"
    first = docker_client.api.inspect_image(first_id)["RootFS"]["Layers"]
    new = docker_client.api.inspect_image(image_id)["RootFS"]["Layers"]
    base = docker_client.api.inspect_image(BASE)["RootFS"]["Layers"]
    shared = next((i for i, (a, b) in enumerate(zip(first, new)) if a != b), min(len(first), len(new)))
    assert shared >= len(base) + 2, f"only {shared} layers shared: the dependency layer was rebuilt"
    assert len(new) - shared <= 2, f"{len(new) - shared} layers differ: more than the code changed"
    labels = docker_client.images.get(image_id).labels
    assert labels["org.opencontainers.image.revision"] == commit


# --- Errors ------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_dry_run_shows_tags_build_args_and_push_targets_without_an_engine(project):
    commit = project.git("rev-parse", "HEAD")
    proc = project.cli(
        "build", "--push", "--dry-run", "--base-image", BASE, env={"DOCKER_HOST": "unix:///nonexistent.sock"}
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in (
        f"{REPOSITORY}:0.1.0",
        f"{REPOSITORY}:{commit[:7]}",
        f"{REPOSITORY}:{IMAGE_TAG}",
        "VERSION=0.1.0",
        f"GIT_COMMIT={commit}",
        f"BASE_IMAGE={BASE}",
        f"push to:     {REGISTRY}",
    ):
        assert text in out, f"{text!r} missing from the dry run:\n{out}"


def test_uncommitted_changes_mark_the_commit_tag_dirty(project):
    commit = project.git("rev-parse", "HEAD")
    extra = project.path / "notes.txt"
    extra.write_text("not committed\n")
    try:
        proc = project.cli("build", "--dry-run")
    finally:
        extra.unlink()
    assert proc.returncode == 0, proc.stderr
    assert f"{REPOSITORY}:{commit[:7]}-dirty" in proc.stdout and f"GIT_COMMIT={commit}-dirty" in proc.stdout


def test_without_an_engine_one_line_error_no_traceback(project):
    proc = project.cli("build", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: no container engine at DOCKER_HOST=unix:///nonexistent.sock"), proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_push_to_a_registry_that_is_not_running_fails_naming_it(project, engine, first_build, docker_client):
    """Build (all layers cached) then push to a closed port: the SDK does not raise, the stream carries
    the error; the command exits 1 naming the registry. The password given on stdin never shows."""
    registry = f"127.0.0.1:{free_port()}"
    proc = project.cli(
        "build",
        "--push",
        "--image",
        f"{registry}/{SLUG}:gone",
        "--base-image",
        BASE,
        "--username",
        "ci",
        "--password-stdin",
        env=engine,
        stdin=PASSWORD + "\n",
    )
    try:
        assert proc.returncode == 1, f"push to a dead registry did not fail:\n{proc.stdout[-3000:]}\n{proc.stderr}"
        assert "built sha256:" in proc.stdout  # the build itself succeeded
        error = proc.stderr.strip().splitlines()[-1]
        assert error.startswith(f"error: push of {registry}/{SLUG}:") and f"to registry {registry} failed" in error
        assert "not reachable" in error, error
        assert "Traceback" not in proc.stderr
        assert PASSWORD not in proc.stdout + proc.stderr
        leaked = [p for p in project.path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
        assert not leaked, f"the password was written into the project: {leaked}"
    finally:
        for image in docker_client.images.list(name=f"{registry}/{SLUG}"):
            for tag in image.tags:
                docker_client.images.remove(tag)


def test_push_over_https_to_a_plain_http_registry_names_the_insecure_setting(
    project, engine, first_build, docker_client
):
    """The same registry as localhost:5000, which podman's registries.conf does not mark insecure: the
    engine speaks HTTPS, the registry answers HTTP, the stream carries the error."""
    registry = "localhost:" + REGISTRY.rsplit(":", 1)[1]
    proc = project.cli("build", "--push", "--image", f"{registry}/{SLUG}:tls", "--base-image", BASE, env=engine)
    try:
        assert proc.returncode == 1, f"push did not fail:\n{proc.stdout[-3000:]}\n{proc.stderr}"
        error = proc.stderr.strip().splitlines()[-1]
        assert f"to registry {registry} failed" in error and "insecure" in error, error
        assert "Traceback" not in proc.stderr
    finally:
        for image in docker_client.images.list(name=f"{registry}/{SLUG}"):
            for tag in image.tags:
                docker_client.images.remove(tag)


def test_username_without_a_password_is_refused_before_any_push(project, engine, first_build):
    proc = project.cli("push", "--username", "ci", env={**engine, "REGISTRY_PASSWORD": ""})
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: --username ci: no password;"), proc.stderr


def test_missing_docker_package_names_the_install(project):
    code = f"import sys; sys.modules['docker'] = None; from {SLUG}.cli import main; sys.exit(main(['image', 'build']))"
    proc = run([sys.executable, "-c", code], cwd=project.path, env={"PYTHONPATH": str(project.path / "src")})
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: image (the docker SDK talks to the engine) needs the docker package"), (
        proc.stderr
    )
    assert "`pip install -e '.[image]'` in the project, or `pip install docker`" in proc.stderr, proc.stderr
