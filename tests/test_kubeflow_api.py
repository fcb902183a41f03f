"""`launch kubeflow` against an API server, for real over HTTP: submit, status, logs (and --follow)
and cancel go through the official `kubernetes` client to tests/fake_kubernetes.py, an in-process
server that validates what it is sent against the CRDs of tests/k8s-crds as a strict API server
would, and answers with the objects, Status errors and log streams a real one sends.

    python -m pytest tests/test_kubeflow_api.py      # under a minute; no cluster, no kubectl

Every test ends by checking that the server saw nothing a real one would refuse (`problems`).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from conftest import BIN, render, run
from fake_kubernetes import SERVER_METADATA, FakeKubernetes

PYTORCHJOBS = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/{name}"
WAIT = 30  # seconds: the most any one event below may take


class Project:
    def __init__(self, path: Path):
        self.path = path
        self.slug = yaml.safe_load((path / ".copier-answers.yml").read_text())["project_slug"]

    def records(self) -> list[dict]:
        path = self.path / ".jobs" / "kubeflow.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    root = tmp_path_factory.mktemp("kf-api")
    return Project(
        render(
            root / "p",
            project_name="KF Api",
            platforms="[devmachine, kubeflow]",
            nodes=2,
            gpus_per_node=2,
            data_dir="/mnt/shared/d/data",
            output_dir="/mnt/shared/d/runs",
        )
    )


@pytest.fixture
def kube():
    with FakeKubernetes(namespaces={"default", "ml"}) as server:
        yield server
    assert not server.problems, server.problems


def cli_env(project: Project, kube: FakeKubernetes | None, home: Path) -> dict[str, str]:
    """A user's shell: KUBECONFIG at the server, an empty HOME (no ~/.kube/config), no proxy, not in a pod."""
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("KUBE")}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(project.path / "src"),
        HOME=str(home),
        NO_PROXY="127.0.0.1,localhost",
        KUBERNETES_SERVICE_HOST="",
    )
    if kube is not None:
        env["KUBECONFIG"] = str(kube.kubeconfig(home / "kubeconfig"))
    return env


