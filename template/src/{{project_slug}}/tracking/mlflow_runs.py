"""MLflow: one MLflow run per run folder, in the experiment MLFLOW_EXPERIMENT_NAME (else the
project's name), at MLFLOW_TRACKING_URI (credentials: MLFLOW_TRACKING_USERNAME and _PASSWORD, or
_TOKEN, from the platform's secrets), else in a file store in output_dir/mlruns
(`MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri <that folder>`, or `mlflow
migrate-filestore` into a database). The resolved config is the run's parameters, logged once, when
the run starts; a resumed run continues it, marked running again, and finished at the end (failed
where the process ended otherwise: a failure, a crash a restart may continue).

Requests are short: MLflow's client otherwise retries a dead server for minutes before it reports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from . import identity

REQUEST_TIMEOUT_SECONDS = "10"
REQUEST_RETRIES = "2"
PARAMS_PER_REQUEST = 100  # MLflow's limit for one log_batch
PARAM_CHARACTERS = 6000  # and for one value


class MlflowRun:
    name = "mlflow"

    def __init__(self, cfg, output_dir: Path, resume_step: int):
        self.cfg, self.output_dir = cfg, output_dir
        self.client = self.run_id = None
        import mlflow.tracking  # noqa: F401 - imported here, not on the tracker's thread (its start is all it does)

    def start(self) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_SECONDS)
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", REQUEST_RETRIES)
        from mlflow.entities import Param, RunStatus
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # Plain files on the run's own storage (a database there would need locks NFS may not
            # give); MLflow keeps this store in maintenance, behind this switch.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (self.output_dir / "mlruns").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        saved = identity.recalled(self.output_dir, self.name)
        if saved.get("tracking_uri") == uri and saved.get("run_id"):
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return
        project, run_name = identity.run_names(self.output_dir)
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or project
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        run = self.client.create_run(experiment_id, run_name=run_name, tags={"output_dir": str(self.output_dir)})
        self.run_id = run.info.run_id
        params = [Param(k, v[:PARAM_CHARACTERS]) for k, v in identity.parameters(self.cfg).items()]
        for i in range(0, len(params), PARAMS_PER_REQUEST):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_REQUEST])
        identity.remember(self.output_dir, self.name, {"tracking_uri": uri, "run_id": self.run_id})

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if finished else "FAILED")
