"""`launch tione`: platform.py (the API client, the actions, the Platform), request.py (the
CreateTrainingTask request from launch/tione/task.yaml, checked) and console.py (the console settings).
launch/ finds the platform by this package's PLATFORM."""

from .platform import PLATFORM, Tione

__all__ = ["PLATFORM", "Tione"]
