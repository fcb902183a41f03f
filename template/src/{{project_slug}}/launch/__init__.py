"""`launch <platform>`: one command per platform for a job's whole life.

    <package> launch devmachine [--nnodes 2 --node-rank 0 --master-addr 10.0.0.1]   # torchrun here
    <package> launch kubeflow | slurm | tione [--dry-run] [key=value ...]           # submit
    <package> launch <platform> --action status | logs [--follow] | cancel          # the last job
    <package> launch <platform> --action status --id <job id>                        # another job

One module per platform (launch/<platform>.py, beside the project's launch/<platform>/ files) whose
PLATFORM is a base.Platform: the modules are found by that name, so a new platform is its module
(plus its topology row and a test). Config overrides (key=value) reach `train` on every node.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from argparse import ArgumentParser, Namespace

from ..config import Config, ConfigError
from ..project import project_root
from .base import add_common_arguments, run as run_action

def find_platforms() -> dict:
    """{platform name: its base.Platform class} of every module here that defines PLATFORM."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        platform = getattr(importlib.import_module(f"{__name__}.{module.name}"), "PLATFORM", None)
        if platform is not None:
            found[platform.name] = platform
    return dict(sorted(found.items()))


PLATFORMS = find_platforms()


def require_generated(platform: str) -> None:
    """Launch files exist only for the platforms chosen at generation time."""
    if not (project_root() / "launch" / platform).is_dir():
        raise ConfigError(
            f"this project has no launch/{platform}/: add the platform with "
            f"`copier update --data 'platforms=[..., {platform}]'` (list every platform you want)"
        )


def add_arguments(p: ArgumentParser, add_config_args=None) -> None:
    """`launch <platform>` subcommands with the common options, the platform's own, and the config's."""
    platforms = p.add_subparsers(dest="platform", required=True)
    for name in PLATFORMS:
        summary = (sys.modules[PLATFORMS[name].__module__].__doc__ or name).split("\n\n")[0].replace("\n", " ")
        q = platforms.add_parser(name, help=summary, description=summary)
        add_common_arguments(q)
        PLATFORMS[name].add_arguments(q)
        if add_config_args:
            add_config_args(q)


def run(cfg: Config, args: Namespace, package: str) -> int:
    platform = PLATFORMS[args.platform]
    if platform.needs_launch_files:
        require_generated(args.platform)
    return run_action(platform(cfg, args, package))