def launch(project: Project, env: dict, *args: str) -> subprocess.CompletedProcess:
    """`<package> launch kubeflow ARGS` from the project root, as its user runs it."""
    result = run(["python", "-m", project.slug, "launch", "kubeflow", *args], cwd=project.path, env=env, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def replica_labels(job: str, kind: str, index: int) -> dict[str, str]:
    """The labels the training-operator puts on a PyTorchJob's pods."""
    return {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/replica-type": kind,
        "training.kubeflow.org/replica-index": str(index),
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
    }


def queries(kube: FakeKubernetes, method: str, path: str) -> list[dict]:
    return [r["query"] for r in kube.requests if (r["method"], r["path"]) == (method, path)]


def test_submit_creates_exactly_the_dry_run_manifest(project, kube, tmp_path):
    env = cli_env(project, None, tmp_path / "home")  # the kubeconfig by --kubeconfig this time
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    args = ["--name", "sub-1", "--namespace", "ml", "schedule.max_steps=5"]
    shown = yaml.safe_load(ok(launch(project, env, "--dry-run", *args)))
    assert kube.requests == []  # a dry run talks to no server
    before = len(project.records())

    out = ok(launch(project, env, *args, "--kubeconfig", str(kubeconfig)))
    assert out.startswith(f"submitted PyTorchJob ml/sub-1: 2 node(s) x 2 process(es), to {kube.url}\n"), out
    assert kube.calls == [("POST", "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs")]
    assert kube.requests[0]["query"] == {"fieldValidation": "Strict"}
    stored = kube.job("ml", "sub-1")
    assert stored["metadata"]["uid"] and stored["status"] == {}
    as_sent = {k: v for k, v in stored.items() if k != "status"}
    as_sent["metadata"] = {k: v for k, v in stored["metadata"].items() if k not in SERVER_METADATA}
    assert as_sent == shown
    assert shown["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"][-1] == (
        "schedule.max_steps=5"
    )
    records = project.records()
    assert len(records) == before + 1
    assert records[-1]["id"] == "ml/sub-1" and records[-1]["name"] == "sub-1" and records[-1]["where"] == kube.url
    assert {"manifest": "pytorchjob", "kind": "PyTorchJob", "namespace": "ml"}.items() <= records[-1]["extra"].items()

    # The same name again: the server's 409, as one line with the fixes; nothing recorded, nothing changed.
    error = one_line_error(launch(project, env, *args, "--kubeconfig", str(kubeconfig)))
    assert error.startswith("error: PyTorchJob ml/sub-1 already exists. Fixes: 1) `--action cancel`"), error
    assert "--name sub-1-2" in error
    assert len(project.records()) == before + 1 and kube.job("ml", "sub-1") == stored


def test_submit_refusals_are_one_line_fixes(project, kube, tmp_path):
    env = cli_env(project, kube, tmp_path / "home")
    before = len(project.records())
    # A misspelt field: fieldValidation=Strict makes it the server's error, not a silently dropped field.
    manifest = yaml.safe_load((project.path / "launch" / "kubeflow" / "pytorchjob.yaml").read_text())
    manifest["spec"]["runPolicy"]["backofLimit"] = 3
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(manifest))
    error = one_line_error(launch(project, env, "--manifest", str(typo), "--name", "typo"))
    assert error == (
        "error: the API server rejected PyTorchJob default/typo: strict decoding error: "
        'unknown field "spec.runPolicy.backofLimit"\n'
    )
    error = one_line_error(launch(project, env, "--name", "lost", "--namespace", "nowhere"))
    assert "namespace 'nowhere' does not exist: `kubectl create namespace nowhere`" in error
    kube.errors["create"] = (
        403,
        "Forbidden",
        'pytorchjobs.kubeflow.org is forbidden: User "dev" cannot create resource "pytorchjobs" in API group '
        '"kubeflow.org" in the namespace "default"',
    )
    error = one_line_error(launch(project, env, "--name", "denied"))
    assert error.startswith(
        "error: not allowed to submit PyTorchJob default/denied: pytorchjobs.kubeflow.org is forbidden"
    )
    assert "Ask for RBAC rights on pytorchjobs.kubeflow.org" in error
    # An expired or wrong token: the server's 401.
    wrong = cli_env(project, None, tmp_path / "wrong")
    wrong["KUBECONFIG"] = str(kube.kubeconfig(tmp_path / "wrong" / "kubeconfig", token="expired"))
    error = one_line_error(launch(project, wrong, "--name", "expired"))
    assert error.startswith("error: the API server at http://127.0.0.1:"), error
    assert "did not accept your credentials to submit PyTorchJob default/expired (Unauthorized)" in error, error
    assert "RBAC" not in error, error
    # A cluster without Kubeflow Trainer: the plural is not served.
    with FakeKubernetes(resources={"pytorchjobs.kubeflow.org/v1"}) as bare:
        error = one_line_error(
            launch(project, cli_env(project, bare, tmp_path / "bare"), "--manifest", "trainjob", "--name", "tj")
        )
        assert not bare.problems, bare.problems
    assert error.startswith("error: the cluster does not know trainjobs.trainer.kubeflow.org/v1alpha1: install "), error
    assert kube.jobs == {} and len(project.records()) == before


