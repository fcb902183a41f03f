"""`launch <platform>`: one command per platform for a job's whole life.

    <package> launch devmachine [--nnodes 2 --node-rank 0 --master-addr 10.0.0.1]   # torchrun here
    <package> launch <platform> [--dry-run] [key=value ...]                         # submit
    <package> launch <platform> --action status | logs [--follow] | cancel          # the last job
    <package> launch <platform> --action status --id <job id>                        # another job

One folder per platform (launch/<platform>/ here, beside the project's launch/<platform>/ files),
written only for the platforms the project was made with; its platform.py defines PLATFORM, a
base.Platform: platforms are found by that name, so a new platform is its folder (plus its topology
row). A platform the template offers and the project lacks is one line naming the `copier update`.
Config overrides (key=value) reach `train` on every node. A module that cannot be imported (an edit
left a syntax error) is named by its file and line by `launch <its name>`; the other platforms go on
without it. A platform folder may also bring commands of its own (COMMANDS in its __init__.py,
{command: (its module in the folder, one-line help)}), which cli.py offers beside the others.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path

from ..settings.config import Config, ConfigError, add_config_arguments, project_root
from ..settings.optional_parts import TEMPLATE_PLATFORMS, without_platform
from ..settings.packages import import_failure
from .base import add_common_arguments
from .base import run as run_action

PACKAGE = __package__.rpartition(".")[0]  # the project's package: what every node runs


# Module name -> why it cannot be imported (a user's edit): one line naming its file, said by
# `launch <that name>`; the other platforms go on without it.
UNLOADABLE: dict[str, str] = {}


def platform_folders() -> list[str]:
    """The platform folders here (base.py, jobs.py ...: what the platforms share, are modules)."""
    return [module.name for module in pkgutil.iter_modules(__path__) if module.ispkg]


@functools.cache
def platforms() -> dict:
    """{platform name: its base.Platform class} of every folder here whose platform.py defines PLATFORM;
    found when first asked, so that importing this package (cli.py does) costs no platform's imports."""
    found = {}
    for folder in platform_folders():
        path = Path(__path__[0]) / folder / "platform.py"
        try:  # its platform.py alone: a broken one stops `launch <it>`, not its folder's other modules
            imported = importlib.import_module(f"{__name__}.{folder}.platform")
        except Exception as exc:  # whatever its import raises is named with its file
            UNLOADABLE[folder] = f"{path} cannot be loaded: {import_failure(exc, path)}; fix it"
            continue
        platform = getattr(imported, "PLATFORM", None)
        if platform is not None:
            found[platform.name] = platform
    return dict(sorted(found.items()))


def platform_commands() -> dict[str, tuple[str, str]]:
    """{command: (its module under the package, one-line help)} the platform folders bring (COMMANDS
    in their __init__.py). A folder whose __init__.py cannot be imported brings none; `launch <it>`
    names its failure."""
    found = {}
    for folder in platform_folders():
        try:
            imported = importlib.import_module(f"{__name__}.{folder}")
        except Exception:
            continue
        for command, (module, summary) in getattr(imported, "COMMANDS", {}).items():
            found[command] = (f"launch.{folder}.{module}", summary)
    return found


def generated(name: str) -> bool:
    return not platforms()[name].needs_launch_files or (project_root() / "launch" / name).is_dir()


def require_generated(platform: str) -> None:
    """Launch files exist only for the platforms chosen at generation time."""
    if not generated(platform):
        raise ConfigError(
            f"this project has no launch/{platform}/: add the platform with "
            f"`copier update --data 'platforms=[..., {platform}]'` (list every platform you want)"
        )


def add_arguments(p: ArgumentParser) -> None:
    """`launch <platform>` subcommands with the common options, the platform's own, and the config's.
    Help lists the project's platforms; another one still parses, to say how to add it."""
    found = platforms()
    shown = [name for name in found if generated(name)]
    subparsers = p.add_subparsers(dest="platform", required=True, metavar="{" + ",".join(shown) + "}")
    for name in found:
        summary = (sys.modules[found[name].__module__].__doc__ or name).split("\n\n")[0].replace("\n", " ")
        q = subparsers.add_parser(name, **({"help": summary} if name in shown else {}), description=summary)
        add_common_arguments(q)
        found[name].add_arguments(q)
        add_config_arguments(q)
    absent = {name: f"made without {name}" for name in TEMPLATE_PLATFORMS if name not in found}
    for name, why in {**absent, **UNLOADABLE}.items():  # parsed, so that `run` says why it cannot run
        if name in found:
            continue
        q = subparsers.add_parser(name, description=why)
        add_common_arguments(q)
        add_config_arguments(q)


def run(cfg: Config, args: Namespace) -> int:
    found = platforms()
    if args.platform in UNLOADABLE and args.platform not in found:
        raise ConfigError(UNLOADABLE[args.platform])
    if args.platform not in found:
        raise without_platform(args.platform, [name for name in found if generated(name)])
    platform = found[args.platform]
    require_generated(args.platform)
    return run_action(platform(cfg, args, PACKAGE))
