"""What to enter in the TI-ONE console: the fallback of `launch tione` for users without API access,
and for the Ray mode, which TI-ONE's API does not offer.

    <package> launch tione --console                        # the console settings and the start command
    <package> launch tione --console schedule.max_steps=100 # plus the start command carrying these overrides

The settings are the block between the console-settings markers of launch/tione/README.md, which
copier rendered from the same answers, so the README and this command never disagree.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ...settings.config import ConfigError

START = "bash /opt/ml/code/launch/tione/"
BEGIN, END = "<!-- console-settings:start -->", "<!-- console-settings:end -->"


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


def print_console_settings(launch_dir: Path, script: Path, overrides: list[str]) -> None:
    print(console_settings(launch_dir / "README.md"))
    if overrides:
        print(f"\n  Start command with these overrides: {START}{script.name} {shlex.join(overrides)}")
