"""Distributed training project generated from dist-train-template.

Run `python -m <package> --help` (or the console script of the same name) for the commands.
"""

__version__ = "0.1.0"
