"""The CreateTrainingTask request of `launch tione`, built from launch/tione/task.yaml and checked before
anything is sent. task.yaml holds the request copier rendered from the answers (mode, image, instances,
CFS/GooseFSx mount, VPC, logs), field names as the API spells them; each submission completes it with a
unique Name and the start command (launch/tione/start-<mode>.sh in the image, with the overrides).

    from .tione_request import TASK_FILE, api_mode, build_request, load_task, request_problems
    task = load_task(project_root() / TASK_FILE)          # {region, request, [endpoint, code_dir]}
    request = build_request(task, api_mode(script), script, None, ["schedule.max_steps=100"])
    mistakes, missing = request_problems(request)        # refused always / refused when submitting

Every field is checked against the SDK's request models (tencentcloud-sdk-python-tione), which would
drop an unknown one silently.
"""

from __future__ import annotations

import re
import shlex
import time
import warnings
from copy import deepcopy
from pathlib import Path

import yaml

from ..settings.config import ConfigError, project_root

TASK_FILE = Path("launch") / "tione" / "task.yaml"
NAME_PATTERN = re.compile(r"[\w\u4e00-\u9fff][\w\u4e00-\u9fff-]{0,59}")  # the API's rule: 60 characters at most


def load_task(path: Path) -> dict:
    """task.yaml: {region, request, [endpoint, code_dir]}; ConfigError naming the file and the fix."""
    try:
        task = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror}); re-render it with `copier update`") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(task, dict) or not isinstance(task.get("request"), dict):
        raise ConfigError(
            f"{path} must hold `region:` and a `request:` mapping (the CreateTrainingTask fields); "
            "re-render it with `copier update`"
        )
    if not task.get("region"):
        raise ConfigError(
            f"{path}: `region` is empty: set it (e.g. ap-guangzhou), or `copier update --data tione_region=ap-shanghai`"
        )
    return task


def unknown_fields(model_name: str, request: dict) -> list[str]:
    """Fields the SDK's model (and the models nested in it) does not know: the SDK warns about them
    ('X fileds are useless.') and would drop them silently."""
    from tencentcloud.tione.v20211111 import models

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(models, model_name)()._deserialize(request)
    found = []
    for warning in caught:
        text = str(warning.message)
        if text.endswith("fileds are useless."):
            found += text.removesuffix(" fileds are useless.").split(",")
    return sorted(found)


def request_problems(request: dict) -> tuple[list[str], list[str]]:
    """(mistakes, values still to fill in) of a request: the first are refused always, the second only
    when submitting (a dry run prints the request with a note)."""
    mistakes = [
        f"unknown field(s) {', '.join(names)}"
        for names in [unknown_fields("CreateTrainingTaskRequest", request)]
        if names
    ]
    if not NAME_PATTERN.fullmatch(str(request.get("Name", ""))):
        mistakes.append(
            f"Name {request.get('Name')!r} must be 1-60 letters, digits, '_' or '-', starting with a "
            "letter or digit (--name)"
        )
    if not request.get("ResourceConfigInfos"):
        mistakes.append("ResourceConfigInfos is empty: the task needs instances")
    missing = []
    for info in request.get("ResourceConfigInfos") or []:
        if not request.get("ResourceGroupId") and not info.get("InstanceType"):
            missing.append(
                f"{info.get('Role', 'WORKER')} instances have no InstanceType and the task no "
                "ResourceGroupId: `copier update --data tione_instance_type=<spec>` (pay as you go) or "
                "--data tione_resource_group=<id> (a prepaid resource group)"
            )
    for config in request.get("DataConfigs") or []:
        source = config.get("CFSSource") or config.get("GooseFSSource") or {}
        if not source.get("Id"):
            missing.append(
                f"the {config.get('DataSourceType', '')} mount at {config.get('MappingPath')} has no Id: "
                "`copier update --data tione_storage_id=<cfs-... or the GooseFSx id>`"
            )
    if (request.get("ImageInfo") or {}).get("ImageType") == "TCR" and not request["ImageInfo"].get("RegistryId"):
        missing.append("ImageInfo.RegistryId is empty: the TCR instance id (tcr-...) of the image's registry")
    return mistakes, missing


def build_request(task: dict, mode: str | None, script: Path, name: str | None, extra_args: list[str]) -> dict:
    """The CreateTrainingTask request: task.yaml's, a unique Name and the start command with the overrides."""
    request = deepcopy(task["request"])
    request["Name"] = name or f"{request.get('Name') or 'train'}-{time.strftime('%Y%m%d-%H%M%S')}"
    code_dir = str(task.get("code_dir") or project_root()).rstrip("/")
    start = shlex.join(["bash", f"{code_dir}/launch/tione/{script.name}", *extra_args])
    request["StartCmdInfo"] = (
        {"PsStartCmd": start, "WorkerStartCmd": start} if mode == "PS_WORKER" else {"StartCmd": start}
    )
    if mode:
        request["TrainingMode"] = mode
    return request


def api_mode(script: Path) -> str | None:
    """TrainingMode of the API for the generated start script; None for Ray, which the API lacks."""
    return {"start-ddp.sh": "DDP", "start-mpi.sh": "MPI", "start-ps-worker.sh": "PS_WORKER"}.get(script.name)
