"""`python -m <package>` runs the same command-line interface as the console script."""

from .cli import entry

entry()