def test_status_prints_conditions_replicas_and_restarts(project, kube, tmp_path):
    env = cli_env(project, kube, tmp_path / "home")
    ok(launch(project, env, "--name", "st-1"))
    kube.set_status(
        "default",
        "st-1",
        {
            "conditions": [
                {
                    "type": "Created",
                    "status": "True",
                    "reason": "PyTorchJobCreated",
                    "message": "PyTorchJob st-1 is created.",
                    "lastTransitionTime": "2025-01-02T03:04:05Z",
                },
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "PyTorchJobRunning",
                    "message": "PyTorchJob st-1 is running.",
                    "lastTransitionTime": "2025-01-02T03:05:00Z",
                },
            ],
            "replicaStatuses": {
                "Master": {"active": 1, "selector": "training.kubeflow.org/job-name=st-1"},
                "Worker": {"active": 1},
            },
        },
    )
    kube.add_pod("default", "st-1-master-0", replica_labels("st-1", "master", 0), node_name="gpu-a")
    kube.add_pod(
        "default",
        "st-1-worker-0",
        replica_labels("st-1", "worker", 0),
        node_name="gpu-b",
        restart_count=1,
        last_exit_code=143,
    )
    kube.add_pod("default", "other-master-0", replica_labels("other", "master", 0))  # another job's
    kube.add_event("default", "PyTorchJob", "st-1", "PyTorchJobRestarting", "restarting", count=2)
    kube.add_event("default", "PyTorchJob", "other", "PyTorchJobRestarting", "not this job's", count=5)

    out = ok(launch(project, env, "--action", "status", "--name", "st-1"))
    lines = out.splitlines()
    assert lines[0].startswith("kubeflow job default/st-1 (st-1); submitted ") and lines[1] == "PyTorchJob default/st-1"
    assert lines[2].split() == [
        "2025-01-02T03:04:05Z",
        "Created",
        "True",
        "PyTorchJobCreated:",
        "PyTorchJob",
        "st-1",
        "is",
        "created.",
    ]
    assert lines[3].split()[:4] == ["2025-01-02T03:05:00Z", "Running", "True", "PyTorchJobRunning:"]
    assert lines[4:6] == ["  Master: active 1", "  Worker: active 1"]
    assert lines[6].startswith("  restarted 2 time(s) by the operator (PyTorchJobRestarting events;"), out
    assert lines[7].startswith("  1 container restart(s) in place"), out
    assert [line.split()[:2] for line in lines[8:]] == [["st-1-master-0", "Running"], ["st-1-worker-0", "Running"]]
    assert "node gpu-b  restarts 1  last exit 143 (preempted: saved and stopped)" in lines[9]
    assert queries(kube, "GET", "/api/v1/namespaces/default/pods") == [
        {"labelSelector": "training.kubeflow.org/job-name=st-1"}
    ]
    assert queries(kube, "GET", "/api/v1/namespaces/default/events") == [
        {"fieldSelector": "involvedObject.name=st-1,involvedObject.kind=PyTorchJob"}
    ]


