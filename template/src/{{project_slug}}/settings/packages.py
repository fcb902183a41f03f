"""The packages a project installs only for some of its uses (pyproject.toml's extras: deepspeed,
bert, export, image, kubeflow, ray, tione), each imported through require_package: a missing one is
one line naming what needs it, the extra and the package, never a ModuleNotFoundError from deep
inside a command (a dry run included). Such a failure is one a restart cannot fix (a ConfigError).

    transformers = require_package("transformers", "bert", "BERT models and vocab.txt tokenizers")
    require_package("kubernetes", "kubeflow", "launch kubeflow", "or print the manifest with --dry-run")

Plain Python, without torch: the launchers, the image builder, the strategies and the models all
ask it, before anything heavier is imported.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .config import ConfigError

# The distribution to install where it is not the module's name, and how where plain pip is not enough.
INSTALL = {
    "tencentcloud": "pip install tencentcloud-sdk-python-tione",
    "deepspeed": "DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed",
    "ray": "pip install 'ray[train]'",
}


def require_package(module: str, extra: str, purpose: str, alternative: str = "") -> ModuleType:
    """The imported module, or a ConfigError: `purpose` needs it; install the project's `extra` (or
    the package alone); `alternative`, if given, what works without it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        how = INSTALL.get(top, f"pip install {top}")
        instead = f"; {alternative}" if alternative else ""
        raise ConfigError(
            f"{purpose} needs the {top} package, which is not installed here ({exc.msg}): "
            f"`pip install -e '.[{extra}]'` in the project, or `{how}`{instead}"
        ) from None
