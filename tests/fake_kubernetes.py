"""A Kubernetes API server on 127.0.0.1, in-process and plain HTTP, for the few calls `launch
kubeflow` makes through the official `kubernetes` client: create, read and delete a namespaced
custom object (the CRDs of tests/k8s-crds, validated as a strict API server validates them), list
pods by label and events by field, and read (and follow) a container's log.

    with FakeKubernetes() as kube:
        env = {"KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig"))}
        ... `launch kubeflow` ...                       # submits into kube.jobs
        kube.set_status("default", "run", {"conditions": [...]})
        kube.add_pod("default", "run-master-0", {...labels}, log_lines=["step 1"])
        kube.append_log("default", "run-master-0", "step 2"); kube.finish_pod("default", "run-master-0")
        assert not kube.problems

It answers as the real server does where the product can tell: JSON objects the client's own models
read (its pod and event answers are checked against them), `Status` objects on errors with the real
reasons and messages (NotFound `pytorchjobs.kubeflow.org "run" not found`, AlreadyExists, Invalid,
BadRequest `strict decoding error: unknown field ...` under fieldValidation=Strict), a bearer token
checked on every request (401 without it), and a followed log streamed in chunks as lines are
appended until the pod finishes. Everything the product sends that a real server would refuse or that
`launch kubeflow` has no reason to send lands in `problems`; `errors[verb] = (code, reason, message)`
makes one kind of call fail (verbs: create, get, delete, list pods, log, list events).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml
from k8s_schemas import _load_yaml, crd_validator, schema_dir

TOKEN = "fake-kubernetes-token"
FINISHED = ("Succeeded", "Failed")
# Fields the API server adds to an object on create.
SERVER_METADATA = ("uid", "creationTimestamp", "resourceVersion", "generation")
# Query parameters the real API accepts on each verb (anything else is a problem).
QUERY = {
    "create": {"fieldValidation", "fieldManager", "dryRun", "pretty"},
    "get": {"pretty", "resourceVersion"},
    "delete": {"gracePeriodSeconds", "propagationPolicy", "orphanDependents", "dryRun", "pretty"},
    "list pods": {"labelSelector", "fieldSelector", "limit", "continue", "resourceVersion", "timeoutSeconds", "pretty"},
    "list events": {
        "labelSelector",
        "fieldSelector",
        "limit",
        "continue",
        "resourceVersion",
        "timeoutSeconds",
        "pretty",
    },
    "log": {
        "container",
        "follow",
        "previous",
        "sinceSeconds",
        "sinceTime",
        "tailLines",
        "timestamps",
        "limitBytes",
        "pretty",
        "insecureSkipTLSVerifyBackend",
    },
}
CUSTOM = re.compile(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?")
PODS = re.compile(r"/api/v1/namespaces/([^/]+)/pods")
LOG = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log")
EVENTS = re.compile(r"/api/v1/namespaces/([^/]+)/events")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def rfc3339(when: datetime | None = None) -> str:
    return (when or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def served_resources() -> dict[tuple[str, str, str], str]:
    """(group, version, plural) -> kind of every namespaced, served CRD version in the schema folder."""
    found = {}
    for path in sorted(schema_dir().glob("*.y*ml")):
        for doc in _load_yaml(path):
            for crd in doc.get("items", []) if doc.get("kind") == "List" else [doc]:
                spec = crd.get("spec", {}) if crd.get("kind") == "CustomResourceDefinition" else {}
                if spec.get("scope") != "Namespaced":
                    continue
                for version in spec["versions"]:
                    if version.get("served", True):
                        found[(spec["group"], version["name"], spec["names"]["plural"])] = spec["names"]["kind"]
    return found


class ApiError(Exception):
    """An answer with a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        answer = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            answer["details"] = self.details
        return answer


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    """NotFound as the real server says it: `pytorchjobs.kubeflow.org "run" not found`, `pods "x" not found`."""
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        404, "NotFound", f'{qualified} "{name}" not found', {"name": name, "group": group, "kind": resource}
    )


