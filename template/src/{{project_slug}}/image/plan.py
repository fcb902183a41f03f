"""What `image build` / `image push` do, computed without an engine (so --dry-run shows it exactly):
the project root, the image's repository and tags, build args, base image and push registry.

    from .image_plan import make_plan, describe
    plan = make_plan(args)                 # args: the `image` command's options (image.py)
    print(describe(plan, "build", push=True, args=args))

Tags come from the `image` answer in .copier-answers.yml, the project version and the git commit
(see image.py for the whole rule).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..settings.config import ConfigError
from ..settings.stored_files import read_yaml

ANSWERS_FILE = ".copier-answers.yml"


@dataclass
class Plan:
    """Everything one `image` call does, computed without an engine (so --dry-run shows it exactly)."""

    root: Path
    repository: str
    registry: str
    tags: list[str]
    build_args: dict[str, str]
    base_image: str
    base_source: str
    notes: list[str] = field(default_factory=list)

    def refs(self) -> list[str]:
        return [f"{self.repository}:{t}" for t in self.tags]


def find_root(context: str | None) -> Path:
    """The folder with the Dockerfile: --context, else the working directory, else the source checkout."""
    candidates = [Path(context)] if context else [Path.cwd(), Path(__file__).resolve().parents[3]]
    for root in candidates:
        if (root / "Dockerfile").is_file():
            return root.resolve()
    where = " or ".join(str(c) for c in candidates)
    raise ConfigError(f"no Dockerfile in {where}; run from the project folder or pass --context DIR")


def read_answers(root: Path) -> dict:
    path = root / ANSWERS_FILE
    if not path.is_file():
        return {}
    answers = read_yaml(path, "re-render it with `copier update`") or {}
    return answers if isinstance(answers, dict) else {}


_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_REPOSITORY = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*")


def split_reference(ref: str) -> tuple[str, str | None]:
    """'host:5000/a/b:tag@sha256:...' -> ('host:5000/a/b', 'tag'); a ':' before the last '/' is a port."""
    name = ref.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, None


def registry_of(repository: str) -> str:
    """The registry host of a repository; Docker's rule: a first part with '.' or ':' or 'localhost'."""
    first, sep, _ = repository.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def project_version(root: Path) -> str:
    """[project].version of pyproject.toml (what pip installs), else the installed package's version."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = None
    path = root / "pyproject.toml"
    if tomllib and path.is_file():
        try:
            version = tomllib.loads(path.read_text()).get("project", {}).get("version")
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from None
        if version:
            return str(version)
    from importlib.metadata import PackageNotFoundError, version

    try:  # installed: the version pip recorded
        return version(__name__.partition(".")[0])
    except PackageNotFoundError:
        return "0+unknown"


def git_revision(root: Path) -> tuple[str, str, bool] | None:
    """(full hash, short hash, dirty) of the checkout holding root; None outside git or before a commit."""

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *cmd], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        full = git("rev-parse", "--verify", "-q", "HEAD")
        short = git("rev-parse", "--short", "HEAD")
        # Untracked files count too (unless git ignores them): they would enter the build context.
        dirty = bool(git("status", "--porcelain", "--", "."))
    except (OSError, subprocess.SubprocessError):
        return None
    return full, short, dirty


def parse_build_args(items: list[str]) -> dict[str, str]:
    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"--build-arg {item!r} must look like KEY=VALUE, e.g. EXTRAS=test,export")
        values[key] = value
    return values


def make_plan(args: argparse.Namespace) -> Plan:
    root = find_root(args.context)
    answers = read_answers(root)
    image = args.image or answers.get("image")
    if not image:
        raise ConfigError(
            f"no image to tag: {root / ANSWERS_FILE} has no `image` answer; pass --image "
            "REGISTRY/NAME[:TAG] or set it with `copier update --data image=registry.example.com/name:tag`"
        )
    source = "--image" if args.image else f"the image answer in {ANSWERS_FILE}"
    repository, answer_tag = split_reference(str(image))
    if not _REPOSITORY.fullmatch(repository) or (answer_tag is not None and not _TAG.fullmatch(answer_tag)):
        raise ConfigError(
            f"image {image!r} ({source}) is not a valid reference; use registry/name:tag, "
            "e.g. registry.example.com/myproject:v1"
        )
    notes = []
    version = project_version(root)
    tags = [version]
    revision = git_revision(root)
    if revision:
        full, short, dirty = revision
        tags.append(f"{short}-dirty" if dirty else short)
        git_commit = f"{full}-dirty" if dirty else full
        if dirty:
            notes.append(
                "the checkout has uncommitted changes: the commit tag is marked -dirty (commit first "
                "for a reproducible tag)"
            )
    else:
        git_commit = "unknown"
        notes.append(f"{root} is not a git checkout with a commit: no commit tag (git init && git commit first)")
    tags.append(answer_tag or "latest")
    for tag in args.extra_tags:
        if not _TAG.fullmatch(tag):
            raise ConfigError(f"--tag {tag!r} is not a valid tag: letters, digits, '_', '.', '-', at most 128")
        tags.append(tag)
    tags = list(dict.fromkeys(tags))  # one push per distinct tag, order kept

    build_args = {"VERSION": version, "GIT_COMMIT": git_commit}
    if args.base_image:
        base, base_source = args.base_image, "--base-image"
        build_args["BASE_IMAGE"] = base
    else:
        base = str(answers.get("base_image") or "(the Dockerfile's default)")
        base_source = "the Dockerfile's default, the base_image answer"
    build_args.update(parse_build_args(args.build_args))
    return Plan(root, repository, registry_of(repository), tags, build_args, base, base_source, notes)


def describe(plan: Plan, action: str, push: bool, args: argparse.Namespace) -> str:
    engine = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock (DOCKER_HOST is unset)"
    lines = [f"image {action} (dry run): nothing is built or pushed", f"  engine:      {engine}"]
    if action == "build":
        lines += [
            f"  context:     {plan.root} (Dockerfile, .dockerignore)",
            f"  base image:  {plan.base_image} ({plan.base_source})",
            "  build args:  " + " ".join(f"{k}={v}" for k, v in plan.build_args.items()),
        ]
    lines.append("  tags:        " + "\n               ".join(plan.refs()))
    if push:
        login = (
            f"--username {args.username} (password not shown)" if args.username else "the engine's login (docker login)"
        )
        lines.append(f"  push to:     {plan.registry}, every tag above; auth: {login}")
    else:
        lines.append("  push:        no (add --push)")
    lines += [f"  note:        {n}" for n in plan.notes]
    return "\n".join(lines)
