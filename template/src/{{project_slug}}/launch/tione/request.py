"""The CreateTrainingTask request of `launch tione`, built from launch/tione/task.yaml and checked before
anything is sent. task.yaml holds the request copier rendered from the answers (mode, image, instances,
CFS/GooseFSx mount, VPC, logs), field names as the API spells them; each submission completes it with a
unique Name and the start command (launch/tione/start-<mode>.sh in the image, with the overrides).

    from .request import TASK_FILE, api_mode, build_request, load_task, request_problems
    task = load_task(project_root() / TASK_FILE)          # {region, request, [endpoint, code_dir]}
    request = build_request(task, api_mode(script), script, None, ["schedule.max_steps=100"])
    mistakes, missing = request_problems(request)        # refused always / refused when submitting

Every field is checked against the SDK's request models (tencentcloud-sdk-python-tione), which would
drop an unknown one silently, and every value against FIELDS, its type and range, when the file is
read: the SDK sends `InstanceNum: two` as it stands, and YAML 1.1 reads an unquoted `on`, `yes` or
`0755` as a boolean or a number, which the API would get in place of the text.
"""

from __future__ import annotations

import re
import shlex
import time
import warnings
from copy import deepcopy
from pathlib import Path

from ...settings.bounds import MAX_NODES, Range
from ...settings.config import ConfigError, project_root
from ...settings.packages import require_package
from ...settings.stored_files import read_yaml

TASK_FILE = Path("launch") / "tione" / "task.yaml"
SDK_INSTALL = "pip install tencentcloud-sdk-python-tione"  # the SDK's distribution is not named as it imports
NAME_PATTERN = re.compile(r"[\w\u4e00-\u9fff][\w\u4e00-\u9fff-]{0,59}")  # the API's rule: 60 characters at most


# The type of every value task.yaml may hold (field names as the API spells them): str, bool, a Range
# for a whole number, a dict for a nested structure, a one-item list for a list of them.
_TEXT_PAIR = {"Name": str, "Value": str}
FIELDS = {
    "region": str,
    "endpoint": str,
    "code_dir": str,
    "request": {
        "Name": str,
        "TiProjectId": str,
        "TrainingMode": str,
        "ChargeType": str,
        "ResourceGroupId": str,
        "ImageInfo": {"ImageType": str, "ImageUrl": str, "RegistryRegion": str, "RegistryId": str, "ImageSecret": dict},
        "ResourceConfigInfos": [
            {
                "Role": str,
                "InstanceNum": Range(1, MAX_NODES),
                "Cpu": Range(1, 10**7),  # 1/1000 cores
                "Memory": Range(1, 10**8),  # MB
                "Gpu": Range(0, 10**5),  # 1/100 GPUs
                "GpuType": str,
                "InstanceType": str,
                "RDMAConfig": {"Enable": bool},
            }
        ],
        "DataSource": str,
        "DataConfigs": [
            {
                "MappingPath": str,
                "DataSourceType": str,
                "CFSSource": {"Id": str, "Path": str},
                "GooseFSSource": {"Id": str, "Type": str, "Path": str},
            }
        ],
        "VpcId": str,
        "SubnetId": str,
        "LogEnable": bool,
        "LogConfig": {"LogsetId": str, "TopicId": str},
        "Envs": [_TEXT_PAIR],
        "Tags": [{"TagKey": str, "TagValue": str}],
        "Remark": str,
    },
}
_KIND = {str: "text (quote it: YAML reads on/yes/off as booleans and 0755 as a number)", bool: "true or false"}


def value_problem(field: str, value, kind) -> str:
    """Why `value` cannot be task.yaml's `field` ("" when it can); a field FIELDS does not list is left
    to unknown_fields, which names it against the SDK's models."""
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            return f"{field} must be a mapping of fields, got {value!r}"
        named = (
            (f"{field}.{name}" if field else name, item, kind[name]) for name, item in value.items() if name in kind
        )
        return next((p for args in named for p in [value_problem(*args)] if p), "")
    if isinstance(kind, list):
        if not isinstance(value, list):
            return f"{field} must be a list, got {value!r}"
        return next(
            (p for i, item in enumerate(value) for p in [value_problem(f"{field}[{i}]", item, kind[0])] if p), ""
        )
    if isinstance(kind, Range):
        if isinstance(value, bool) or not isinstance(value, int) or not kind.holds(value):
            return f"{field} must be a whole number {kind.words()}, got {str(value)[:40]!r}"
        return ""
    if kind is dict or type(value) is kind:  # an empty text is request_problems' (a value to fill in)
        return ""
    return f"{field} must be {_KIND[kind]}, got {value!r}"


def load_task(path: Path) -> dict:
    """task.yaml: {region, request, [endpoint, code_dir]}; ConfigError naming the file and the fix."""
    task = read_yaml(path, "correct that line, or re-render it with `copier update`")
    if not isinstance(task, dict) or not isinstance(task.get("request"), dict):
        raise ConfigError(
            f"{path} must hold `region:` and a `request:` mapping (the CreateTrainingTask fields); "
            "re-render it with `copier update`"
        )
    if not task.get("region"):
        raise ConfigError(
            f"{path}: `region` is empty: set it (e.g. ap-guangzhou), or `copier update --data tione_region=ap-shanghai`"
        )
    problem = value_problem("", task, FIELDS)
    if problem:
        raise ConfigError(f"{path}: {problem} (field names as in TI-ONE's CreateTrainingTask)")
    return task


def unknown_fields(model_name: str, request: dict) -> list[str]:
    """Fields the SDK's model (and the models nested in it) does not know: the SDK warns about them
    ('X fileds are useless.') and would drop them silently."""
    models = require_package(
        "tencentcloud.tione.v20211111.models",
        "tione",
        "launch tione (its request is checked against the SDK)",
        install=SDK_INSTALL,
    )

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


def task_mounts(task) -> list[str]:
    """TI-ONE's mount paths in a task.yaml (its request's DataConfigs)."""
    request = task.get("request") if isinstance(task, dict) else None
    configs = request.get("DataConfigs") if isinstance(request, dict) else None
    paths = [c.get("MappingPath") for c in configs or [] if isinstance(c, dict)]
    return [p for p in paths if isinstance(p, str) and p]
