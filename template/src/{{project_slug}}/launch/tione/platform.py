"""`launch tione`: TI-ONE task-based training through Tencent Cloud's API (CreateTrainingTask,
DescribeTrainingTask, DescribeLogs, StopTrainingTask; API version 2021-11-11, the official SDK).

    <package> launch tione                                   # create the task from launch/tione/task.yaml
    <package> launch tione --dry-run                         # the CreateTrainingTask request as JSON, nothing else
    <package> launch tione schedule.max_steps=100            # overrides ride on the start command
    <package> launch tione --action status                   # state, instances, runtime, failure reason
    <package> launch tione --action logs [--follow]          # the task's log lines (DescribeLogs, paged)
    <package> launch tione --action cancel                   # StopTrainingTask: SIGTERM, the ranks save
    <package> launch tione --console                         # no API access: what to type into the console

launch/tione/task.yaml holds the request copier rendered from the answers; request.py completes
it for each submission (a unique Name, the start command with the overrides) and checks every field
against the SDK's request models before anything is sent; this module holds the API client and the
actions. The Ray mode has no API equivalent: `launch tione` prints the console settings for it instead
(console.py).

Credentials come from the SDK's usual places, never from the project: TENCENTCLOUD_SECRET_ID and
TENCENTCLOUD_SECRET_KEY (and TENCENTCLOUD_SESSION_TOKEN for temporary keys), else the [default]
profile of ~/.tencentcloud/credentials. `pip install tencentcloud-sdk-python-tione` (or the project's
`[tione]` extra) installs the SDK.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import sys
import time
from argparse import ArgumentParser
from datetime import datetime, timedelta, timezone
from pathlib import Path

from ...planning import storage_paths
from ...runtime import process_exit
from ...settings.bounds import HOST, text_type
from ...settings.config import ConfigError, project_root
from ...settings.packages import require_package
from ...tracking import credentials as tracker_credentials
from .. import code_copy, job_history, jobs
from ..base import Platform
from ..jobs import Job
from .console import print_console_settings, start_script
from .environment import tione_variables
from .request import (
    SDK_INSTALL,
    TASK_FILE,
    api_mode,
    build_request,
    load_task,
    request_problems,
    task_mounts,
    unknown_fields,
)

# TI-ONE's task states (DescribeTrainingTask Status) and what they mean here.
STATES = {
    "SUBMITTING": "queued",
    "STARTING": "starting",
    "RUNNING": "running",
    "STOPPING": "stopping",
    "STOPPED": "stopped",
    "FAILED": "failed",
    "SUCCEED": "succeeded",
    "SUBMIT_FAILED": "submission failed",
}
ACTIVE = {"SUBMITTING", "STARTING", "RUNNING", "STOPPING"}
# The error codes (tione 2021-11-11's errorcodes) of a task the API does not have (any more).
NOT_FOUND = ("ResourceNotFound", "FailedOperation.RecordNotFound")


class TaskNotFound(ConfigError):
    """The API has no task of that id: deleted, or of another region or project."""


POLL_SECONDS = 5
api_endpoint = text_type(  # a host, with a scheme and a port for a local test endpoint
    re.compile(r"(https?://)?(" + HOST.pattern + r")(:[0-9]{1,5})?/?"),
    "a host name, or http://HOST:PORT for a local endpoint, e.g. tione.tencentcloudapi.com",
)


def add_arguments(p: ArgumentParser) -> None:
    """TI-ONE's own options (the verbs and --name/--id/--follow/--dry-run are common to every platform)."""
    p.add_argument(
        "--console",
        action="store_true",
        help="print the console settings instead of calling the API (no API access, or to compare)",
    )
    p.add_argument(
        "--endpoint",
        type=api_endpoint,
        default=os.environ.get("TENCENTCLOUD_TIONE_ENDPOINT"),
        help="API endpoint, e.g. tione.internal.tencentcloudapi.com inside a VPC (default: the task "
        "file's, else the public one; http://HOST:PORT for a local test endpoint)",
    )
    p.add_argument("--pod", help="logs: only this pod's lines (default: every pod of the task)")
    code_copy.add_arguments(p)


