"""`launch tione`: what to enter in the TI-ONE console. TI-ONE's task-based training has no API this
project uses: a task is created in the console, and its start command is the script generated for
the chosen mode (launch/tione/start-<mode>.sh), which TI-ONE runs on the nodes.

    <package> launch tione                        # the console settings and the start command
    <package> launch tione --dry-run              # the same (nothing is ever submitted)
    <package> launch tione schedule.max_steps=100 # plus the start command carrying these overrides

The settings are the block between the console-settings markers of launch/tione/README.md, which
copier rendered from the same answers, so the README and this command never disagree. Inside a
TI-ONE task (its variables set) this command refuses and names the start script to use instead.
"""

from __future__ import annotations

import os
import re
import shlex
from argparse import ArgumentParser, Namespace
from pathlib import Path

from .config import Config, ConfigError
from .node import project_root
from .topology import PLATFORMS

START = "bash /opt/ml/code/launch/tione/"
BEGIN, END = "<!-- console-settings:start -->", "<!-- console-settings:end -->"


def add_arguments(p: ArgumentParser) -> None:
    """No options of its own: --dry-run and config overrides come from the CLI."""


def start_script(launch_dir: Path) -> Path:
    """The one start-<mode>.sh copier generated for the chosen tione_mode."""
    found = sorted(launch_dir.glob("start-*.sh"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ConfigError(
            f"{launch_dir} should hold exactly one start-<mode>.sh, found {names}; re-render it with "
            "`copier update --data tione_mode=ddp` (or mpi, ray, ps-worker)"
        )
    return found[0]


def console_settings(readme: Path) -> str:
    """The settings block of launch/tione/README.md, without its markers."""
    try:
        text = readme.read_text()
    except OSError as exc:
        raise ConfigError(f"{readme} cannot be read ({exc.strerror}); re-render it with `copier update`") from None
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, re.S)
    if not match:
        raise ConfigError(f"{readme} has no {BEGIN} ... {END} block; re-render it with `copier update`")
    return match.group(1).rstrip()


def tione_variables(env=os.environ) -> list[str]:
    """The TI-ONE variables set here (non-empty when running inside a TI-ONE task)."""
    return sorted({v for p in PLATFORMS if p.name.startswith("tione") and p.matches(env) for v in p.signature})


def launch(args: Namespace, cfg: Config, package: str) -> int:
    launch_dir = project_root() / "launch" / "tione"
    script = start_script(launch_dir)
    inside = tione_variables()
    if inside:
        command = shlex.join(["bash", str(script), *args.overrides])
        raise ConfigError(
            f"this is a TI-ONE task ({', '.join(inside)} set): `launch tione` only prints console settings. "
            f"Make the task's start command `{command}`"
        )
    print(console_settings(launch_dir / "README.md"))
    if args.overrides:
        print(f"\n  Start command with these overrides: {START}{script.name} {shlex.join(args.overrides)}")
    return 0
