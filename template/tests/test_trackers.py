"""Trackers (tracking/, logging.trackers) against the real things: an MLflow tracking server this
module starts on localhost (sqlite store), and W&B in offline mode. Nothing reaches the network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import PACKAGE, ROOT, free_port, launch_training, read_metrics, subprocess_env

TRACKED = ("logging.every_steps=1", "checkpoint.every_steps=6", "logging.tensorboard=true")
NO_TRACKER_ENV = {name: None for name in ("MLFLOW_TRACKING_URI", "WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL")}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free local port with a sqlite store; its URI."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        pytest.fail("these tests start a real MLflow server: pip install mlflow")
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'mlflow.db'}",
            "--default-artifact-root",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(folder / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # its workers too
        server.wait(timeout=30)


def test_a_stopped_and_resumed_run_is_one_mlflow_run_with_every_step(cli, demo_data, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    env = {**NO_TRACKER_ENV, "MLFLOW_TRACKING_URI": mlflow_server}
    trackers = "logging.trackers=tensorboard,mlflow"
    first = launch_training(cli, demo_data, out, 2, trackers, *TRACKED, "schedule.max_steps=6", env=env)
    again = launch_training(cli, demo_data, out, 2, trackers, *TRACKED, "schedule.max_steps=12", env=env)
    assert "resumed from" in again.stdout
    assert "warning" not in first.stderr + again.stderr, first.stderr[-3000:] + again.stderr[-3000:]

    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name(PACKAGE)
    (run,) = client.search_runs([experiment.experiment_id])
    assert json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    history = client.get_metric_history(run.info.run_id, "loss")
    train, _ = read_metrics(out)
    assert sorted((m.step, m.value) for m in history) == [(r["step"], r["loss"]) for r in train]
    assert [r["step"] for r in train] == list(range(1, 13))
    params = run.data.params
    assert params["optim.lr"] == "0.003" and params["model.size"] == "tiny"
    assert params["logging.trackers"] == "tensorboard,mlflow" and params["schedule.max_steps"] == "6"
    assert "val_bpb" in run.data.metrics
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_a_tracker_server_that_is_down_costs_one_warning_and_nothing_else(cli, demo_data, tmp_path):
    out = tmp_path / "run"
    env = {**NO_TRACKER_ENV, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"}
    proc = launch_training(
        cli, demo_data, out, 2, "logging.trackers=mlflow", *TRACKED, "schedule.max_steps=6", env=env, timeout=400
    )
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "tracker mlflow stopped" in warnings[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    train, _ = read_metrics(out)
    assert [r["step"] for r in train] == list(range(1, 7))


def test_wandb_without_a_key_writes_an_offline_run_into_the_run_folder_and_resumes_it(cli, demo_data, tmp_path):
    out = tmp_path / "run"
    env = {**NO_TRACKER_ENV, "WANDB_DISABLE_GIT": "true", "WANDB_BASE_URL": "http://127.0.0.1:9"}
    for steps in (6, 12):
        proc = launch_training(
            cli, demo_data, out, 2, "logging.trackers=wandb", *TRACKED, f"schedule.max_steps={steps}", env=env
        )
        assert "warning" not in proc.stderr, proc.stderr[-3000:]
    run_id = json.loads((out / "trackers.json").read_text())["wandb"]["id"]
    offline = sorted((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(folder.name.endswith(f"-{run_id}") for folder in offline)
    assert all(list(folder.glob(f"run-{run_id}.wandb")) for folder in offline)


@pytest.mark.parametrize(
    "given,problem",
    [("mlfow", "'mlfow' is not one of tensorboard, mlflow, wandb"), ("mlflow,mlflow", "names one twice")],
)
def test_trackers_not_known_are_refused_in_one_line(cfg_with, given, problem):
    with pytest.raises(Exception, match=problem) as caught:
        cfg_with(f"logging.trackers={given}")
    assert type(caught.value).__name__ == "ConfigError" and "logging.trackers" in str(caught.value)


def test_trackers_read_from_yaml_lists_the_command_line_and_the_older_switch(cfg_with):
    assert cfg_with("logging.trackers=tensorboard, mlflow").logging.trackers == ["tensorboard", "mlflow"]
    assert cfg_with("logging.trackers=[]").logging.trackers == []
    assert cfg_with("logging.trackers=none").logging.trackers == []
    from importlib import import_module

    tracking = import_module(f"{PACKAGE}.tracking")
    assert tracking.chosen(cfg_with("logging.trackers=tensorboard,wandb", "logging.tensorboard=false")) == ["wandb"]
    config = import_module(f"{PACKAGE}.settings.config")  # the names the config allows are the trackers there are
    assert tuple(tracking.TRACKERS) == config.LIST_CHOICES["logging.trackers"]


ENDS = """
import sys, time
from pathlib import Path
from {package}.settings.config import load_config
from {package}.tracking import open_trackers

out = Path(sys.argv[1])
(out / "empty.yaml").write_text("")
cfg = load_config(out / "empty.yaml", ["logging.trackers=mlflow"])
(tracker,) = open_trackers(cfg, out, 0)
tracker.log(1, dict(loss=2.5))
while not (out / "trackers.json").exists():  # started: the run exists (a crash before that leaves none)
    time.sleep(0.1)
if sys.argv[2] == "finished":
    tracker.close()
sys.exit(0 if sys.argv[2] == "finished" else 1)  # a crash: only the exit hook closes it
"""


@pytest.mark.parametrize("how", ["finished", "crashed"])
def test_a_run_that_ends_otherwise_marks_its_tracker_run_failed(tmp_path, how, monkeypatch):
    """Without MLFLOW_TRACKING_URI, the file store in the run folder; a process that ends without
    closing its trackers (a failure, a crash) still sends what it logged, and the run is FAILED."""
    from mlflow.tracking import MlflowClient

    proc = subprocess.run(
        [sys.executable, "-c", ENDS.replace("{package}", PACKAGE), str(tmp_path), how],
        cwd=ROOT,
        env=subprocess_env(NO_TRACKER_ENV),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == (0 if how == "finished" else 1) and "warning" not in proc.stderr, proc.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as `mlflow ui` reads it (README)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(PACKAGE).experiment_id])
    assert run.info.status == ("FINISHED" if how == "finished" else "FAILED")
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 2.5)]
