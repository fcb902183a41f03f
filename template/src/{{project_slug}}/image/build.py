"""`image build` / `image push`: the project image, built and pushed with the docker SDK.

    <package> image build                         # Dockerfile in the project root -> three tags (below)
    <package> image build --push                  # build, then push every tag
    <package> image push                          # push the tags of this version and commit (built before)
    <package> image build --base-image localhost/base:1   # another FROM (the Dockerfile's BASE_IMAGE arg)
    <package> image build --push --dry-run        # print tags, build args and push targets; no engine needed
    echo "$TOKEN" | <package> image push --username ci --password-stdin

Tags: the repository of the `image` answer (.copier-answers.yml in the project root, which
`copier update --data image=...` rewrites) with (1) the project version from pyproject.toml,
(2) the git commit's short hash (with `-dirty` when the checkout has uncommitted changes), and
(3) the answer's own tag (`latest` when it names none); `--image` replaces the answer for one run.
The build args VERSION and GIT_COMMIT become the image's OCI labels (the Dockerfile declares them
after the dependency layers, so a new commit rebuilds only the code layer).

The engine is whatever DOCKER_HOST points to (Docker, or podman's `podman system service`), else
/var/run/docker.sock. Credentials never enter the project: a push uses the engine's login
(`docker login`, ~/.docker/config.json); `--username` takes the password from stdin or
$REGISTRY_PASSWORD for this one call and neither prints nor stores it. A failed push does not raise
in the docker SDK; its stream carries an "error" entry, so every chunk is read and checked.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from ..settings.config import Config, ConfigError
from ..settings.packages import require_package
from .plan import Plan, describe, make_plan

ACTIONS = ("build", "push")
PASSWORD_ENV = "REGISTRY_PASSWORD"
ENGINE_TIMEOUT = 1800  # seconds one API read may wait: a silent build step (a large pip download) is slow
ENGINE_HELP = (
    "start one (Docker: `sudo systemctl start docker`; podman: `podman system service --time=0 "
    "unix:///tmp/podman.sock &` then `export DOCKER_HOST=unix:///tmp/podman.sock`) or point "
    "DOCKER_HOST at a running engine"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        choices=ACTIONS,
        help="build: build and tag the image (add --push to push it too); push: push the tags built before",
    )
    p.add_argument("--push", action="store_true", help="build: push every tag after a successful build")
    p.add_argument(
        "--image",
        metavar="REGISTRY/NAME[:TAG]",
        help="repository (and tag) to use instead of the `image` answer in .copier-answers.yml",
    )
    p.add_argument(
        "--base-image",
        metavar="REF",
        help="FROM image for this build (the Dockerfile's BASE_IMAGE; default: the base_image answer)",
    )
    p.add_argument(
        "--tag",
        dest="extra_tags",
        action="append",
        default=[],
        metavar="TAG",
        help="one more tag on the same repository (repeatable)",
    )
    p.add_argument(
        "--build-arg",
        dest="build_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another Dockerfile build arg, e.g. EXTRAS=test,export (repeatable)",
    )
    p.add_argument(
        "--context",
        metavar="DIR",
        help="project root with the Dockerfile (default: the working directory, else the project "
        "this package was installed from)",
    )
    p.add_argument("--no-cache", action="store_true", help="build: do not reuse cached layers")
    p.add_argument("--pull", action="store_true", help="build: pull a newer base image even if one is present")
    p.add_argument("--username", help="push: registry user for this call (default: the engine's `docker login`)")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help=f"push: read the password for --username from stdin (else ${PASSWORD_ENV})",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the tags, build args and push targets; build and push nothing"
    )


def _reason(exc: BaseException) -> str:
    """The root cause of a connection failure in a few words (the SDK wraps it three times)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, FileNotFoundError):
            return "no socket there"
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, PermissionError):
            return "permission denied (join the docker group, or use sudo)"
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    for word in ("No such file or directory", "Connection refused", "Permission denied", "timed out"):
        if word in text:
            return word.lower()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def connect():
    """A docker APIClient for DOCKER_HOST (or the default socket), after a ping: one clear line if none."""
    docker = require_package("docker", "image", "image (the docker SDK talks to the engine)")
    where = os.environ.get("DOCKER_HOST")
    where = f"DOCKER_HOST={where}" if where else "unix:///var/run/docker.sock (DOCKER_HOST is unset)"
    try:
        client = docker.from_env(timeout=ENGINE_TIMEOUT)
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' errors or OSError by transport
        raise ConfigError(f"no container engine at {where}: {_reason(exc)}; {ENGINE_HELP}") from None
    return client.api


def _short(message: str, limit: int = 400) -> str:
    """One line of an engine message; podman repeats a whole RUN command in it, so the middle goes."""
    text = " ".join(str(message).split())
    return text if len(text) <= limit else f"{text[: limit // 2]} ... {text[-limit // 2 :]}"


def _api_error(exc: BaseException) -> str:
    return _short(getattr(exc, "explanation", None) or exc)


