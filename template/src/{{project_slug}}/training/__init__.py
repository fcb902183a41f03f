"""The training loop's parts, one module per job (DESIGN: the loop, checkpoints, faults, preemption,
precision and metrics gather here as they move out of the package's top level)."""