def parse_selector(text: str) -> list[tuple[str, str, str | None]]:
    """[(key, op, value)] of an equality-based selector: k=v, k==v, k!=v, k (exists), !k (absent)."""
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        found = re.fullmatch(r"([^=!\s]+)\s*(==|!=|=)\s*(\S*)", term)
        if found:
            terms.append((found.group(1), "!=" if found.group(2) == "!=" else "=", found.group(3)))
        elif re.fullmatch(r"!?[^=!\s()]+", term):
            terms.append((term.lstrip("!"), "!" if term.startswith("!") else "exists", None))
        else:
            raise ValueError(term)
    return terms


def matches(terms: list[tuple[str, str, str | None]], lookup) -> bool:
    for key, op, value in terms:
        have = lookup(key)
        if (op == "=" and have != value) or (op == "!=" and have == value):
            return False
        if (op == "exists" and have is None) or (op == "!" and have is not None):
            return False
    return True


def field(obj: dict, path: str):
    """The value at a dotted field path (involvedObject.name), as a string; None when absent."""
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return None if obj is None else str(obj)


def unknown_fields(errors) -> list[tuple[list, str]]:
    """[(path to the object, unknown key)] of the schema's additionalProperties errors."""
    found = []
    for error in errors:
        known = error.schema.get("properties", {})
        patterns = error.schema.get("patternProperties", {})
        for key in error.instance:
            if key not in known and not any(re.search(p, key) for p in patterns):
                found.append((list(error.absolute_path), key))
    return found