# --- The API ------------------------------------------------------------------------------------------


CREDENTIAL_VARIABLES = ("TENCENTCLOUD_SECRET_ID", "TENCENTCLOUD_SECRET_KEY", "TENCENTCLOUD_SESSION_TOKEN")


def credentials():
    """The SDK's credentials from the environment, else from the profile file; ConfigError naming both.
    A variable set to blanks is refused: the SDK would sign with it and the API answer AuthFailure."""
    blank = [name for name in CREDENTIAL_VARIABLES if name in os.environ and not os.environ[name].strip()]
    if blank:
        raise ConfigError(
            f"{blank[0]} is set but blank: export the key of an API key (CAM console) there, or unset it to use "
            "~/.tencentcloud/credentials"
        )
    credential = require_package(
        "tencentcloud.common.credential",
        "tione",
        "launch tione",
        "without API access, `launch tione --console` prints the console settings",
        install=SDK_INSTALL,
    )
    for source in (credential.EnvironmentVariableCredential(), credential.ProfileCredential()):
        try:
            found = source.get_credential()
        except (AttributeError, KeyError, ValueError, configparser.Error) as exc:  # a profile file it cannot read
            reason = str(exc).splitlines()[0].rstrip(".")
            raise ConfigError(
                f"~/.tencentcloud/credentials cannot be used ({type(exc).__name__}: {reason}): it needs a "
                "[default] section with secret_id = ... and secret_key = ..., or export "
                "TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY"
            ) from None
        if found is not None and not (str(found.secret_id).strip() and str(found.secret_key).strip()):
            raise ConfigError(
                "~/.tencentcloud/credentials: secret_id or secret_key is blank; write the API key's values there"
            )
        if found is not None:
            token = os.environ.get("TENCENTCLOUD_SESSION_TOKEN")
            return credential.Credential(found.secret_id, found.secret_key, token) if token else found
    raise ConfigError(
        "no Tencent Cloud credentials: export TENCENTCLOUD_SECRET_ID and TENCENTCLOUD_SECRET_KEY (an API key of "
        "the CAM console, with TI-ONE permissions), or write them to ~/.tencentcloud/credentials ([default] "
        "secret_id = ..., secret_key = ...). Never into the project or the image"
    )


def api_client(region: str, endpoint: str | None):
    found = credentials()  # first: it names the SDK's install command when the SDK is missing
    from tencentcloud.common.profile.client_profile import ClientProfile
    from tencentcloud.common.profile.http_profile import HttpProfile
    from tencentcloud.tione.v20211111 import tione_client

    http = HttpProfile(reqTimeout=30)
    if endpoint:
        scheme, sep, host = endpoint.partition("://")
        http.scheme, http.endpoint = (scheme, host) if sep else ("https", endpoint)
    return tione_client.TioneClient(found, region, ClientProfile(httpProfile=http))


class Api:
    """TI-ONE's four calls; an API error becomes one line with its code, message and request id."""

    def __init__(self, region: str, endpoint: str | None):
        self.region, self.client = region, api_client(region, endpoint)

    def call(self, action: str, fields: dict):
        from tencentcloud.common.exception.tencent_cloud_sdk_exception import TencentCloudSDKException
        from tencentcloud.tione.v20211111 import models

        assert not unknown_fields(f"{action}Request", fields), (action, fields)  # ours: the SDK would drop them
        request = getattr(models, f"{action}Request")()
        request._deserialize(fields)
        try:
            return getattr(self.client, action)(request)
        except TencentCloudSDKException as exc:
            code, message, request_id = exc.get_code(), exc.get_message(), exc.get_request_id()
            if code == "ClientNetworkError":
                raise ConfigError(
                    f"cannot reach TI-ONE's API in {self.region} to {action}: {message}; check the "
                    "network (or --endpoint)"
                ) from None
            fix = " (the secret id/key are wrong or expired)" if code and code.startswith("AuthFailure") else ""
            raise (TaskNotFound if code in NOT_FOUND else ConfigError)(
                f"TI-ONE {action} failed: {code}: {message}{fix}"
                + (f" (request id {request_id})" if request_id else "")
            ) from None


