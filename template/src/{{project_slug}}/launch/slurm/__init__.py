"""`launch slurm`: platform.py (sbatch of launch/slurm/'s batch script; squeue, sacct, scancel),
partition.py (the partition's nodes from sinfo: whether a batch script's request fits one, for
`launch slurm` and `check`), environment.py (what Slurm tells a node; check's partition verdict). launch/ finds the platform by this package's PLATFORM."""

from .platform import PLATFORM, Slurm

__all__ = ["PLATFORM", "Slurm"]
