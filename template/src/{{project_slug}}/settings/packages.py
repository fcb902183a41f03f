"""The packages a project installs only for some of its uses (pyproject.toml's extras: export,
image, and those of the strategy and platforms the project was made with), and those of its own dependencies imported only when a
setting asks (torchao for run.fp8), each imported through require_package: a missing or broken one
is one line naming what needs it, the extra and the package, never a ModuleNotFoundError from deep
inside a command (a dry run included). Such a failure is one a restart cannot fix (a ConfigError).

    transformers = require_package("transformers", "export", "transformers models and tokenizer folders")
    require_package("docker", "image", "image (the docker SDK talks to the engine)")
    require_package("torchao.float8", "", "run.fp8=rowwise", "or set run.fp8=off")  # "": not an extra

Plain Python, without torch: the launchers, the image builder, the strategies and the models all
ask it, before anything heavier is imported.
"""

from __future__ import annotations

import importlib
import os
import traceback
from pathlib import Path
from types import ModuleType

from .bounds import shown
from .config import ConfigError


def require_package(module: str, extra: str, purpose: str, alternative: str = "", install: str = "") -> ModuleType:
    """The imported module, or a ConfigError: `purpose` needs it; install the project's `extra` (""
    for a package of the project's own dependencies) or the package alone (`install`: the command,
    where the distribution is not the module's name or plain pip is not enough); `alternative`, if
    given, what works without it. A package that is there but fails as it is imported (built for
    another torch, a version without the module) is said in the same line, with its own error."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        installed = exc.name != top  # it is there, but a module of it or one it imports is not
        why = f"which fails to import here ({exc.msg})" if installed else f"which is not installed here ({exc.msg})"
    except Exception as exc:  # whatever its import raises, the line names it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        why = f"which fails to import here ({type(exc).__name__}: {first})"
    from .optional_parts import install_line  # it imports this module

    how = install or install_line(top) or f"pip install {top}"
    project = f"`pip install -e '.[{extra}]'`" if extra else "`pip install -e .`"
    instead = f"; {alternative}" if alternative else ""
    raise ConfigError(f"{purpose} needs the {top} package, {why}: {project} in the project, or `{how}`{instead}")


def import_failure(exc: Exception, path: Path) -> str:
    """Where and why importing the project's file `path` failed (a family's descriptor, a platform's
    module, as a user's edit left it): the line of a SyntaxError, else the deepest line of the file's
    folder that the error passed through, with the error's first words."""
    if isinstance(exc, SyntaxError):
        where = "" if exc.filename == str(path) else f"{exc.filename}, "
        return f"{where}line {exc.lineno}: {type(exc).__name__}: {exc.msg}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(path.parent))]
    where = ""
    if frames:
        where = ("" if frames[-1].filename == str(path) else f"{frames[-1].filename}, ") + f"line {frames[-1].lineno}: "
    text = " ".join(str(exc).split())
    return f"{where}{type(exc).__name__}" + (f": {shown(text, quoted=False)}" if text else "")


def import_transformers(purpose: str = "transformers models and tokenizers"):
    """transformers, imported with the hub switched off, or a ConfigError saying how to install it."""
    # Nothing in this project downloads: a missing local file must fail, not hang on a firewall.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    transformers = require_package("transformers", "export", purpose)
    transformers.logging.set_verbosity_error()  # load reports of every rank would drown the metrics
    return transformers


def platform_modules(module: str) -> list[ModuleType]:
    """launch/<platform>/<module>.py of each platform folder the project holds, imported (the lower
    layers ask the platforms present this way: topology their node variables)."""
    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "launch").glob(f"*/{module}.py")):
        try:
            found.append(
                importlib.import_module(f"{__package__.rpartition('.')[0]}.launch.{path.parent.name}.{module}")
            )
        except Exception as exc:  # a user's edit: whatever its import raises is named with its file
            raise ConfigError(f"{path} cannot be loaded: {import_failure(exc, path)}; fix it") from None
    return found
