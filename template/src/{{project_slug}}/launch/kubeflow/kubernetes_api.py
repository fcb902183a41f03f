"""The Kubernetes API calls of `launch kubeflow`: the client from a kubeconfig (or a pod's service
account), and a Cluster that submits, reads and deletes one job and finds and streams its pods'
logs, every failure turned into one ConfigError that names the fix (RBAC, a missing operator, an
API server out of reach). Uses the `kubernetes` Python client, imported only when called.

    from .kubernetes_api import Cluster
    cluster = Cluster(args, manifest)   # args: --kubeconfig, --context; manifest: the job to act on
    cluster.submit(); cluster.get(); cluster.delete()
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from argparse import Namespace

import yaml

from ...settings.config import ConfigError
from ...settings.packages import require_package
from ..job_history import LogWatcher

REQUEST_TIMEOUT = 30  # seconds for one API call (not for streaming logs)


def resource(manifest: dict) -> tuple[str, str, str]:
    """(group, version, plural) of the manifest's custom resource, from apiVersion and kind."""
    group, _, version = manifest["apiVersion"].rpartition("/")
    return group, version, manifest["kind"].lower() + "s"  # pytorchjobs, trainjobs, mpijobs


# Not text, not YAML, or YAML that is no kubeconfig (the client reads it as UTF-8 itself).
NOT_A_KUBECONFIG = (UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError, KeyError)


def kubeconfig_named(args: Namespace) -> str:
    return args.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"


def not_a_kubeconfig(args: Namespace, exc: Exception) -> ConfigError:
    reason = " ".join(str(exc).split())[:200]
    return ConfigError(
        f"kubeconfig {kubeconfig_named(args)} is not a kubeconfig ({type(exc).__name__}: {reason}); point "
        "--kubeconfig or KUBECONFIG at the file your cluster's admin gave you (`kubectl config view` reads it)"
    )


def context_problem(args: Namespace) -> str | None:
    """Why --context names no context of the kubeconfig a submit would read, or None. Only the file is
    read: no cluster is contacted and no login helper (a kubeconfig's exec plugin) is run. Without the
    kubernetes package nothing is checked (a dry run does not need it)."""
    if not args.context:
        return None
    try:
        from kubernetes import config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        return None
    try:
        contexts, _ = config.list_kube_config_contexts(config_file=args.kubeconfig)
        names = [str(context["name"]) for context in contexts or []]
    except NOT_A_KUBECONFIG as exc:
        raise not_a_kubeconfig(args, exc) from None
    except (ConfigException, OSError) as exc:
        reason = " ".join(str(exc).split())[:200]
        return f"--context {args.context}: no kubeconfig to choose it from ({reason}); give --kubeconfig or KUBECONFIG"
    if args.context in names:
        return None
    have = ", ".join(names[:10]) or "none"
    return (
        f"--context {args.context} is not a context of kubeconfig {kubeconfig_named(args)} (it has: {have}); "
        "choose one of them (`kubectl config get-contexts`) or leave --context out for the current one"
    )


def kube_client(args: Namespace):
    """An ApiClient for the kubeconfig (or the in-cluster service account); ConfigError naming the fix."""
    require_package(
        "kubernetes",
        "kubeflow",
        "launch kubeflow",
        "or print the manifest with --dry-run and submit it with `kubectl apply -f -`",
    )
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context, client_configuration=configuration)
    except NOT_A_KUBECONFIG as exc:
        raise not_a_kubeconfig(args, exc) from None
    except (ConfigException, OSError) as exc:
        if args.kubeconfig or args.context:
            raise ConfigError(
                f"cannot use kubeconfig {args.kubeconfig or '(default)'} context {args.context or '(current)'}: {exc}"
            ) from None
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            raise ConfigError(
                f"no Kubernetes cluster configured ({exc}; and this is not a pod with a service account). Fixes: "
                "1) point KUBECONFIG or --kubeconfig at your cluster's kubeconfig (`kubectl config current-context` "
                "should name your cluster); 2) choose a context with --context; 3) print the manifest with --dry-run "
                "and apply it where kubectl works: `kubectl apply -f launch/kubeflow/pytorchjob.yaml`"
            ) from None
    configuration.retries = 2
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retry warnings would bury our one-line error
    return client.ApiClient(configuration)


def api_message(exc) -> str:
    """The API server's own message from an ApiException body, else its reason."""
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))


def network_reason(exc) -> str:
    """'[Errno 111] Connection refused' out of urllib3's nested retry message, else the message."""
    text = str(getattr(exc, "reason", None) or exc)
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    return found.group(0) if found else text