class FakeKubernetes:
    """The API server; the tests' side is plain methods (set_status, add_pod, append_log, finish_pod,
    forget, add_event) and the recorded `requests`/`calls` and `problems`."""

    def __init__(self, resources=None, namespaces=None, token: str = TOKEN):
        """resources: the 'plural.group/version's served (default: every namespaced CRD of tests/k8s-crds);
        namespaces: those that exist (default: any)."""
        everything = served_resources()
        self.resources = {
            key: kind
            for key, kind in everything.items()
            if resources is None or f"{key[2]}.{key[0]}/{key[1]}" in set(resources)
        }
        self.namespaces = None if namespaces is None else set(namespaces)
        self.token = token
        self.jobs: dict[tuple[str, str, str], dict] = {}  # ("pytorchjobs.kubeflow.org", ns, name) -> object
        self.pods: dict[tuple[str, str], dict] = {}  # (ns, name) -> Pod
        self.logs: dict[tuple[str, str, str], list[str]] = {}  # (ns, pod, container) -> lines
        self.events: dict[str, list[dict]] = {}  # ns -> Events
        self.requests: list[dict] = []  # method, path, query, body, headers
        self.problems: list[str] = []
        self.errors: dict[str, tuple[int, str, str]] = {}
        self.changed = threading.Condition()  # the lock of all the above; notified when logs or pods change
        self.closing = False
        self._version = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.fake = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    # --- lifetime --------------------------------------------------------------------------------
    def start(self) -> FakeKubernetes:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()  # followed logs end
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def kubeconfig(self, path: Path, namespace: str | None = None, token: str | None = None) -> Path:
        """A kubeconfig whose current context is this server, with bearer-token auth."""
        context = {"cluster": "fake", "user": "tester", **({"namespace": namespace} if namespace else {})}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "contexts": [{"name": "fake", "context": context}],
            "users": [{"name": "tester", "user": {"token": token or self.token}}],
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config))
        return path

    # --- the tests' side -------------------------------------------------------------------------
    @property
    def calls(self) -> list[tuple[str, str]]:
        return [(r["method"], r["path"]) for r in self.requests]

    def job(self, namespace: str, name: str) -> dict:
        """The one stored job of that name (any kind); KeyError when none."""
        with self.changed:
            found = [obj for (_, ns, n), obj in self.jobs.items() if (ns, n) == (namespace, name)]
        if len(found) != 1:
            raise KeyError(f"{len(found)} jobs {namespace}/{name} stored: {sorted(self.jobs)}")
        return found[0]

    def set_status(self, namespace: str, name: str, status: dict) -> None:
        """What the operator would write to the job's status subresource."""
        with self.changed:
            self.job(namespace, name)["status"] = copy.deepcopy(status)

    def add_pod(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str],
        phase: str = "Running",
        container: str = "pytorch",
        log_lines=(),
        node_name: str = "gpu-node-1",
        restart_count: int = 0,
        last_exit_code: int | None = None,
        created: datetime | None = None,
    ) -> dict:
        """A pod as the operator creates it and the kubelet reports it; its container's log so far."""
        state = {"running": {"startedAt": rfc3339()}} if phase == "Running" else {}
        if phase == "Pending":
            state = {"waiting": {"reason": "ContainerCreating"}}
        status = {"name": container, "image": "trainer:latest", "imageID": "sha256:0", "ready": phase == "Running"}
        status.update(restartCount=restart_count, state=state)
        if last_exit_code is not None:
            status["lastState"] = {"terminated": {"exitCode": last_exit_code, "reason": "Error"}}
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "labels": dict(labels),
                "creationTimestamp": rfc3339(created),
            },
            "spec": {"containers": [{"name": container, "image": "trainer:latest"}], "nodeName": node_name},
            "status": {"phase": phase, "containerStatuses": [status]},
        }
        with self.changed:
            self.pods[(namespace, name)] = pod
            self.logs[(namespace, name, container)] = [str(line) for line in log_lines]
            self.changed.notify_all()
        return pod

    def append_log(self, namespace: str, pod: str, *lines: str, container: str | None = None) -> None:
        with self.changed:
            container = container or self.pods[(namespace, pod)]["spec"]["containers"][0]["name"]
            self.logs[(namespace, pod, container)].extend(map(str, lines))
            self.changed.notify_all()

    def finish_pod(self, namespace: str, pod: str, phase: str = "Succeeded", exit_code: int = 0) -> None:
        """The pod's containers end: a followed log ends once its lines are out."""
        with self.changed:
            obj = self.pods[(namespace, pod)]
            obj["status"]["phase"] = phase
            for status in obj["status"]["containerStatuses"]:
                status["state"] = {
                    "terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
                }
                status["ready"] = False
            self.changed.notify_all()

    def add_event(
        self, namespace: str, kind: str, name: str, reason: str, message: str = "", count: int = 1, type: str = "Normal"
    ) -> None:
        """An event about an object (the operator's Restarting events, say)."""
        event = {
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
            "reason": reason,
            "message": message,
            "count": count,
            "type": type,
            "source": {"component": "fake-operator"},
            "firstTimestamp": rfc3339(),
            "lastTimestamp": rfc3339(),
        }
        with self.changed:
            self.events.setdefault(namespace, []).append(event)

    def forget(self, namespace: str, name: str) -> None:
        """The job and its pods are gone, as after ttlSecondsAfterFinished."""
        with self.changed:
            key = next((k for k in self.jobs if k[1:] == (namespace, name)), None)
            if key is None:
                raise KeyError(f"no job {namespace}/{name}")
            self._remove(key)

    def get(self, path: str, token: str | None = None) -> tuple[int, dict | str]:
        """GET a path of this server as a client would: (HTTP status, JSON answer or text)."""
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token or self.token}"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as answer:
                code, body, kind = answer.status, answer.read(), answer.headers.get_content_type()
        except urllib.error.HTTPError as exc:
            code, body, kind = exc.code, exc.read(), exc.headers.get_content_type()
        return code, json.loads(body) if kind == "application/json" else body.decode()

    # --- the server's side -----------------------------------------------------------------------
    def _remove(self, key: tuple[str, str, str]) -> dict:
        """Delete a job and (garbage collection) the pods it owns; call with the lock held."""
        obj = self.jobs.pop(key)
        _, namespace, name = key
        owner = "jobset.sigs.k8s.io/jobset-name" if obj["kind"] == "TrainJob" else "training.kubeflow.org/job-name"
        for ns, pod in [
            k for k, p in self.pods.items() if k[0] == namespace and p["metadata"]["labels"].get(owner) == name
        ]:
            del self.pods[(ns, pod)]
        self.changed.notify_all()
        return obj

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _check_query(self, verb: str, query: dict) -> None:
        unknown = sorted(set(query) - QUERY[verb])
        if unknown:
            self.problems.append(f"{verb}: query parameters a real API server does not know: {unknown}")
        if verb in self.errors:
            raise ApiError(*self.errors[verb])

    def _namespace(self, namespace: str) -> None:
        if self.namespaces is not None and namespace not in self.namespaces:
            raise not_found("namespaces", namespace)

    def answer(self, method: str, path: str, query: dict, body) -> tuple[int, dict | list[str]]:
        """(HTTP status, JSON object), or for a log (200, [namespace, pod, container]) to stream; raises ApiError."""
        custom, pods, log, events = (p.fullmatch(path) for p in (CUSTOM, PODS, LOG, EVENTS))
        if custom:
            group, version, namespace, plural, name = custom.groups()
            if (group, version, plural) not in self.resources:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            verb = {("POST", False): "create", ("GET", True): "get", ("DELETE", True): "delete"}.get(
                (method, name is not None)
            )
            if verb is None:
                self.problems.append(f"{method} {path}: launch kubeflow only creates, gets and deletes one job")
                raise ApiError(405, "MethodNotAllowed", f"{method} is not served here")
            self._check_query(verb, query)
            self._namespace(namespace)
            return getattr(self, f"_{verb}")(group, version, plural, namespace, name, query, body)
        if method != "GET" or not (pods or log or events):
            self.problems.append(f"{method} {path}: not a call launch kubeflow makes")
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        if log:
            self._check_query("log", query)
            return 200, self._log(*log.groups(), query)
        verb, namespace = ("list pods", pods.group(1)) if pods else ("list events", events.group(1))
        self._check_query(verb, query)
        try:
            labels = parse_selector(query.get("labelSelector", ""))
            fields = parse_selector(query.get("fieldSelector", ""))
        except ValueError as exc:
            self.problems.append(f"{verb}: a selector term this server does not parse: {exc}")
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {exc}") from None
        if pods:
            items = [
                p
                for (ns, _), p in sorted(self.pods.items())
                if ns == namespace
                and matches(labels, p["metadata"]["labels"].get)
                and matches(fields, lambda f, p=p: field(p, f))
            ]
            answer = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": self._next_version()}}
            return 200, self._checked("V1PodList", {**answer, "items": copy.deepcopy(items)})
        if labels:
            self.problems.append(f"list events: events have no labels to select on ({query['labelSelector']})")
        items = [e for e in self.events.get(namespace, []) if matches(fields, lambda f, e=e: field(e, f))]
        answer = {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": self._next_version()}}
        return 200, self._checked("CoreV1EventList", {**answer, "items": copy.deepcopy(items)})

    def _checked(self, model: str, answer: dict) -> dict:
        """The answer, after checking the client's model reads it (else a problem of this server's)."""
        from kubernetes import client

        try:
            getattr(client, model).from_dict(answer)
        except Exception as exc:  # pydantic's ValidationError, or the generator's ValueError
            self.problems.append(f"this server's {model} answer does not fit the client's model: {exc}")
        return answer

    def _create(self, group, version, plural, namespace, name, query, body) -> tuple[int, dict]:
        kind = self.resources[(group, version, plural)]
        if not isinstance(body, dict):
            self.problems.append(f"create {plural}: the body is not a JSON object")
            raise ApiError(400, "BadRequest", "the body of the request was in an unknown format")
        if (body.get("apiVersion"), body.get("kind")) != (f"{group}/{version}", kind):
            self.problems.append(f"create {plural}: body is {body.get('apiVersion')} {body.get('kind')}")
            raise ApiError(400, "BadRequest", f"the API version in the data ({body.get('apiVersion')}) does not match")
        meta = body.setdefault("metadata", {})
        if meta.setdefault("namespace", namespace) != namespace:
            self.problems.append(f"create: metadata.namespace {meta['namespace']} on a request to {namespace}")
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        name = meta.get("name") or ""
        invalid = f'{kind}.{group} "{name}" is invalid: '
        if not name or len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
            raise ApiError(422, "Invalid", invalid + f"metadata.name: Invalid value: {name!r}", {"name": name})
        strict = query.get("fieldValidation") == "Strict"
        if not strict:
            self.problems.append(f"create {plural}: no fieldValidation=Strict, a misspelt field would be dropped")
        errors = list(crd_validator(body["apiVersion"], kind).iter_errors(body))
        unknown = unknown_fields(e for e in errors if e.validator == "additionalProperties")
        invalid_values = [e for e in errors if e.validator != "additionalProperties"]
        if invalid_values:
            causes = [
                f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: Invalid value: {e.message}" for e in invalid_values
            ]
            raise ApiError(
                422, "Invalid", invalid + "[" + ", ".join(sorted(causes)) + "]", {"name": name, "kind": kind}
            )
        if unknown and strict:
            named = ", ".join(f'unknown field "{".".join(map(str, [*where, key]))}"' for where, key in unknown)
            raise ApiError(400, "BadRequest", f"strict decoding error: {named}")
        for where, key in unknown:  # Warn (the default) and Ignore drop them
            target = body
            for step in where:
                target = target[step]
            target.pop(key, None)
        resource = f"{plural}.{group}"
        if (resource, namespace, name) in self.jobs:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{resource} "{name}" already exists',
                {"name": name, "group": group, "kind": plural},
            )
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=rfc3339(), resourceVersion=self._next_version())
        meta["generation"] = 1
        body["status"] = {}
        self.jobs[(resource, namespace, name)] = body
        return 201, copy.deepcopy(body)

    def _get(self, group, version, plural, namespace, name, query, body) -> tuple[int, dict]:
        found = self.jobs.get((f"{plural}.{group}", namespace, name))
        if found is None:
            raise not_found(plural, name, group)
        return 200, copy.deepcopy(found)

    def _delete(self, group, version, plural, namespace, name, query, body) -> tuple[int, dict]:
        policy = (body or {}).get("propagationPolicy") or query.get("propagationPolicy")
        if policy == "Orphan" or (body or {}).get("orphanDependents"):
            self.problems.append(f"delete {plural}/{name}: propagation {policy!r} leaves the job's pods running")
        key = (f"{plural}.{group}", namespace, name)
        if key not in self.jobs:
            raise not_found(plural, name, group)
        return 200, self._remove(key)

    def _log(self, namespace: str, pod: str, query: dict) -> list[str]:
        obj = self.pods.get((namespace, pod))
        if obj is None:
            raise not_found("pods", pod)
        names = [c["name"] for c in obj["spec"]["containers"]]
        container = query.get("container") or (names[0] if len(names) == 1 else None)
        if container not in names:
            self.problems.append(f"log of {pod}: container {query.get('container')!r}, the pod has {names}")
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {pod}")
        if obj["status"]["phase"] == "Pending":
            raise ApiError(
                400, "BadRequest", f'container "{container}" in pod "{pod}" is waiting to start: ContainerCreating'
            )
        return [namespace, pod, container]

    def follow_lines(self, namespace: str, pod: str, container: str, follow: bool):
        """The log's lines as they come: all so far, then (follow) each appended one until the pod
        finishes, is deleted or the server stops."""
        sent = 0
        while True:
            with self.changed:
                if follow:
                    self.changed.wait_for(
                        lambda sent=sent: self.closing
                        or len(self.logs.get((namespace, pod, container), [])) > sent
                        or (namespace, pod) not in self.pods
                        or self.pods[(namespace, pod)]["status"]["phase"] in FINISHED,
                        timeout=60,
                    )
                lines = self.logs.get((namespace, pod, container), [])
                new, sent = lines[sent:], len(lines)
                obj = self.pods.get((namespace, pod))
                done = not follow or self.closing or obj is None or obj["status"]["phase"] in FINISHED
            if new:
                yield "".join(line + "\n" for line in new)
            if done:
                return


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streams for a followed log
    timeout = 30

    def _serve(self, method: str) -> None:
        fake: FakeKubernetes = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        with fake.changed:
            fake.requests.append(
                {
                    "method": method,
                    "path": url.path,
                    "query": query,
                    "body": body,
                    "headers": dict(self.headers.items()),
                }
            )
            try:
                if self.headers.get("Authorization") != f"Bearer {fake.token}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                # No Content-Type (the client sends none) is JSON to the real server too.
                if raw and self.headers.get("Content-Type", "application/json").split(";")[0] != "application/json":
                    fake.problems.append(f"{method} {url.path}: body sent as {self.headers.get('Content-Type')}")
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
                code, answer = fake.answer(method, url.path, query, body)
            except ApiError as exc:
                code, answer = exc.code, exc.status()
        if isinstance(answer, list):  # a log: (namespace, pod, container)
            self._stream(fake.follow_lines(*answer, follow=query.get("follow") == "true"))
            return
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for text in chunks:
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away (a logs --follow interrupted)
            self.close_connection = True

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_DELETE(self):
        self._serve("DELETE")

    def do_PUT(self):
        self._serve("PUT")

    def do_PATCH(self):
        self._serve("PATCH")

    def log_message(self, *args):
        pass
