"""The trackers' server and credential variables, as the platforms pass them on: from the
platform's secrets into the job's environment, never written into a project file. Kubeflow's
manifests read them from the secret <project>-trackers (copier's tracker_env); Slurm and the dev
machine pass the launching shell's environment on as it is; `launch tione` copies those set in the
launching shell into the task's Envs (shown masked by --dry-run)."""

from __future__ import annotations

from collections.abc import Mapping

VARIABLES = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_EXPERIMENT_NAME",
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_MODE",
)
SECRET = {"MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"}


def with_credentials(envs: list[dict], environ: Mapping[str, str]) -> list[dict]:
    """A request's [{Name, Value}] with each tracker variable set in `environ` that it lacks."""
    named = {e.get("Name") for e in envs}
    return envs + [{"Name": n, "Value": environ[n]} for n in VARIABLES if environ.get(n) and n not in named]


def masked(envs: list[dict]) -> list[dict]:
    """The same list to show: secrets' values replaced by ***."""
    return [{**e, "Value": "***"} if e.get("Name") in SECRET else e for e in envs]