class Lines:
    """A process's stdout, line by line, read in a thread; `wait_for` a line with a deadline."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.seen, self.queue = proc, [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put(None)

    def wait_for(self, line: str) -> None:
        deadline = time.monotonic() + WAIT
        while line + "\n" not in self.seen:
            try:
                got = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {line!r} within {WAIT} s; got {self.seen}") from None
            assert got is not None, f"stdout ended before {line!r}: {self.seen}; {self.proc.stderr.read()}"
            self.seen.append(got)


def test_logs_of_each_node_and_follow_until_the_pod_ends(project, kube, tmp_path):
    env = cli_env(project, kube, tmp_path / "home")
    ok(launch(project, env, "--name", "lg-1"))
    now = datetime.now(timezone.utc)
    # The master's pod before a restart, then the live one: logs reads the newest.
    master = replica_labels("lg-1", "master", 0)
    kube.add_pod(
        "default", "lg-1-master-0-old", master, "Failed", log_lines=["old pod"], created=now - timedelta(minutes=5)
    )
    kube.add_pod("default", "lg-1-master-0", master, log_lines=["master step 1", "master step 2"], created=now)
    kube.add_pod("default", "lg-1-worker-0", replica_labels("lg-1", "worker", 0), log_lines=["worker step 1"])

    shown = launch(project, env, "--action", "logs", "--name", "lg-1")
    assert ok(shown) == "master step 1\nmaster step 2\n" and "--- lg-1-master-0 (Running)" in shown.stderr
    shown = launch(project, env, "--action", "logs", "--name", "lg-1", "--node-rank", "1")
    assert ok(shown) == "worker step 1\n" and "--- lg-1-worker-0 (Running)" in shown.stderr
    assert queries(kube, "GET", "/api/v1/namespaces/default/pods/lg-1-worker-0/log") == [
        {"container": "pytorch", "follow": "false"}
    ]
    # The pod replaced between the listing and the read: said of the pod, not as a missing job.
    kube.errors["log"] = (404, "NotFound", 'pods "lg-1-worker-0" not found')
    gone = launch(project, env, "--action", "logs", "--name", "lg-1", "--node-rank", "1")
    assert gone.returncode == 1 and gone.stdout == "", gone.stdout + gone.stderr
    assert gone.stderr.splitlines()[1:] == [
        'error: the pod of PyTorchJob default/lg-1 is gone (pods "lg-1-worker-0" not found): it was replaced or '
        "the job ended; `--action status` shows the pods there are now"
    ], gone.stderr
    del kube.errors["log"]

    # --follow prints each line as the pod writes it and ends when the pod does.
    proc = subprocess.Popen(
        ["python", "-m", project.slug, "launch", "kubeflow", "--action", "logs", "--name", "lg-1", "--follow"],
        cwd=project.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = Lines(proc)
        out.wait_for("master step 2")
        kube.append_log("default", "lg-1-master-0", "master step 3")
        out.wait_for("master step 3")  # streamed while the pod runs, not at its end
        assert proc.poll() is None
        kube.append_log("default", "lg-1-master-0", "master done")
        kube.finish_pod("default", "lg-1-master-0")
        assert proc.wait(timeout=WAIT) == 0, proc.stderr.read()
        out.wait_for("master done")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.seen == ["master step 1\n", "master step 2\n", "master step 3\n", "master done\n"]
    assert queries(kube, "GET", "/api/v1/namespaces/default/pods/lg-1-master-0/log")[-1] == {
        "container": "pytorch",
        "follow": "true",
    }


def test_cancel_deletes_the_job_and_its_pods(project, kube, tmp_path):
    env = cli_env(project, kube, tmp_path / "home")
    ok(launch(project, env, "--name", "cn-1"))
    kube.add_pod("default", "cn-1-master-0", replica_labels("cn-1", "master", 0))
    kube.add_pod("default", "cn-1-worker-0", replica_labels("cn-1", "worker", 0))
    kube.add_pod("default", "other-master-0", replica_labels("other", "master", 0))

    out = ok(launch(project, env, "--action", "cancel", "--name", "cn-1"))
    assert out == "deleted PyTorchJob default/cn-1; Kubernetes removes its pods\n"
    (delete,) = [r for r in kube.requests if r["method"] == "DELETE"]
    assert delete["path"] == PYTORCHJOBS.format(ns="default", name="cn-1")
    assert delete["body"]["propagationPolicy"] == "Background"
    code, answer = kube.get(PYTORCHJOBS.format(ns="default", name="cn-1"))
    assert code == 404 and answer["reason"] == "NotFound", answer
    assert answer["message"] == 'pytorchjobs.kubeflow.org "cn-1" not found'
    assert list(kube.pods) == [("default", "other-master-0")]
    # The cluster has forgotten it at once; status says the cancel deleted it.
    lines = ok(launch(project, env, "--action", "status", "--name", "cn-1")).splitlines()
    assert lines[2] == "  from this project's records:", lines
    assert re.fullmatch(r"  last seen: deleted at \S+Z \(--action cancel\)", lines[3]), lines
    # Cancelled twice: the server's 404 as one line.
    error = one_line_error(launch(project, env, "--action", "cancel", "--name", "cn-1"))
    assert error.startswith('error: PyTorchJob default/cn-1 not found (pytorchjobs.kubeflow.org "cn-1" not found)')


def jobset_labels(job: str, index: int) -> dict[str, str]:
    """The labels JobSet puts on a TrainJob's pods (one indexed Job `node`; completion index = node rank)."""
    return {
        "jobset.sigs.k8s.io/jobset-name": job,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/job-index": "0",
        "batch.kubernetes.io/job-completion-index": str(index),
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
    }


