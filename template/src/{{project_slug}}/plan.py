"""`plan`: being written."""

from __future__ import annotations

import argparse

from .config import Config, ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(cfg: Config, args: argparse.Namespace) -> int:
    raise ConfigError("plan is not available yet")
