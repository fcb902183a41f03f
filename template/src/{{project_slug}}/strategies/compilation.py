"""Whether a strategy compiles the model, and what the run's first line says of it.

Every strategy compiles on CUDA: DDP the module before wrapping it, DeepSpeed its engine's module,
the pipeline each layer of its stage (the schedule between them stays eager). CPU runs stay eager:
they are the tests' runs, and Inductor's C++ build would cost each process minutes.
"""

from __future__ import annotations

from ..config import Config


def compiled(cfg: Config, device) -> tuple[bool, str]:
    if not cfg.run.compile:
        return False, "eager (run.compile=false)"
    if device.type != "cuda":
        return False, f"eager on {device.type} (run.compile applies on CUDA)"
    return True, "compiled"