def build(api, plan: Plan, args: argparse.Namespace) -> str:
    """Build with the progress streamed to stdout; tag every ref; return the image id."""
    import docker

    first = plan.refs()[0]
    print(
        f"building {first} from {plan.root} (FROM {plan.base_image}) on "
        f"{os.environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'}",
        flush=True,
    )
    start = time.time()
    image_id = None
    shown: set = set()
    try:
        for chunk in api.build(
            path=str(plan.root),
            dockerfile="Dockerfile",
            tag=first,
            buildargs=plan.build_args,
            decode=True,
            rm=True,
            forcerm=True,
            pull=args.pull,
            nocache=args.no_cache,
        ):
            if "error" in chunk or "errorDetail" in chunk:
                message = chunk.get("error") or chunk.get("errorDetail", {}).get("message", "")
                raise ConfigError(f"image build failed: {_short(message)} (the build output above shows the step)")
            if chunk.get("stream"):
                sys.stdout.write(chunk["stream"])
                sys.stdout.flush()
            else:
                print_status(chunk, shown)  # pulling the base
            aux = chunk.get("aux")
            if isinstance(aux, dict) and aux.get("ID"):
                image_id = aux["ID"]
        image_id = image_id or api.inspect_image(first)["Id"]
        for tag in plan.tags[1:]:
            if not api.tag(image_id, plan.repository, tag, force=True):
                raise ConfigError(f"the engine refused to tag {image_id[:19]} as {plan.repository}:{tag}")
    except docker.errors.DockerException as exc:
        raise ConfigError(f"image build failed: {_api_error(exc)}") from None
    print(f"built {image_id} in {time.time() - start:.0f} s, tagged:", flush=True)
    for ref in plan.refs():
        print(f"  {ref}", flush=True)
    return image_id


def print_status(chunk: dict, shown: set) -> None:
    """A pull/push progress entry: one line per layer and state, not one per progress tick."""
    status = chunk.get("status")
    if status and (chunk.get("id"), status) not in shown:
        shown.add((chunk.get("id"), status))
        print("  " + " ".join(str(x) for x in (chunk.get("id"), status) if x), flush=True)


def push_error(registry: str, ref: str, message: str) -> str:
    """A failed push as what failed, why, and the fix for the usual causes."""
    low = message.lower()
    head = f"push of {ref} to registry {registry} failed: {message.strip()}"
    if "http response to https client" in low or "x509" in low or "certificate" in low or "tls" in low:
        return (
            f"{head}. The registry speaks plain HTTP or its certificate is not trusted: list it as insecure "
            f'in the engine\'s config (Docker: "insecure-registries": ["{registry}"] in '
            f'/etc/docker/daemon.json, then restart dockerd; podman: [[registry]] location="{registry}" '
            "insecure=true in registries.conf) or serve it with TLS"
        )
    # Status codes as whole words: a registry on port 43401 must not read as "401 unauthorized".
    if any(w in low for w in ("unauthorized", "authentication required", "denied", "forbidden")) or re.search(
        r"\b(401|403)\b", low
    ):
        return (
            f"{head}. Not logged in, or no push right there: run `docker login {registry}` (podman: "
            f"`podman login {registry}`), or pass --username USER with the password on stdin "
            f"(--password-stdin) or in ${PASSWORD_ENV}"
        )
    if any(
        w in low
        for w in (
            "connection refused",
            "no such host",
            "dial tcp",
            "i/o timeout",
            "connect:",
            "network is unreachable",
            "timeout",
        )
    ):
        return (
            f"{head}. The registry is not reachable: is it running, and is {registry} the right address? "
            "Change the image answer with `copier update --data image=REGISTRY/NAME:TAG` or pass --image"
        )
    if "does not exist" in low or "no such image" in low or ("not found" in low and "image" in low):
        return f"{head}. The tag is not in the engine: run `image build` first (or `image build --push`)"
    return head


def auth_config(args: argparse.Namespace, registry: str) -> dict | None:
    """Credentials for this call only, from stdin or the environment; never printed or written."""
    if not args.username:
        if args.password_stdin:
            raise ConfigError("--password-stdin needs --username USER")
        return None
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = os.environ.get(PASSWORD_ENV, "")
    if not password:
        raise ConfigError(
            f"--username {args.username}: no password; pipe it in with --password-stdin or set "
            f"${PASSWORD_ENV} (it is never passed on the command line)"
        )
    return {"username": args.username, "password": password, "serveraddress": registry}


def push(api, plan: Plan, args: argparse.Namespace) -> None:
    """Push every tag; the stream is read to its end, and an "error" entry anywhere fails the push."""
    import docker

    auth = auth_config(args, plan.registry)
    start = time.time()
    for tag in plan.tags:
        ref = f"{plan.repository}:{tag}"
        print(f"pushing {ref} to {plan.registry}", flush=True)
        shown = set()
        digest = None
        try:
            for chunk in api.push(plan.repository, tag=tag, stream=True, decode=True, auth_config=auth):
                if "error" in chunk or "errorDetail" in chunk:
                    message = chunk.get("error") or chunk.get("errorDetail", {}).get("message", "")
                    raise ConfigError(push_error(plan.registry, ref, message))
                print_status(chunk, shown)
                aux = chunk.get("aux") if isinstance(chunk.get("aux"), dict) else {}
                found = re.search(r"sha256:[0-9a-f]{64}", str(aux.get("Digest") or chunk.get("status") or ""))
                digest = found.group(0) if found else digest
        except docker.errors.DockerException as exc:
            raise ConfigError(push_error(plan.registry, ref, _api_error(exc))) from None
        print(f"pushed {ref}" + (f" ({digest})" if digest else ""), flush=True)
    print(f"pushed {len(plan.tags)} tag(s) to {plan.registry} in {time.time() - start:.0f} s", flush=True)


def run(cfg: Config, args: argparse.Namespace) -> int:
    push_too = args.action == "push" or args.push
    if args.action == "push" and (args.base_image or args.no_cache or args.pull or args.build_args):
        raise ConfigError(
            "--base-image, --build-arg, --no-cache and --pull belong to `image build`; "
            "`image push` pushes what was built"
        )
    plan = make_plan(args)
    if args.dry_run:
        print(describe(plan, args.action, push_too, args))
        return 0
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    api = connect()
    if args.action == "build":
        build(api, plan, args)
    if push_too:
        push(api, plan, args)
    return 0
