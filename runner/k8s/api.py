"""The one module that talks to the Kubernetes API server.

Retries are policy: 5xx, 429 and connection errors are retried with tenacity (attempts and
backoff from settings); other 4xx fail fast. 409 on create and 404 on delete are answers, not
errors: deterministic names make creation idempotent and deletion of a gone pod a success.

Exec goes through ApiClients of its own, one per thread: the client library's ``stream()``
swaps the transport of the ApiClient it is given while it connects, so ordinary calls on a
shared client could be sent as websockets by another thread, and a lock around the connect
would let one stalled handshake hold up every session's exec. The library sets no timeout at
all, so every exec carries three: the connect (TCP, TLS and the upgrade answer), each frame
read or written, and the whole transfer; a server that accepts and never answers, or stops
mid-frame, costs one exec its deadline and nothing else.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import certifi
import urllib3
import websocket
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import ws_client
from kubernetes.stream.stream import _websocket_request
from kubernetes.stream.ws_client import ERROR_CHANNEL
from prometheus_client import CollectorRegistry

from runner import __version__
from runner.errors import UserError
from runner.metrics import ApiMetrics, verb_of
from runner.retry import RetryPolicy
from runner.settings import KubeSettings

# Every request says who sent it, so an operator (or the scale bench) can tell the runner's
# calls from everyone else's in the API server's audit log.
USER_AGENT = f"probe-runner/{__version__}"
R = TypeVar("R")
# An object as the API sends it and as the runner writes its manifests: plain JSON, camelCase.
Obj = dict[str, Any]
SESSION_REFRESH_SECONDS = 600.0  # how long an exec connection's TLS session is offered before a newer one replaces it


class QuotaExceeded(Exception):
    """The namespace's ResourceQuota refused a pod: it may admit it once other pods end."""


class Conflict(Exception):
    """A write made against an object's resourceVersion found it changed: read it again."""


class ExecError(Exception):
    """An exec that ran and failed, or a transfer that broke off; safe to try again."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        status: int = exc.status
        return status == 0 or status == 429 or status >= 500
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, ExecError))


class Tally:
    """Requests sent to the API server, by kind, and how many of them were retries; logged when
    a campaign's executor closes, so an operator sees its load and its retries per session. Each
    is counted into ``metrics`` by its verb as well, at the one place, so the two agree."""

    def __init__(self, metrics: ApiMetrics | None = None) -> None:
        self._lock = threading.Lock()
        self.sent: dict[str, int] = {}
        self.retried: dict[str, int] = {}
        self.metrics = metrics

    def add(self, kind: str, verb: str, attempt: int) -> None:
        """A request of ``kind`` (the log's word) and ``verb`` (the metrics'), the ``attempt``-th try of its call."""
        with self._lock:
            self.sent[kind] = self.sent.get(kind, 0) + 1
            if attempt > 1:
                self.retried[kind] = self.retried.get(kind, 0) + 1
        if self.metrics is not None:
            self.metrics.request(verb, attempt)

    def summary(self) -> str:
        with self._lock:
            return "; ".join(f"{kind} {n} ({self.retried.get(kind, 0)} retried)" for kind, n in sorted(self.sent.items()))


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
                return _named(client.ApiClient())
            except config.ConfigException:
                pass
        return _named(config.new_client_from_config(config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
                                                    context=settings.context))
    except (config.ConfigException, OSError) as e:
        raise UserError(f"kubernetes: no usable configuration ({e}); set RUNNER_KUBE__KUBECONFIG or run in a cluster") from None


def _named(api: client.ApiClient) -> client.ApiClient:
    api.user_agent = USER_AGENT
    return api


def _bounded_websocket_call(configuration: client.Configuration, method: str, url: str, headers: dict[str, str] | None = None,
                            _request_timeout: float | None = None, **_: object) -> ws_client.WSClient:
    """The exec transport of ``stream()`` (ws_client.websocket_call), with the connect bounded
    by ``_request_timeout``: the library's own opens the websocket blocking with no timeout.
    Its failures are the library's: ApiException with status 0 and the reason."""
    try:
        return _ConnectedWSClient(_open_websocket(configuration, ws_client.get_websocket_url(url), headers or {},
                                                  _request_timeout))
    except Exception as e:
        raise ApiException(status=0, reason=f"{type(e).__name__}: {e}") from None


