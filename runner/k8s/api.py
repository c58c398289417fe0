"""The one module that talks to the Kubernetes API server.

Retries are policy: 5xx, 429 and connection errors are retried with tenacity (attempts and
backoff from settings); other 4xx fail fast. 409 on create and 404 on delete are answers, not
errors: deterministic names make creation idempotent and deletion of a gone pod a success.

Exec goes through its own ApiClient: the client library's ``stream()`` swaps the transport of
the ApiClient it is given while it connects, so ordinary calls on a shared client could be sent
as websockets by another thread. Connection set-up is serialised; the transfers themselves run
concurrently and each carries its own timeout, because the library has none by default.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream as k8s_stream
from kubernetes.stream.ws_client import ERROR_CHANNEL

from runner.errors import UserError
from runner.retry import RetryPolicy
from runner.settings import KubeSettings


class ExecError(Exception):
    """An exec that ran and failed, or a transfer that broke off; safe to try again."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status == 0 or exc.status == 429 or exc.status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, ExecError))


@dataclass
class ExecResult:
    stdout: bytes
    stderr: bytes
    code: int


def load_api_client(settings: KubeSettings) -> client.ApiClient:
    """A client from the kubeconfig (workstation) or the pod's service account (in cluster)."""
    try:
        if settings.kubeconfig is None and settings.context is None:
            try:
                config.load_incluster_config()
                return client.ApiClient()
            except config.ConfigException:
                pass
        return config.new_client_from_config(config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                                             context=settings.context)
    except (config.ConfigException, OSError) as e:
        raise UserError(f"kubernetes: no usable configuration ({e}); set RUNNER_KUBE__KUBECONFIG or run in a cluster") from None