def instant(timestamp: str) -> datetime:
    """An RFC 3339 time stamp of the API (Z or an offset) as an aware datetime, to compare them."""
    moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_from_copy(
    task: dict, request: dict, copy: Path, image: str | None, package: str, extra_args: list[str]
) -> None:
    """Every start command checks the image first (the copy's node start), then runs the copy's start
    script; the image is the ready-made one."""
    check = shlex.join(["python", code_copy.entry(copy, package), "--check", *extra_args])
    info = request["StartCmdInfo"]
    for key, start in info.items():
        info[key] = f"{check} && {start}"
    if image:
        request["ImageInfo"] = {"ImageType": image_type(image), "ImageUrl": image}
        if image_type(image) == "TCR":
            request["ImageInfo"].update(RegistryRegion=task["region"], RegistryId="")  # the TCR instance: fill in


def image_type(image: str) -> str:
    """ImageInfo.ImageType: CCR and TCR are Tencent's registries (as task.yaml decides), others CUSTOM."""
    registry = image.split("/")[0]
    if registry == "ccr.ccs.tencentyun.com":
        return "CCR"
    return "TCR" if registry.endswith(".tencentcloudcr.com") else "CUSTOM"


def state_words(detail) -> str:
    """A task's state as a record keeps it: RUNNING, or FAILED with its reason."""
    return (detail.Status or "?") + (f" ({detail.FailureReason})" if detail.FailureReason else "")


