"""`launch <platform>`: one command per platform for a job's whole life.

    <package> launch devmachine [--nnodes 2 --node-rank 0 --master-addr 10.0.0.1]   # torchrun here
    <package> launch kubeflow | slurm | tione [--dry-run] [key=value ...]           # submit
    <package> launch <platform> --action status | logs [--follow] | cancel          # the last job
    <package> launch <platform> --action status --id <job id>                        # another job

One module per platform (launch/<platform>.py, beside the project's launch/<platform>/ files), each a
base.Platform; config overrides (key=value) reach `train` on every node.
"""

from __future__ import annotations

import importlib
from argparse import ArgumentParser, Namespace

from ..config import Config, ConfigError
from ..project import project_root
from .base import add_common_arguments, run as run_action

PLATFORMS = {
    "devmachine": "devmachine",
    "kubeflow": "kubeflow",
    "slurm": "slurm",
    "tione": "tione",
}
"""platform -> module of this package; each module's PLATFORM is its base.Platform subclass."""


def platform_class(name: str):
    return importlib.import_module(f"{__name__}.{PLATFORMS[name]}").PLATFORM


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
        q = platforms.add_parser(name, help=f"launch on {name}")
        add_common_arguments(q)
        platform_class(name).add_arguments(q)
        if add_config_args:
            add_config_args(q)


def run(cfg: Config, args: Namespace, package: str) -> int:
    if args.platform != "devmachine":
        require_generated(args.platform)
    return run_action(platform_class(args.platform)(cfg, args, package))