class Kube:
    def __init__(self, settings: KubeSettings, api_client: client.ApiClient | None = None,
                 exec_client: client.ApiClient | None = None):
        self.settings = settings
        self.namespace = settings.namespace
        self.api_client = api_client or load_api_client(settings)
        self.core = client.CoreV1Api(self.api_client)
        self.net = client.NetworkingV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self._exec_core = client.CoreV1Api(exec_client or self._clone(self.api_client))
        self._exec_setup = threading.Lock()
        self.attempts = 0  # API attempts made, retries included (the bench reads it)
        self.retry = RetryPolicy(is_transient, settings.api_attempts, settings.api_backoff_seconds)

    @staticmethod
    def _clone(api: client.ApiClient) -> client.ApiClient:
        return client.ApiClient(api.configuration)

    def call(self, fn, *args, **kwargs):
        for attempt in self.retry.retrying():
            with attempt:
                self.attempts += 1
                return fn(*args, **kwargs)

    # ---- pods --------------------------------------------------------------------------

    def create_pod(self, manifest: dict) -> bool:
        """Create; False when a pod of that name exists already (ours: names are deterministic)."""
        try:
            self.call(self.core.create_namespaced_pod, self.namespace, manifest, _request_timeout=30)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            raise

    def delete_pod(self, name: str, grace_seconds: int | None = None) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=grace_seconds) if grace_seconds is not None else None
        try:
            self.call(self.core.delete_namespaced_pod, name, self.namespace, body=body, _request_timeout=30)
        except ApiException as e:
            if e.status != 404:
                raise

    def list_pods(self, label_selector: str) -> tuple[list[dict], str]:
        """Pods as plain dicts (camelCase, as the API sends them) and the list's resourceVersion."""
        resp = self.call(self.core.list_namespaced_pod, self.namespace, label_selector=label_selector,
                         _request_timeout=60)
        items = [self.api_client.sanitize_for_serialization(p) for p in resp.items]
        return items, resp.metadata.resource_version

    def watch_pods(self, label_selector: str, resource_version: str) -> Iterator[dict]:
        """Events from ``resource_version`` on, as dicts ``{"type", "object"}``; ends when the
        server closes the watch. A 410 Gone surfaces as ApiException(410) for a re-list."""
        w = watch.Watch()
        timeout = self.settings.watch_timeout_seconds
        for event in w.stream(self.core.list_namespaced_pod, self.namespace, label_selector=label_selector,
                              resource_version=resource_version, timeout_seconds=timeout,
                              allow_watch_bookmarks=True, _request_timeout=timeout + 30, deserialize=False):
            obj = event.get("raw_object") or event.get("object")
            if event.get("type") == "ERROR":
                code = obj.get("code", 500) if isinstance(obj, dict) else 500
                raise ApiException(status=code, reason=str(obj.get("message", "watch error") if isinstance(obj, dict) else obj))
            yield {"type": event["type"], "object": obj}

    def network_policies(self) -> list[dict]:
        resp = self.call(self.net.list_namespaced_network_policy, self.namespace, _request_timeout=30)
        return [self.api_client.sanitize_for_serialization(p) for p in resp.items]

    def service_address(self, name: str) -> tuple[str, int]:
        """ClusterIP and first port of a Service: what a pod without DNS can connect to."""
        try:
            svc = self.call(self.core.read_namespaced_service, name, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                raise UserError(f"namespace {self.namespace}: no Service {name!r} (is the chart installed here?)") from None
            raise
        ip = svc.spec.cluster_ip
        if not ip or ip == "None" or not svc.spec.ports:
            raise UserError(f"Service {self.namespace}/{name} has no ClusterIP and port to connect to")
        return ip, svc.spec.ports[0].port

    # ---- jobs --------------------------------------------------------------------------------

    def config_map_data(self, name: str) -> dict[str, str]:
        try:
            cm = self.call(self.core.read_namespaced_config_map, name, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status in (403, 404):
                raise UserError(f"reading ConfigMap {name} in namespace {self.namespace}: {_api_message(e)}") from None
            raise
        return dict(cm.data or {})

    def create_job(self, manifest: dict) -> bool:
        """Create; False when a Job of that name exists already (a campaign submitted before)."""
        try:
            self.call(self.batch.create_namespaced_job, self.namespace, manifest, _request_timeout=30)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            if e.status in (403, 404):  # the user's identity or namespace: theirs to fix, in one line
                raise UserError(f"creating Job {manifest['metadata']['name']} in namespace {self.namespace}: "
                                f"{_api_message(e)}") from None
            raise

    def namespace_exists(self) -> bool:
        try:
            self.call(self.core.read_namespace, self.namespace, _request_timeout=30)
            return True
        except ApiException as e:
            if e.status in (403, 404):
                return e.status == 403  # forbidden to read it, but it may exist: the create will tell
            raise

    # ---- exec ----------------------------------------------------------------------------

    def exec(self, pod: str, container: str, argv: list[str], stdin: bytes | None = None,
             timeout: float = 60.0) -> ExecResult:
        """Run ``argv`` in a container; raise ExecError when the transfer breaks off or times out."""
        with self._exec_setup:
            try:
                resp = k8s_stream(self._exec_core.connect_get_namespaced_pod_exec, pod, self.namespace,
                                  command=argv, container=container, stdin=stdin is not None, stdout=True,
                                  stderr=True, tty=False, _preload_content=False, binary=True)
            except ApiException as e:
                if e.status == 0:
                    # The websocket library reports the API server's refusal of the upgrade as
                    # status 0: a 4xx there (403 without the pods/exec verb) is not transient.
                    m = re.search(r"Handshake status (\d{3})", str(e.reason))
                    code = int(m.group(1)) if m else 0
                    if 400 <= code < 500 and code != 429:
                        raise ApiException(status=code, reason=f"exec {container} in {pod}: {str(e.reason)[-400:]}") from None
                    raise ExecError(f"exec {container} in {pod}: {e.reason}") from None
                raise
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            if stdin is not None:
                view = memoryview(stdin)
                for i in range(0, len(view), 1 << 20):
                    resp.write_stdin(bytes(view[i:i + (1 << 20)]))
                resp.close_channel(0)
            while resp.is_open():
                if time.monotonic() > deadline:
                    raise ExecError(f"exec {container} in {pod}: no end after {timeout:g} s")
                resp.update(timeout=1)
                if resp.peek_stdout():
                    out += resp.read_stdout()
                if resp.peek_stderr():
                    err += resp.read_stderr()
            out += resp.read_stdout() if resp.peek_stdout() else b""
            err += resp.read_stderr() if resp.peek_stderr() else b""
            status = resp.read_channel(ERROR_CHANNEL)
            code = exit_code(status)
        except ExecError:
            raise
        except Exception as e:  # websocket errors of every kind: the transfer broke off
            raise ExecError(f"exec {container} in {pod}: {type(e).__name__}: {e}") from None
        finally:
            resp.close()
        if code is None:
            said = status.decode(errors="replace")[:300] if isinstance(status, bytes) else str(status)[:300]
            raise ExecError(f"exec {container} in {pod}: no exit status ({said or 'the connection closed'})")
        return ExecResult(bytes(out), bytes(err), code)


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{e.status} {e.reason}"


def exit_code(status: bytes | str) -> int | None:
    """The exit code from an exec's status message; None when there is none (a broken-off
    transfer: nothing it returned can be trusted to be whole)."""
    if not status:
        return None
    try:
        st = json.loads(status)
    except ValueError:
        return None
    if st.get("status") == "Success":
        return 0
    for cause in (st.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause["message"])
    m = re.search(r"exit status (\d+)", str(st.get("message", "")))  # KWOK and some runtimes say only this
    return int(m.group(1)) if m else None