class Cluster:
    """The few API calls `launch kubeflow` makes, each turning a failure into a ConfigError."""

    def __init__(self, args: Namespace, manifest: dict):
        self.api_client = kube_client(args)
        self.manifest = manifest
        self.kind = manifest["kind"]
        self.name = manifest["metadata"]["name"]
        self.namespace = manifest["metadata"]["namespace"]
        self.group, self.version, self.plural = resource(manifest)
        self.host = self.api_client.configuration.host

    def call(self, what: str, fn, *a, absent_ok: bool = False, **kw):
        """fn(*a, **kw); absent_ok: None when the API server has no such object (HTTP 404)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*a, **kw)
        except ApiException as exc:
            if absent_ok and exc.status == 404:
                return None
            raise self.explain(what, exc) from None
        except (HTTPError, OSError) as exc:
            raise ConfigError(
                f"cannot reach the Kubernetes API server at {self.host} to {what} ({network_reason(exc)}). Check the "
                "cluster is up and your kubeconfig points at it (`kubectl cluster-info`), or that the VPN/proxy it "
                "needs is on"
            ) from None

    def explain(self, what: str, exc) -> ConfigError:
        job = f"{self.kind} {self.namespace}/{self.name}"
        message = api_message(exc)
        if exc.status == 409:
            return ConfigError(
                f"{job} already exists. Fixes: 1) `--action cancel` deletes it (and its pods), then submit again; "
                f"2) submit next to it under another name: --name {self.name}-2"
            )
        if exc.status == 404 and what == "submit":
            if "namespaces" in message:
                return ConfigError(
                    f"namespace {self.namespace!r} does not exist: `kubectl create namespace "
                    f"{self.namespace}` or pass --namespace"
                )
            operator = {
                "TrainJob": "Kubeflow Trainer v2 (trainer.kubeflow.org CRDs and the torch-distributed runtime)",
                "MPIJob": "the MPI Operator v0.5 or later (kubeflow.org/v2beta1 MPIJob; the training-operator's "
                "kubeflow.org/v1 MPIJob is another API)",
            }.get(self.kind, "the Kubeflow training-operator (kubeflow.org/v1 PyTorchJob)")
            return ConfigError(
                f"the cluster does not know {self.plural}.{self.group}/{self.version}: install "
                f"{operator}, see launch/kubeflow/README.md ({message})"
            )
        if exc.status == 404 and what == "read the log of":  # the pod went between listing and reading
            return ConfigError(
                f"the pod of {job} is gone ({message}): it was replaced or the job ended; "
                "`--action status` shows the pods there are now"
            )
        if exc.status == 404:
            return ConfigError(
                f"{job} not found ({message}): submit it first, or pass the --namespace/--name it "
                f"was submitted with (`kubectl get {self.plural} -A` lists them)"
            )
        if exc.status == 401:  # who you are was not accepted: credentials, not rights
            return ConfigError(
                f"the API server at {self.host} did not accept your credentials to {what} {job} ({message}): "
                "the kubeconfig's token or certificate is wrong or expired; log in again (your cluster's "
                "login command, or a fresh kubeconfig)"
            )
        if exc.status == 403:
            return ConfigError(
                f"not allowed to {what} {job}: {message}. Ask for RBAC rights on {self.plural}."
                f"{self.group} (and pods, pods/log) in namespace {self.namespace}"
            )
        if exc.status in (400, 422):
            return ConfigError(f"the API server rejected {job}: {message}")
        return ConfigError(f"{what} {job} failed: HTTP {exc.status} {message}")

    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    def submit(self) -> dict:
        return self.call(
            "submit",
            self.custom().create_namespaced_custom_object,
            self.group,
            self.version,
            self.namespace,
            self.plural,
            self.manifest,
            field_validation="Strict",
            _request_timeout=REQUEST_TIMEOUT,
        )

    def get(self) -> dict:
        job = self.find()
        if job is None:
            raise ConfigError(
                f"{self.kind} {self.namespace}/{self.name} not found: submit it first, or pass the --namespace/"
                f"--name it was submitted with (`kubectl get {self.plural} -A` lists them)"
            )
        return job

    def find(self) -> dict | None:
        """The job as the API server has it; None when it has none of that name (never submitted, or
        deleted: by its TTL after it ended, by `--action cancel`, by hand)."""
        return self.call(
            "read",
            self.custom().get_namespaced_custom_object,
            self.group,
            self.version,
            self.namespace,
            self.plural,
            self.name,
            absent_ok=True,
            _request_timeout=REQUEST_TIMEOUT,
        )

    def delete(self) -> None:
        from kubernetes import client

        self.call(
            "cancel",
            self.custom().delete_namespaced_custom_object,
            self.group,
            self.version,
            self.namespace,
            self.plural,
            self.name,
            body=client.V1DeleteOptions(propagation_policy="Background"),
            _request_timeout=REQUEST_TIMEOUT,
        )

    def node_selector(self, node_rank: int) -> tuple[str, str]:
        """(label selector of one node's pod, its training container) with the labels each operator sets."""
        if self.kind == "TrainJob":  # JobSet: one indexed Job `node`, completion index = node rank
            return (
                f"jobset.sigs.k8s.io/jobset-name={self.name},jobset.sigs.k8s.io/replicatedjob-name=node,"
                f"batch.kubernetes.io/job-completion-index={node_rank}"
            ), "node"
        if self.kind == "MPIJob":  # mpirun forwards every rank's output to the Launcher
            return (f"training.kubeflow.org/job-name={self.name},training.kubeflow.org/job-role=launcher"), "launcher"
        kind, index = ("master", 0) if node_rank == 0 else ("worker", node_rank - 1)
        return (
            f"training.kubeflow.org/job-name={self.name},training.kubeflow.org/replica-type={kind},"
            f"training.kubeflow.org/replica-index={index}"
        ), "pytorch"

    def node_pod(self, selector: str):
        pods = self.call(
            "list the pods of",
            self.core().list_namespaced_pod,
            self.namespace,
            label_selector=selector,
            _request_timeout=REQUEST_TIMEOUT,
        ).items
        # After a restart the newest pod is the live one.
        return max(pods, key=lambda p: p.metadata.creation_timestamp) if pods else None

    def stream_log(self, pod: str, container: str, follow: bool, watcher: LogWatcher | None = None) -> None:
        """Print the pod's log (with follow: until the container ends); the watcher sees what is printed."""
        response = self.call(
            "read the log of",
            self.core().read_namespaced_pod_log,
            pod,
            self.namespace,
            container=container,
            follow=follow,
            _preload_content=False,
        )
        try:
            for chunk in response.stream(64 * 1024):
                text = chunk.decode("utf-8", errors="replace")
                sys.stdout.write(text)
                sys.stdout.flush()
                if watcher is not None:
                    watcher.feed(text)
        finally:
            response.release_conn()
