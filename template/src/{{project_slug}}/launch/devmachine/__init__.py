"""`launch devmachine`: torchrun on this machine, or on several started by hand (platform.py).
launch/ finds the platform by this package's PLATFORM."""

from .platform import PLATFORM, DevMachine

__all__ = ["PLATFORM", "DevMachine"]
