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

from .config import ConfigError
from .packages import import_failure

PACKAGE = __package__.rpartition(".")[0]

# What the template offers: a name outside these is not a missing part but a mistake (said elsewhere).
TEMPLATE_FAMILIES = ("bert", "gpt", "gpt3")
TEMPLATE_PLATFORMS = ("devmachine", "kubeflow", "slurm", "tione")
TEMPLATE_STRATEGIES = ("ddp", "deepspeed")
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


def deepspeed(module: str, setting: str = "run.strategy=deepspeed", key: str | None = "run.strategy") -> ModuleType:
    """strategies/deepspeed/<module>, imported; without_deepspeed(setting) where the project has none."""
    if not has_deepspeed():
        raise without_deepspeed(setting, key)
    return importlib.import_module(f"{PACKAGE}.strategies.deepspeed.{module}")


def deepspeed_if_present(module: str) -> ModuleType | None:
    """strategies/deepspeed/<module>, imported, or None where the project was made without DeepSpeed."""
    return importlib.import_module(f"{PACKAGE}.strategies.deepspeed.{module}") if has_deepspeed() else None


def platform_modules(module: str) -> list[ModuleType]:
    """launch/<platform>/<module>.py of each platform folder the project holds, imported (the lower
    layers ask the platforms present this way: topology their node variables)."""
    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "launch").glob(f"*/{module}.py")):
        try:
            found.append(importlib.import_module(f"{PACKAGE}.launch.{path.parent.name}.{module}"))
        except Exception as exc:  # a user's edit: whatever its import raises is named with its file
            raise ConfigError(f"{path} cannot be loaded: {import_failure(exc, path)}; fix it") from None
    return found


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