class _ResumedSocket(ssl.SSLSocket):
    """An exec connection that leaves its session with its context (see _ResumingContext) once
    it holds a ticket: TLS 1.3 sends one after the handshake, so it is there once the upgrade's
    answer has been read. Left on a read, not at the close: websocket-client lets a connection
    the server closed go without closing it."""

    resume_key: tuple[object, ...] | None = None

    def read(self, len: int = 1024, buffer: Any = None) -> Any:  # recv and recv_into read through here
        got = super().read(len, buffer)
        if self.resume_key is not None:
            self._leave_session()
        return got

    def _leave_session(self) -> None:
        context, key = self.context, self.resume_key
        assert isinstance(context, _ResumingContext) and key is not None
        # A resumed connection leaves the held session in place while it is fresh: reading
        # this one's copies it (its certificates serialized and parsed again).
        if (self.session_reused and context.fresh(key)) or context.keep(key, self.session):
            self.resume_key = None


class _ResumingContext(ssl.SSLContext):
    """The exec connections' TLS context: each connection offers the session held for its
    server (TLS session resumption). Every exec is a new connection (a WebSocket upgrade takes
    its connection), and a full handshake costs the controller the server's certificate chain
    verified and the API server a signature, for each of a session's execs; resumed, the keys
    are agreed anew (TLS 1.3's PSK with ECDHE) without either (bench/exec_cost.py). A server
    that refuses the ticket (restarted, its ticket keys rotated, another replica behind the
    address) answers with a full handshake, verified as ever, whose session is held next; the
    session is offered only to the address and name it came from, and replaced by a newer one
    after SESSION_REFRESH_SECONDS."""

    sslsocket_class = _ResumedSocket
    _sessions: dict[tuple[object, ...], ssl.SSLSession]

    def fresh(self, key: tuple[object, ...]) -> bool:
        held = self._sessions.get(key)
        return held is not None and time.time() - held.time < SESSION_REFRESH_SECONDS

    def keep(self, key: tuple[object, ...], session: ssl.SSLSession | None) -> bool:
        """Hold ``session`` for the next connections to ``key``; False while it has no ticket."""
        if session is None or not session.has_ticket:
            return False
        self._sessions[key] = session
        return True

    def wrap_socket(self, sock: socket.socket, server_side: bool = False, do_handshake_on_connect: bool = True,
                    suppress_ragged_eofs: bool = True, server_hostname: str | bytes | None = None,
                    session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
        key = (server_hostname, sock.getpeername())
        wrapped = super().wrap_socket(sock, server_side, do_handshake_on_connect, suppress_ragged_eofs,
                                      server_hostname, session or self._sessions.get(key))
        assert isinstance(wrapped, _ResumedSocket)
        wrapped.resume_key = key
        return wrapped


@functools.lru_cache(maxsize=8)
def _tls_context(ca: str | None, check_hostname: bool, certfile: str | None, keyfile: str | None) -> _ResumingContext:
    """The TLS context of the exec connections, as websocket-client would build it from ssl
    options (``ca`` None: no verification), built once: websocket-client builds one per
    connection, loading the CA bundle each time, and that was about a sixth of the
    controller's CPU at 1,000 sessions at once (py-spy, bench/README.md). A CA or client
    certificate rotated on disk is read by a new controller, as the REST client's pool does."""
    context = _ResumingContext(ssl.PROTOCOL_TLS_CLIENT)
    context._sessions = {}
    if ca is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(cafile=ca)
        context.check_hostname = check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
    if certfile:
        context.load_cert_chain(certfile, keyfile)
    return context


def _open_websocket(configuration: client.Configuration, url: str, headers: dict[str, str],
                    timeout: float | None) -> websocket.WebSocket:
    """ws_client.create_websocket, with ``timeout`` on the connect (TCP, TLS, the upgrade)."""
    header = [f"authorization: {headers['authorization']}"] if "authorization" in headers else []
    header.append(f"user-agent: {headers.get('User-Agent') or USER_AGENT}")
    header.append(f"sec-websocket-protocol: {headers.get('sec-websocket-protocol') or f'{ws_client.V5_CHANNEL_PROTOCOL},{ws_client.V4_CHANNEL_PROTOCOL}'}")
    verify = url.startswith("wss://") and bool(configuration.verify_ssl)
    ssl_opts: dict[str, object] = {"context": _tls_context(
        configuration.ssl_ca_cert or certifi.where() if verify else None,
        True if not verify or configuration.assert_hostname is None else bool(configuration.assert_hostname),
        configuration.cert_file or None, configuration.key_file or None)}
    if configuration.tls_server_name:
        ssl_opts["server_hostname"] = configuration.tls_server_name
    connect_opt: dict[str, Any] = {"header": header, "timeout": timeout}
    if configuration.proxy or configuration.proxy_headers:
        connect_opt = ws_client.websocket_proxycare(connect_opt, configuration, url, headers)
    sock = websocket.WebSocket(sslopt=ssl_opts, skip_utf8_validation=False)
    sock.connect(url, **connect_opt)
    return sock


class _ConnectedWSClient(ws_client.WSClient):
    """The library's channel client over a websocket already connected (its own __init__
    connects, with no timeout); the attributes are those WSClient.__init__ sets."""

    def __init__(self, sock: websocket.WebSocket) -> None:
        self._channels: dict[int, bytes] = {}
        self._closed_channels: set[int] = set()
        self.binary = True
        self.newline = b"\n"
        # as WSClient.__init__ sets it without capture_all; the attribute's inferred type misses it
        self._all = ws_client._IgnoredIO()  # type: ignore[assignment]
        self.sock = sock
        self.subprotocol = getattr(sock, "subprotocol", None) or next(
            (v for k, v in (sock.getheaders() or {}).items() if k.lower() == "sec-websocket-protocol"), None)
        self._connected = True
        self._returncode = None


_exec_stream = functools.partial(_websocket_request, _bounded_websocket_call, None)


class Kube:
    def __init__(self, settings: KubeSettings, api_client: client.ApiClient | None = None,
                 exec_client: client.ApiClient | None = None, metrics: ApiMetrics | None = None):
        self.settings = settings
        self.namespace = settings.namespace
        self.api_client = api_client or load_api_client(settings)
        self.core = client.CoreV1Api(self.api_client)
        self.net = client.NetworkingV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.coordination = client.CoordinationV1Api(self.api_client)
        self.node_api = client.NodeV1Api(self.api_client)
        self._exec_config = (exec_client or self.api_client).configuration
        self._exec_local = threading.local()
        # counted where the process serves them (metrics.port), else on a registry nobody reads
        self.metrics = metrics if metrics is not None else ApiMetrics(CollectorRegistry())
        self.tally = Tally(self.metrics)
        self.retry = RetryPolicy(is_transient, settings.api_attempts, settings.api_backoff_seconds)

    def _exec_api(self) -> client.CoreV1Api:
        """This thread's exec client (see the module's docstring)."""
        api = getattr(self._exec_local, "api", None)
        if api is None:
            api = self._exec_local.api = client.CoreV1Api(_named(client.ApiClient(self._exec_config)))
        return api

    def call(self, fn: Callable[..., R], *args: object, **kwargs: object) -> R:
        """``fn(*args, **kwargs)`` under the retry policy. Its arguments are not checked against
        the client's signatures: those name the client's model classes as bodies, where the runner
        sends plain manifests, which the client serializes as they are."""
        verb = verb_of(getattr(fn, "__name__", ""))
        for attempt in self.retry.retrying():
            with attempt:
                self.tally.add("API requests", verb, attempt.retry_state.attempt_number)
                return fn(*args, **kwargs)
        raise AssertionError("unreachable: the retry policy ends by returning or raising")

    def answer(self, fn: Callable[..., Any], *args: object, **kwargs: object) -> bytes:
        """``fn``'s answer as the API server sent it (JSON), under the retry policy. The client
        builds a model of every answer, which the runner would turn back into a dict or drop:
        for each pod created and deleted that was 13% of the controller's samples holding the
        GIL at 1,000 sessions at once (py-spy --gil, bench/README.md)."""
        @functools.wraps(fn)  # its name: the metrics' verb
        def read() -> bytes:
            resp = fn(*args, _preload_content=False, **kwargs)  # an answer >= 300 raises as before, its body kept
            try:
                body: bytes = resp.read()
            finally:
                resp.release_conn()
            return body
        return self.call(read)

    # ---- pods --------------------------------------------------------------------------

    def create_pod(self, manifest: Obj) -> bool:
        """Create; False when a pod of that name exists already (ours: names are deterministic)."""
        try:
            self.answer(self.core.create_namespaced_pod, self.namespace, manifest, _request_timeout=30)
            return True
        except ApiException as e:
            if e.status == 409:
                return False
            if e.status == 403 and "exceeded quota" in str(e.body or ""):
                raise QuotaExceeded(_api_message(e)) from None
            raise

    def delete_pod(self, name: str, grace_seconds: int | None = None) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=grace_seconds) if grace_seconds is not None else None
        try:
            self.answer(self.core.delete_namespaced_pod, name, self.namespace, body=body, _request_timeout=30)
        except ApiException as e:
            if e.status != 404:
                raise

    def list_pods(self, label_selector: str) -> tuple[list[Obj], str | None]:
        """Pods as plain dicts (camelCase, as the API sends them) and the list's resourceVersion."""
        resp = json.loads(self.answer(self.core.list_namespaced_pod, self.namespace, label_selector=label_selector,
                                      _request_timeout=60))
        return resp.get("items") or [], resp["metadata"].get("resourceVersion")

    def watch_pods(self, label_selector: str, resource_version: str | None) -> Iterator[Obj]:
        """Events from ``resource_version`` on, as dicts ``{"type", "object"}``; ends when the
        server closes the watch. A 410 Gone surfaces as ApiException(410) for a re-list."""
        self.tally.add("watches", "watch", 1)
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

    def list_nodes(self) -> list[Obj]:
        """Every Node as a plain dict, in pages of 500 (a node's status lists up to 50 images).
        Nodes are cluster-scoped: an identity without the right to list them (a namespace's
        operator) gets a UserError saying so."""
        nodes: list[Obj] = []
        token: str | None = None
        while True:
            try:
                resp = self.call(self.core.list_node, limit=500, _continue=token, _request_timeout=60)
            except ApiException as e:
                if e.status == 403:
                    raise UserError(f"this identity may not list Nodes ({_api_message(e)})") from None
                raise
            nodes += [self.api_client.sanitize_for_serialization(n) for n in resp.items]
            token = resp.metadata._continue if resp.metadata is not None else None
            if not token:
                return nodes

    def runtime_class(self, name: str) -> Obj | None:
        """The RuntimeClass ``name`` as a plain dict, None where there is none. Cluster-scoped:
        an identity without the right to read it gets a UserError saying so."""
        try:
            rc = self.call(self.node_api.read_runtime_class, name, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status == 403:
                raise UserError(f"this identity may not read RuntimeClass {name} ({_api_message(e)})") from None
            raise
        found: Obj = self.api_client.sanitize_for_serialization(rc)
        return found

    def network_policies(self) -> list[Obj]:
        resp = self.call(self.net.list_namespaced_network_policy, self.namespace, _request_timeout=30)
        policies: list[Obj] = [self.api_client.sanitize_for_serialization(p) for p in resp.items]
        return policies

    def service_address(self, name: str) -> tuple[str, int]:
        """ClusterIP and first port of a Service: what a pod without DNS can connect to."""
        try:
            svc = self.call(self.core.read_namespaced_service, name, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                raise UserError(f"namespace {self.namespace}: no Service {name!r} (is the chart installed here?)") from None
            raise
        assert svc.spec is not None, "the API server sends every Service with its spec"
        ip = svc.spec.cluster_ip
        if not ip or ip == "None" or not svc.spec.ports:
            raise UserError(f"Service {self.namespace}/{name} has no ClusterIP and port to connect to")
        return ip, svc.spec.ports[0].port

    def _read_installed(self, read: Callable[..., R], kind: str, name: str) -> R:
        """An object the install made, read by name; missing, or not ours to read, is the user's
        to fix (a UserError in one line)."""
        try:
            return self.call(read, name, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status in (403, 404):
                raise UserError(f"reading {kind} {name} in namespace {self.namespace}: {_api_message(e)}") from None
            raise

    def secret_value(self, name: str, key: str) -> bytes:
        """One key of a Secret, decoded; a missing Secret, key or right is the user's to fix."""
        sec = self._read_installed(self.core.read_namespaced_secret, "Secret", name)
        value = (sec.data or {}).get(key)
        if not value:
            raise UserError(f"Secret {self.namespace}/{name} has no key {key!r}")
        return base64.b64decode(value)

    # ---- leases (the gateway's meters) ------------------------------------------------------

    def lease_annotations(self, name: str) -> dict[str, str] | None:
        """The annotations of Lease ``name``, or None where there is none."""
        lease = self.read_lease(name)
        return None if lease is None else dict(lease["metadata"].get("annotations") or {})

    def read_lease(self, name: str) -> Obj | None:
        """Lease ``name`` as a dict (its resourceVersion with it), or None where there is none."""
        try:
            read: Obj = json.loads(self.answer(self.coordination.read_namespaced_lease, name, self.namespace,
                                               _request_timeout=30))
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return read

    def list_leases(self, label_selector: str) -> list[Obj]:
        leases: list[Obj] = json.loads(self.answer(self.coordination.list_namespaced_lease, self.namespace,
                                                   label_selector=label_selector, _request_timeout=60)).get("items") or []
        return leases

    def write_lease(self, manifest: Obj) -> Obj:
        """Create the Lease, or replace it where ``manifest`` carries the resourceVersion it was
        read at (optimistic concurrency); Conflict where it exists already, or changed since."""
        try:
            if manifest["metadata"].get("resourceVersion"):
                out = self.answer(self.coordination.replace_namespaced_lease, manifest["metadata"]["name"], self.namespace,
                                  manifest, _request_timeout=30)
            else:
                out = self.answer(self.coordination.create_namespaced_lease, self.namespace, manifest, _request_timeout=30)
        except ApiException as e:
            if e.status == 409:
                raise Conflict(f"Lease {manifest['metadata']['name']} changed since it was read") from e
            raise
        written: Obj = json.loads(out)
        return written

    # ---- jobs --------------------------------------------------------------------------------

    def config_map_data(self, name: str) -> dict[str, str]:
        cm = self._read_installed(self.core.read_namespaced_config_map, "ConfigMap", name)
        return dict(cm.data or {})

    def create_job(self, manifest: Obj) -> bool:
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

    def _job(self, name: str) -> client.V1Job | None:
        """Job ``name``, or None where there is none (or the identity may not read it)."""
        try:
            return self.call(self.batch.read_namespaced_job, name, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status in (403, 404):
                return None
            raise

    def job_running(self, name: str) -> bool:
        """Whether Job ``name`` exists and has not ended (no Complete or Failed condition)."""
        job = self._job(name)
        if job is None:
            return False
        assert job.status is not None, "the API server sends every Job with its status"
        return not any(c.type in ("Complete", "Failed") and c.status == "True" for c in job.status.conditions or [])

    def job_command(self, name: str) -> list[str] | None:
        """The command of Job ``name``'s container, or None where there is no such Job (or the
        identity may not read it): nothing to compare."""
        job = self._job(name)
        if job is None:
            return None
        assert job.spec is not None and job.spec.template.spec is not None, "a Job has its pod template's spec"
        return list(job.spec.template.spec.containers[0].command or [])

    def namespace_exists(self) -> bool:
        try:
            self.call(self.core.read_namespace, self.namespace, _request_timeout=30)
            return True
        except ApiException as e:
            if e.status in (403, 404):
                return bool(e.status == 403)  # forbidden to read it, but it may exist: the create will tell
            raise

    # ---- exec ----------------------------------------------------------------------------

    def exec(self, pod: str, container: str, argv: list[str], stdin: bytes | None = None,
             timeout: float = 60.0) -> ExecResult:
        """Run ``argv`` in a container; raise ExecError when the transfer breaks off or passes a
        deadline: the connect (kube.exec_connect_timeout_seconds), one frame
        (kube.exec_frame_timeout_seconds) or the whole exec (``timeout`` seconds)."""
        started = time.monotonic()
        deadline = started + timeout
        try:
            resp = _exec_stream(self._exec_api().connect_get_namespaced_pod_exec, pod, self.namespace,
                                command=argv, container=container, stdin=stdin is not None, stdout=True, stderr=True,
                                tty=False, _preload_content=False, binary=True,
                                _request_timeout=self.settings.exec_connect_timeout_seconds)
        except ApiException as e:
            if e.status == 0:
                # The websocket library reports the API server's refusal of the upgrade as
                # status 0: a 4xx there (403 without the pods/exec verb) is not transient.
                m = re.search(r"Handshake status (\d{3})", str(e.reason))
                refused = int(m.group(1)) if m else 0
                if 400 <= refused < 500 and refused != 429:
                    raise ApiException(status=refused, reason=f"exec {container} in {pod}: {str(e.reason)[-400:]}") from None
                raise ExecError(f"exec {container} in {pod}: no connection after {time.monotonic() - started:.1f} s: "
                                f"{e.reason or 'timed out'}") from None
            raise
        frame = self.settings.exec_frame_timeout_seconds

        def bounded() -> None:
            """The socket's timeout for the next frame: the frame limit, within the deadline."""
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecError(f"exec {container} in {pod}: no end after {timeout:g} s")
            resp.sock.settimeout(min(frame, left))

        out, err = bytearray(), bytearray()
        try:
            if stdin is not None:
                view = memoryview(stdin)
                for i in range(0, len(view), 1 << 20):
                    bounded()
                    resp.write_stdin(bytes(view[i:i + (1 << 20)]))
                bounded()
                resp.close_channel(0)
            while resp.is_open():
                bounded()
                resp.update(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
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
        except websocket.WebSocketTimeoutException:
            raise ExecError(f"exec {container} in {pod}: a frame took more than {frame:g} s "
                            f"(or the exec more than {timeout:g} s)") from None
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
        message: str = json.loads(e.body or "")["message"]  # no body: a ValueError, as for one not JSON
        return message
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
