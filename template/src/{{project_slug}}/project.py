"""Where the project is: its root folder (config/, launch/, src/) and paths relative to it.

from .project import project_root, under_root
project_root() / "launch" / "slurm"        # the generated launch files
under_root(cfg.run.output_dir)             # a relative run.output_dir, from the project root
"""

from __future__ import annotations

from pathlib import Path


def project_root() -> Path:
    """The folder holding config/ (the working directory in the image, else the source checkout)."""
    here = Path.cwd()
    return here if (here / "config").is_dir() else Path(__file__).resolve().parents[2]


def under_root(path: str | Path) -> Path:
    """An absolute path as it is; a relative one (run.output_dir=runs) from the project root."""
    path = Path(path)
    return path if path.is_absolute() else project_root() / path
