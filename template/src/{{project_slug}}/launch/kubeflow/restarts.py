"""Restarts of a Kubeflow job: the grace-period check `launch kubeflow` makes before it submits, and
the restart view of `launch kubeflow --action status`.

    <package> launch kubeflow --action status    # conditions, then one line per pod with its restarts

A pod deleted or evicted gets SIGTERM, and Kubernetes kills it terminationGracePeriodSeconds later;
the ranks need cluster.stop_grace_seconds to finish the step and save, so the pod's grace period must
be longer (check_grace). A job comes back from a fault in one of two ways, and the status shows
both: the operator recreates a pod (PyTorchJob restartPolicy ExitCode, JobSet restarts: a new pod,
the job's "Restarting" condition and events) or the kubelet restarts its container in place
(OnFailure, the MPIJob Launcher: the pod's restart count). The functions below take the API's
objects as plain dicts (ApiClient.sanitize_for_serialization), so they are tested without a cluster.
"""

from __future__ import annotations

from datetime import datetime, timezone

from ...settings.config import ConfigError

DEFAULT_GRACE_SECONDS = 30  # Kubernetes' own, when a pod spec does not say


def pod_templates(manifest: dict) -> dict[str, dict]:
    """{role: pod spec} of every pod the manifest creates (TrainJob: its runtimePatches)."""
    spec = manifest.get("spec", {})
    if manifest.get("kind") == "TrainJob":
        found = {}
        for patch in spec.get("runtimePatches") or []:
            jobs = (patch.get("trainingRuntimeSpec") or {}).get("template", {}).get("spec", {}).get("replicatedJobs")
            for job in jobs or []:
                found[job.get("name", "?")] = (
                    job.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
                )
        return found
    replicas = spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {}
    return {role: r.get("template", {}).get("spec", {}) for role, r in replicas.items()}


def check_grace(manifest: dict, stop_grace_seconds: int) -> None:
    """ConfigError when a pod would be killed before its ranks can save."""
    for role, pod in pod_templates(manifest).items():
        grace = pod.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        if grace <= stop_grace_seconds:
            raise ConfigError(
                f"{manifest['kind']} {role} pods get SIGKILL {grace} s after SIGTERM, but the ranks may take "
                f"cluster.stop_grace_seconds = {stop_grace_seconds} s to finish the step and save. Fixes: 1) raise "
                f"terminationGracePeriodSeconds in the manifest above {stop_grace_seconds} (the template renders "
                "stop_grace_seconds + 60); 2) lower cluster.stop_grace_seconds in config/train.yaml"
            )


def age(timestamp, now: datetime | None = None) -> str:
    """'3m', '2h', ... since an API timestamp (datetime or ISO string); '' when unknown."""
    if not timestamp:
        return ""
    if isinstance(timestamp, str):
        timestamp = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int(((now or datetime.now(timezone.utc)) - timestamp).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def pod_line(pod: dict, now: datetime | None = None) -> str:
    """name, phase, node, container restarts, the last exit code and the pod's age."""
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    restarts, last_exit = 0, None
    for container in status.get("containerStatuses") or []:
        restarts += container.get("restartCount", 0)
        for state in (container.get("state") or {}, container.get("lastState") or {}):
            terminated = state.get("terminated")
            if terminated and last_exit is None:
                last_exit = terminated.get("exitCode")
    parts = [
        meta.get("name", "?"),
        status.get("phase", "Unknown"),
        f"node {pod.get('spec', {}).get('nodeName') or '-'}",
        f"restarts {restarts}",
    ]
    if last_exit is not None:
        parts.append(f"last exit {last_exit}{' (preempted: saved and stopped)' if last_exit == 143 else ''}")
    parts.append(f"age {age(meta.get('creationTimestamp'), now)}")
    return "  ".join(parts)


def restart_summary(job: dict, pods: list[dict], events: list[dict]) -> list[str]:
    """Lines saying whether and how often the job came back: the operator's restarts (a Restarting
    condition, Restarting events), the kubelet's (container restart counts), and each pod."""
    lines = []
    conditions = (job.get("status") or {}).get("conditions") or []
    latest = max(conditions, key=lambda c: c.get("lastTransitionTime") or "", default=None)
    restarted = [e for e in events if "Restart" in (e.get("reason") or "")]
    times = sum(e.get("count") or 1 for e in restarted)
    if latest and latest.get("type") == "Restarting" and latest.get("status") == "True":
        lines.append(f"restarting now: {latest.get('message', '')}")
    if times:
        reason = restarted[-1].get("reason")
        lines.append(
            f"restarted {times} time(s) by the operator ({reason} events; recreated pods resume from the "
            "latest checkpoint)"
        )
    in_place = sum(
        c.get("restartCount", 0) for p in pods for c in (p.get("status") or {}).get("containerStatuses") or []
    )
    if in_place:
        lines.append(f"{in_place} container restart(s) in place (counted against runPolicy.backoffLimit)")
    if not times and not in_place and not lines:
        lines.append("no restarts")
    lines += [pod_line(p) for p in sorted(pods, key=lambda p: p.get("metadata", {}).get("name", ""))]
    return lines


def pod_selector(kind: str, name: str) -> str:
    """Label selector of every pod of the job, as each operator labels them."""
    if kind == "TrainJob":
        return f"jobset.sigs.k8s.io/jobset-name={name}"
    return f"training.kubeflow.org/job-name={name}"


def read_restarts(cluster, job: dict) -> list[str]:
    """restart_summary for a live job: its pods and its events, read through the cluster's API client."""
    core = cluster.core()
    pods = cluster.call(
        "list the pods of",
        core.list_namespaced_pod,
        cluster.namespace,
        label_selector=pod_selector(cluster.kind, cluster.name),
        _request_timeout=30,
    ).items
    events = cluster.call(
        "list the events of",
        core.list_namespaced_event,
        cluster.namespace,
        field_selector=f"involvedObject.name={cluster.name},involvedObject.kind={cluster.kind}",
        _request_timeout=30,
    ).items
    plain = cluster.api_client.sanitize_for_serialization
    return restart_summary(job, [plain(p) for p in pods], [plain(e) for e in events])
