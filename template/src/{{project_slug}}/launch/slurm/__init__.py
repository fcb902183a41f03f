"""`launch slurm`: platform.py (sbatch of launch/slurm/'s batch script; squeue, sacct, scancel) and
partition.py (the partition's nodes from sinfo: whether a batch script's request fits one, for
`launch slurm` and `check`). launch/ finds the platform by this package's PLATFORM."""

from .platform import PLATFORM, Slurm

__all__ = ["PLATFORM", "Slurm"]
