"""Start a node from the project's copy on shared storage in a ready-made image (any image with PyTorch).

    python <copy>/src/<package>/cluster/ready_image.py node [args ...]      # check, then `python -m <package> node ...`
    python <copy>/src/<package>/cluster/ready_image.py --check [args ...]   # check only (exit 1 with one line)

`launch <platform> --code-from-storage` copies the project to <shared storage>/<package>/code/
<version> (launch/code_copy.py) and makes this file the job's entry, run by path: the package is not
installed in the image, so nothing of it can be imported before this puts <copy>/src first on
PYTHONPATH (the processes started later inherit it) and enters the copy, where config/ lies.
Then it checks that this Python has what the project needs, and fails in one line naming what the
image lacks: the pyproject's dependencies (torch first), the packages of the strategy the config
trains with (settings/optional_parts.py's strategy_packages), and NCCL where a GPU is visible. Standard library only, until the check has passed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

COPY = Path(__file__).resolve().parents[3]  # <copy>/src/<package>/cluster/ready_image.py
PACKAGE = Path(__file__).resolve().parents[1].name
FALLBACK_NEEDS = ["torch", "numpy", "pyyaml"]  # what `node` imports first, where pyproject cannot be read


def declared_dependencies(pyproject: Path) -> list[str]:
    """The distribution names of [project] dependencies (tomllib, Python 3.11+; older: the fallback)."""
    try:
        import tomllib
    except ImportError:
        return FALLBACK_NEEDS
    try:
        specs = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    except (OSError, KeyError, ValueError):
        return FALLBACK_NEEDS
    return [re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec).group(0) for spec in specs if spec.strip()]


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def strategy_of(node_args: list[str]) -> str | None:
    """run.strategy of the config the node will train with (--config and key=value overrides); None
    when that config does not load (`node` then says why, in its words)."""
    config = importlib.import_module(f"{PACKAGE}.settings.config")
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    known, rest = parser.parse_known_args(node_args)
    try:
        return config.load_config(known.config, [a for a in rest if "=" in a and not a.startswith("-")]).run.strategy
    except config.ConfigError:
        return None


def image_problem(node_args: list[str]) -> str | None:
    """What this Python lacks to run the project's node start; None when it has everything."""
    missing = [name for name in declared_dependencies(COPY / "pyproject.toml") if not installed(name)]
    if missing:
        return f"lacks {', '.join(missing)} (the project's dependencies, pyproject.toml)"
    strategy = strategy_of(node_args)
    parts = importlib.import_module(f"{PACKAGE}.settings.optional_parts")
    lacking = [name for name in parts.strategy_packages(strategy) if importlib.util.find_spec(name) is None]
    if lacking:
        return f"lacks {', '.join(lacking)} (run.strategy is {strategy})"
    import torch

    if torch.cuda.is_available() and not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return f"has GPUs but its torch {torch.__version__} was built without NCCL"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check_only = not argv or argv[0] == "--check"
    if check_only:
        argv = argv[1:]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(COPY / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path[0] = str(COPY / "src")  # not this file's folder, whose module names could hide others
    os.chdir(COPY)
    problem = image_problem(argv)
    if problem:
        # One write, newline included: print() writes the newline apart when stderr is unbuffered, and
        # the scheduler's own lines, in the same file, can land between the two.
        sys.stderr.write(
            f"error: the image's Python ({sys.executable}) {problem}: use an image that has them, or the "
            f"project's own image (code_from=image); code from {COPY}\n"
        )
        sys.stderr.flush()
        return 1
    if check_only:
        print(f"image OK for {COPY}")
        return 0
    cmd = [sys.executable, "-m", PACKAGE, *argv]
    os.execv(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