class Tione(Platform):
    name = "tione"
    action_options = {"pod": ("--pod", ("logs",))}
    extra_fields = {"region": str, "endpoint": str, "project": str, "mode": (str, None), **job_history.RUN_FIELDS}
    add_arguments = staticmethod(add_arguments)

    @property
    def launch_dir(self) -> Path:
        return project_root() / "launch" / "tione"

    def _request(self) -> tuple[dict, dict, Path, Path | None]:
        """task.yaml, the request to send, the start script, and the project's copy the task runs
        (None: the image's code)."""
        task_path = project_root() / TASK_FILE
        task = load_task(task_path)
        script = start_script(self.launch_dir)
        extra = (["--config", self.args.config] if self.args.config else []) + list(self.args.overrides)
        from_storage, image = code_copy.ready_image(self.args)
        copy = code_copy.copy_project(self.cfg, dry_run=True) if from_storage else None  # where it goes
        mounts = task_mounts(task)
        storage_paths.require_on_storage(self.cfg, mounts, f"{task_path}'s request.DataConfigs", copy)
        if copy is not None:
            storage_paths.require_writable_folder("the project's copy", copy.parent)
            copy = code_copy.copy_project(self.cfg, dry_run=self.args.dry_run)
            task["code_dir"] = str(copy)
        request = build_request(task, api_mode(script), script, self.args.name, extra)
        request["Envs"] = tracker_credentials.with_credentials(request.get("Envs") or [], os.environ)
        if copy is not None:
            run_from_copy(task, request, copy, image, self.package, extra)
        mistakes, missing = request_problems(request)
        if mistakes or (missing and not self.args.dry_run):
            raise ConfigError(
                f"{task_path}: " + "; ".join(mistakes or missing) + " (field names as in TI-ONE's CreateTrainingTask)"
            )
        for line in missing:
            print(f"note: not ready to submit: {line}", file=sys.stderr)
        if copy is not None and self.args.dry_run:
            print(f"note: submitting copies the project to {copy}", file=sys.stderr)
        return task, request, script, copy

    def _refuse_inside_task(self, script: Path) -> None:
        inside = tione_variables(os.environ)
        if inside:
            command = shlex.join(["bash", str(script), *self.args.overrides])
            raise ConfigError(
                f"this is a TI-ONE task ({', '.join(inside)} set): here the start command runs, not "
                f"`launch tione`. Make the task's start command `{command}`"
            )

    def dry_run(self) -> int:
        if self.args.console:
            return self._console()
        task, request, script, _ = self._request()
        if api_mode(script) is None:
            print(
                "TI-ONE's API has no Ray mode (TrainingMode: PS_WORKER, DDP, MPI, HOROVOD): this is the request "
                "without TrainingMode; `launch tione` prints the console settings for Ray instead",
                file=sys.stderr,
            )
        shown = {**request, "Envs": tracker_credentials.masked(request["Envs"])}
        print(json.dumps(shown, indent=2, ensure_ascii=False))
        return 0

    def _console(self) -> int:
        script = start_script(self.launch_dir)
        self._refuse_inside_task(script)
        print_console_settings(self.launch_dir, script, self.args.overrides)
        return 0

    def submit(self) -> int:
        script = start_script(self.launch_dir)
        self._refuse_inside_task(script)
        if self.args.console:
            return self._console()
        if api_mode(script) is None:
            print(
                "TI-ONE's API has no Ray mode (its TrainingMode takes PS_WORKER, DDP, MPI, HOROVOD): create the task "
                "in the console with these settings.\n",
                file=sys.stderr,
            )
            return self._console()
        task, request, _, copy = self._request()
        endpoint = self.args.endpoint or task.get("endpoint")
        response = Api(task["region"], endpoint).call("CreateTrainingTask", request)
        job = jobs.new_job(
            self.name,
            response.Id,
            name=request["Name"],
            where=task["region"],
            image=(request.get("ImageInfo") or {}).get("ImageUrl", ""),
            code_copy=str(copy or ""),
            extra={
                "region": task["region"],
                "endpoint": endpoint or "",
                "project": request.get("TiProjectId") or "",
                "mode": request.get("TrainingMode"),
                **job_history.run_fields(self.cfg),
            },
        )
        jobs.record(job)
        print(
            f"created TI-ONE task {response.Id} ({request['Name']}) in {task['region']}, mode "
            f"{request.get('TrainingMode')}, request id {response.RequestId}"
        )
        print(self.hint(job))
        return 0

    # --- status, logs, cancel ---------------------------------------------------------------------
    def _api(self, job: Job) -> tuple[Api, dict]:
        task = load_task(project_root() / TASK_FILE) if not job.extra.get("region") else {}
        region = job.extra.get("region") or task["region"]
        endpoint = self.args.endpoint or job.extra.get("endpoint") or task.get("endpoint")
        project = job.extra.get("project") or (task.get("request") or {}).get("TiProjectId")
        return Api(region, endpoint), ({"TiProjectId": project} if project else {})

    def _detail(self, api: Api, scope: dict, job: Job):
        return api.call("DescribeTrainingTask", {"Id": job.id, **scope}).TrainingTaskDetail

    def status(self, job: Job) -> int:
        api, scope = self._api(job)
        try:
            detail = self._detail(api, scope, job)
        except TaskNotFound as exc:
            if job.submitted:
                print(job.describe())
            return job_history.answer_from_records(
                job,
                f"TI-ONE has no task {job.id} in {api.region} any more (deleted, or created in another region or "
                f"project): {exc}",
                output_dir=job_history.run_folder(job),
            )
        if job.submitted:
            print(job.describe())
        state = detail.Status or "?"
        print(
            f"  task:     {detail.Id} {detail.Name} ({detail.TrainingMode or 'no mode'}) in {detail.Region or api.region}"
        )
        print(f"  state:    {state} ({STATES.get(state, 'unknown state')})")
        for info in detail.ResourceConfigInfos or []:
            what = info.InstanceType or f"{(info.Gpu or 0) / 100:g} GPU(s) {info.GpuType or ''}".rstrip()
            print(f"  {(info.Role or 'WORKER').lower() + ':':<9} {info.InstanceNum} x {what}")
        if detail.RuntimeInSeconds is not None:
            print(
                f"  runtime:  {timedelta(seconds=int(detail.RuntimeInSeconds))}"
                + (f" (started {detail.StartTime})" if detail.StartTime else "")
            )
        if detail.EndTime:
            print(f"  ended:    {detail.EndTime}")
        for label, text in (
            ("reason", detail.FailureReason),
            ("message", detail.Message),
            ("billing", detail.BillingInfo),
        ):
            if text:
                print(f"  {label + ':':<9} {text}")
        job_history.remember(job, "status", state_words(detail))
        return 0

    def logs(self, job: Job) -> int:
        api, scope = self._api(job)
        detail = self._detail(api, scope, job)
        said = None
        try:
            while not detail.LatestInstanceId:  # queued: with --follow, wait for the first instance
                if not self.args.follow or detail.Status not in ACTIVE:
                    print(f"task {job.id} has no instance yet (state {detail.Status}): no logs", file=sys.stderr)
                    return 0
                if detail.Status != said:
                    print(
                        f"task {job.id} is {STATES.get(detail.Status, detail.Status)}; waiting for its first instance",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = detail.Status
                time.sleep(POLL_SECONDS)
                detail = self._detail(api, scope, job)
        except KeyboardInterrupt as exc:
            return process_exit.interrupted_code(exc)
        start = detail.StartTime or detail.CreateTime or rfc3339(datetime.now(timezone.utc) - timedelta(hours=1))
        seen: set[str] = set()
        watcher = job_history.LogWatcher()
        try:
            while True:
                start = self._log_pages(api, scope, detail.LatestInstanceId, start, seen, watcher)
                if not self.args.follow or detail.Status not in ACTIVE:
                    return 0
                time.sleep(POLL_SECONDS)
                detail = self._detail(api, scope, job)
        except KeyboardInterrupt as exc:
            return process_exit.interrupted_code(exc)
        finally:
            job_history.remember(job, "logs", state_words(detail), watcher)

    def _log_pages(
        self, api: Api, scope: dict, instance: str, start: str, seen: set[str], watcher: job_history.LogWatcher
    ) -> str:
        """Print every log line from `start` to now, page by page (DescribeLogs' Context); returns the
        newest timestamp printed, where the next poll starts (lines seen already are skipped)."""
        fields = {
            "Service": "TRAIN",
            "ServiceId": instance,
            "StartTime": start,
            "EndTime": rfc3339(datetime.now(timezone.utc)),
            "Limit": 1000,
            "Order": "ASC",
            **scope,
        }
        if self.args.pod:
            fields["PodName"] = self.args.pod
        newest = start
        while True:
            page = api.call("DescribeLogs", fields)
            for line in page.Content or []:
                key = line.Id or f"{line.Timestamp}|{line.PodName}|{line.Message}"
                if key in seen:
                    continue
                seen.add(key)
                newest = max(newest, line.Timestamp or newest, key=instant)
                print(f"[{line.PodName}] {line.Message}" if line.PodName else line.Message, flush=True)
                watcher.feed(f"{line.Message}\n")
            if not page.Content or not page.Context:
                return newest
            fields["Context"] = page.Context

    def cancel(self, job: Job) -> int:
        api, scope = self._api(job)
        response = api.call("StopTrainingTask", {"Id": job.id, **scope})
        print(
            f"stopping TI-ONE task {job.id} (request id {response.RequestId}): its instances get SIGTERM, the "
            "ranks save at the next step; starting the task again resumes from that checkpoint"
        )
        job_history.remember(job, "cancel", "stop requested")
        return 0


PLATFORM = Tione