def test_trainjob_status_logs_and_cancel(project, kube, tmp_path):
    env = cli_env(project, kube, tmp_path / "home")
    out = ok(launch(project, env, "--manifest", "trainjob", "--name", "tj-1"))
    assert out.startswith("submitted TrainJob default/tj-1: 2 node(s)"), out
    assert kube.calls == [("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs")]
    kube.set_status(
        "default",
        "tj-1",
        {"jobsStatus": [{"name": "node", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}]},
    )
    kube.add_pod("default", "tj-1-node-0-0-abcde", jobset_labels("tj-1", 0), container="node", log_lines=["rank 0"])
    kube.add_pod("default", "tj-1-node-0-1-fghij", jobset_labels("tj-1", 1), container="node", log_lines=["rank 1"])

    # The actions find the kind in the record: no --manifest needed.
    out = ok(launch(project, env, "--action", "status", "--name", "tj-1"))
    assert "TrainJob default/tj-1\n" in out and "no conditions yet" not in out, out  # its replicas say it runs
    assert "  node: ready 2, succeeded 0, failed 0, active 2, suspended 0\n" in out, out
    assert "  tj-1-node-0-1-fghij  Running" in out, out
    assert queries(kube, "GET", "/api/v1/namespaces/default/pods")[0] == {
        "labelSelector": "jobset.sigs.k8s.io/jobset-name=tj-1"
    }
    shown = launch(project, env, "--action", "logs", "--name", "tj-1", "--node-rank", "1")
    assert ok(shown) == "rank 1\n" and "--- tj-1-node-0-1-fghij (Running)" in shown.stderr
    assert queries(kube, "GET", "/api/v1/namespaces/default/pods/tj-1-node-0-1-fghij/log") == [
        {"container": "node", "follow": "false"}
    ]
    ok(launch(project, env, "--action", "cancel", "--name", "tj-1"))
    assert kube.calls[-1] == ("DELETE", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/tj-1")
    assert kube.jobs == {} and kube.pods == {}


def test_status_of_a_job_the_cluster_deleted_answers_from_the_records(project, kube, tmp_path):
    """A PyTorchJob deleted after it ended (its TTL, or by hand) takes its pods and their logs along:
    status answers from what the project holds, and says so: the state status last saw, the last
    training line and last word logs printed, and its run folder (on the pods' storage, not here).
    A job of which the project holds nothing is exit 1, said in words."""
    env = cli_env(project, kube, tmp_path / "home")
    run_dir = "/mnt/shared/d/runs/ttl-1"
    ok(launch(project, env, "--name", "ttl-1", f"run.output_dir={run_dir}", "schedule.max_steps=40"))
    record = project.records()[-1]
    assert (record["id"], record["extra"]["output_dir"], record["extra"]["max_steps"]) == ("default/ttl-1", run_dir, 40)
    kube.set_status(
        "default",
        "ttl-1",
        {
            "conditions": [
                {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "lastTransitionTime": rfc(0)},
                {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "lastTransitionTime": rfc(5)},
            ]
        },
    )
    assert "Running" in ok(launch(project, env, "--action", "status", "--name", "ttl-1"))
    training = "step     20/40 | loss 5.4321 | lr 3.00e-04 | 9,876 tok/s | 210 ms/step"
    stopped = "preempted (SIGTERM): checkpoint of step 20 saved; the same command resumes from it (exit code 143)"
    kube.add_pod(
        "default",
        "ttl-1-master-0",
        replica_labels("ttl-1", "master", 0),
        log_lines=[
            "[default0]:step     10/40 | loss 6.0000 | lr 3.00e-04 | 9,000 tok/s | 220 ms/step",
            training,
            stopped,
        ],
    )
    assert stopped in ok(launch(project, env, "--action", "logs", "--name", "ttl-1"))
    kube.forget("default", "ttl-1")  # the TTL after the end: the job and its pods are gone

    result = launch(project, env, "--action", "status", "--name", "ttl-1")
    lines = ok(result).splitlines()
    assert lines[0].startswith("kubeflow job default/ttl-1 (ttl-1); submitted "), lines
    assert lines[1].startswith("  the cluster has no PyTorchJob default/ttl-1: deleted (by its TTL after it ended"), (
        lines
    )
    assert lines[2:] == [
        "  from this project's records:",
        lines[3],
        f"  last line: {training}",
        f"  last word: {stopped}",
        f"  run folder: {run_dir} (not on this machine: the job's storage holds it)",
    ], lines
    assert re.fullmatch(r"  last seen: Running \(PyTorchJobRunning\) at \S+Z \(--action (status|logs)\)", lines[3])
    assert kube.calls[-1] == ("GET", PYTORCHJOBS.format(ns="default", name="ttl-1"))

    # Nothing submitted, seen or kept of this one: exit 1, in words (not a traceback, not a guess).
    never = launch(project, env, "--action", "status", "--name", "never-1")
    assert never.returncode == 1, never.stdout + never.stderr
    assert never.stdout.splitlines() == [
        "  the cluster has no PyTorchJob default/never-1: deleted (by its TTL after it ended, by `--action "
        "cancel`, by hand) or never submitted there (`kubectl get pytorchjobs -A` lists them)",
        "  and this project holds nothing of it: no status or logs seen, no log line, no run folder here",
    ], never.stdout


def rfc(seconds: int) -> str:
    return (datetime(2026, 1, 1, 10, 0, 0, tzinfo=timezone.utc) + timedelta(seconds=seconds)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
