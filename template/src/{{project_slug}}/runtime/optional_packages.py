"""The packages a project installs only for some of its uses (pyproject.toml's extras), each imported
through require(): a missing one is one line naming what needs it and how to install it, never a
ModuleNotFoundError from deep inside a command (a dry run included).

    transformers = require("transformers", "bert", "BERT models and vocab.txt tokenizers")
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..settings.config import ConfigError

# The distribution to install where it is not the module's name, and how where plain pip is not enough.
INSTALL = {
    "tencentcloud": "pip install tencentcloud-sdk-python-tione",
    "deepspeed": "DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed",
    "ray": "pip install 'ray[train]'",
}


def require(module: str, extra: str, purpose: str, alternative: str = "") -> ModuleType:
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
