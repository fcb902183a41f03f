"""`launch slurm`: platform.py (sbatch of launch/slurm/'s batch script; squeue, sacct, scancel),
partition.py (the partition's nodes from sinfo: whether a batch script's request fits one),
environment.py (what Slurm tells a node; `check`'s partition verdict on a login node)."""
