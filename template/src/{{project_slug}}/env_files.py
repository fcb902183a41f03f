"""KEY=VALUE files (config/nccl.env, config/nccl-debug.env), read the way shells and env_file do.

from .env_files import read_env_file
read_env_file(project_root() / "config" / "nccl.env")   # {"NCCL_DEBUG": "WARN", ...}
"""

from __future__ import annotations

from pathlib import Path


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines; '#' starts a comment; blank lines are skipped; a missing file is empty."""
    values = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip()] = value.strip().strip("'\"")
    return values
