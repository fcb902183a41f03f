"""`launch tione`: being written."""

from __future__ import annotations

from argparse import ArgumentParser, Namespace

from .config import Config, ConfigError


def add_arguments(p: ArgumentParser) -> None:
    pass


def launch(args: Namespace, cfg: Config, package: str) -> int:
    raise ConfigError("launch tione is not available yet")
