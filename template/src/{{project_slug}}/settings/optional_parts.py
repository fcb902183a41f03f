"""The parts a project may be made without, and the one line that says how to add one.

copier writes the chosen model family's folder (models/<family>/; gpt's always, as the family the
project's shared tests train), DeepSpeed's folder (strategies/deepspeed/: its engine, launcher,
pipeline, tensor parallelism and universal checkpoints) only for strategy=deepspeed or a family with
parallel layouts, and each chosen platform's folder (launch/<platform>/). A setting or a command that
needs a part the project was made without stops with one line naming the `copier update` that adds
it; nothing else here imports the parts themselves.

    optional_parts.deepspeed("engine")       # strategies/deepspeed/engine.py, or that one line
    optional_parts.without_family("bert")    # the ConfigError for model.arch=bert in a gpt project

Plain Python, without torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from .stored_files import ConfigError

PACKAGE = __package__.rpartition(".")[0]

# What the template offers: a name outside these is not a missing part but a mistake (said elsewhere).
TEMPLATE_FAMILIES = ("bert", "gpt", "gpt3")
TEMPLATE_PLATFORMS = ("devmachine", "kubeflow", "slurm", "tione")
TEMPLATE_STRATEGIES = ("ddp", "deepspeed", "fsdp")
DEEPSPEED_LAUNCHER = "deepspeed"  # --launcher's name for DeepSpeed's own launcher program (devmachine, slurm)
UPDATE_FIRST = " (commit first; copier merges the update into your edits)"


def has_deepspeed() -> bool:
    return importlib.util.find_spec(f"{PACKAGE}.strategies.deepspeed") is not None


def without_deepspeed(setting: str, key: str | None = "run.strategy") -> ConfigError:
    return ConfigError(
        f"{setting}: this project was made without DeepSpeed; run `copier update --data strategy=deepspeed`"
        + UPDATE_FIRST,
        key=key,
    )


def without_section(name: str) -> ConfigError | None:
    """The line for a config section of a part this project lacks (`deepspeed:`), else None."""
    if name == "deepspeed" and not has_deepspeed():
        return without_deepspeed(f"the {name} section", key=None)
    return None


def without_choice(key: str, value) -> ConfigError | None:
    """The line for a setting that names a part this project lacks (run.strategy=deepspeed), else None."""
    if key == "run.strategy" and value in TEMPLATE_STRATEGIES:
        return without_deepspeed(f"{key}={value}")
    return None


def deepspeed(module: str, setting: str = "run.strategy=deepspeed", key: str | None = "run.strategy") -> ModuleType:
    """strategies/deepspeed/<module>, imported; without_deepspeed(setting) where the project has none."""
    if not has_deepspeed():
        raise without_deepspeed(setting, key)
    return importlib.import_module(f"{PACKAGE}.strategies.deepspeed.{module}")


def deepspeed_if_present(module: str) -> ModuleType | None:
    """strategies/deepspeed/<module>, imported, or None where the project was made without DeepSpeed."""
    return importlib.import_module(f"{PACKAGE}.strategies.deepspeed.{module}") if has_deepspeed() else None


def without_family(name: str) -> ConfigError | None:
    """The line for model.arch=<name> where the template offers that family and this project lacks it."""
    if name not in TEMPLATE_FAMILIES:
        return None
    return ConfigError(
        f"model.arch={name}: this project was made without the {name} family; run "
        f"`copier update --data model={name}`" + UPDATE_FIRST,
        key="model.arch",
    )


def without_platform(name: str, present: list[str]) -> ConfigError | None:
    """The line for `launch <name>` where the template offers that platform and this project lacks it."""
    if name not in TEMPLATE_PLATFORMS:
        return None
    wanted = ", ".join([*present, name])
    return ConfigError(
        f"launch {name}: this project was made without the {name} platform; run "
        f"`copier update --data 'platforms=[{wanted}]'` (list every platform you want)" + UPDATE_FIRST
    )


# --- What the shared code asks of the parts without naming them ----------------------------------

OTHER_LAUNCHERS = (DEEPSPEED_LAUNCHER,)
"""The programs `launch devmachine --launcher` may start the ranks with instead of torchrun."""


def launcher(name: str) -> ModuleType:
    """The module behind `--launcher <name>`, or the one line naming the update that adds it."""
    return deepspeed("launcher", f"--launcher {name}", key=None)


def launchers_present() -> list[ModuleType]:
    """The modules of the other launchers this project holds (their options join `launch devmachine`'s)."""
    return [module for module in (deepspeed_if_present("launcher"),) if module is not None]


def refuse_launcher_options(args) -> None:
    """The options of a launcher this project holds, given while torchrun starts the ranks, would do
    nothing: each launcher refuses its own in one line."""
    for module in launchers_present():
        module.refuse_deepspeed_options(args)


def strategy_packages(strategy: str | None) -> tuple[str, ...]:
    """The packages (import names) run.strategy needs beyond the project's dependencies: what an image
    must hold to train with it."""
    return ("deepspeed",) if strategy == "deepspeed" else ()


def install_line(package: str) -> str | None:
    """How a part's package installs where plain `pip install <name>` is not enough, else None."""
    # DS_BUILD_OPS=0: its ops are built when first used, so installing needs no CUDA toolkit;
    # --no-build-isolation: it builds against the torch installed, not a fresh one.
    return "DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed" if package == "deepspeed" else None


def read_checkpoint_folder(path: Path) -> dict:
    """A checkpoint folder as one dict (shards consolidated, a pipeline's layers joined), read by the
    strategy that writes folders; the one line naming the update that adds it where it is absent."""
    said = f"{path} is a DeepSpeed checkpoint (a folder)"
    pipeline = deepspeed("pipeline", said, key=None)
    if pipeline.is_pipeline_checkpoint(path):
        return pipeline.read_checkpoint(path)
    return deepspeed("engine", said, key=None).read_checkpoint(path)


def checkpoint_folder_state(path: Path) -> dict:
    """A checkpoint folder's run state (step, config, data fingerprint), read before its shards."""
    return deepspeed("engine", f"{path} is a DeepSpeed checkpoint (a folder)", key=None).load_model_states(path)
