"""The chart's API Priority and Fairness objects (templates/flowcontrol.yaml) in a real
kube-apiserver: the controller's and the gateway's ServiceAccounts are classified into the
install's FlowSchema and priority level (the API server says so in every answer's
X-Kubernetes-PF-* headers), and under contention a campaign's requests and the cluster's other
clients each keep their share.

Contention is made real and cheap on a 2-core machine: this module starts a control plane of its
own whose API server has 60 seats (--max-requests-inflight 45 + --max-mutating-requests-inflight 15,
instead of 600), and a validating admission webhook (on loopback, in this process) holds every pod
creation in the test's namespaces for HOLD seconds before refusing it. A held request keeps its
seat while it waits and costs no CPU, so a few dozen threads fill a priority level, nothing is
created, and the webhook sees how many of each identity's requests are held at once (the seats
that identity has). The cluster's other clients are other ServiceAccounts (impersonated by the
admin), in the cluster's service-accounts schema and workload-low level, where the controller's
identity lands without the chart's objects.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import ssl
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import config as k8s_config
from kubernetes.client import Configuration

from tests.support.builds import CONTROL_PLANE
from tests.support.certs import self_signed
from tests.support.helm import render
from tests.support.waiting import until

sys.path.insert(0, str(Path(__file__).parent))
from conftest import KubeCluster, start_cluster  # noqa: E402

HOLD = 0.5  # seconds the webhook holds each pod creation, and with it the request's seat
SEATS = {"max-requests-inflight": "45", "max-mutating-requests-inflight": "15"}  # 60 seats, not 600
HOLD_LABEL = "probe-runner.io/test-hold"
PF_FLOW_SCHEMA, PF_PRIORITY_LEVEL = "X-Kubernetes-PF-FlowSchema-UID", "X-Kubernetes-PF-PriorityLevel-UID"
WARMUP = 12.0  # seconds of flood before measuring: the API server redistributes lendable seats every 10 s
WINDOW = 10.0  # seconds measured


# ---- the slow webhook ------------------------------------------------------------------------------


@dataclass
class Holder:
    """An admission webhook that holds each request HOLD seconds, then refuses it, counting how
    many of each user's requests it holds at once."""

    server: ThreadingHTTPServer
    ca_pem: bytes
    lock: threading.Lock = field(default_factory=threading.Lock)
    held: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    most: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/hold"

    def reset(self) -> None:
        with self.lock:
            self.most.clear()

    def hold(self, user: str) -> None:
        with self.lock:
            self.held[user] += 1
            self.most[user] = max(self.most[user], self.held[user])
        try:
            time.sleep(HOLD)
        finally:
            with self.lock:
                self.held[user] -= 1


def _start_holder(tmp: Path) -> Holder:
    cert, key = self_signed("probe-runner-test-hold")
    (tmp / "hold.crt").write_bytes(cert)
    (tmp / "hold.key").write_bytes(key)
    holder: Holder

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            holder.hold(review["request"]["userInfo"]["username"])
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                "uid": review["request"]["uid"], "allowed": False, "status": {"code": 403, "message": "held"}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer.request_queue_size = 256
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp / "hold.crt", tmp / "hold.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    holder = Holder(server=server, ca_pem=cert)
    threading.Thread(target=server.serve_forever, daemon=True, name="hold-webhook").start()
    return holder


# ---- clients ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Identity:
    """Who a request is sent as: a ServiceAccount token, or the admin impersonating a user."""

    user: str
    headers: tuple[tuple[str, str], ...]
    admin_cert: bool


@dataclass(frozen=True)
class Answer:
    user: str
    start: float
    end: float
    status: int
    priority_level: str | None

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Api:
    """Plain HTTPS to the API server, one connection per thread: the PF headers of each answer."""

    def __init__(self, cluster: KubeCluster):
        conf = Configuration()
        k8s_config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=conf)
        host, port = conf.host.removeprefix("https://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.ca, self.cert, self.key = conf.ssl_ca_cert, conf.cert_file, conf.key_file
        self.local = threading.local()

    def _conn(self, admin_cert: bool) -> http.client.HTTPSConnection:
        conns = self.local.__dict__.setdefault("conns", {})
        if admin_cert not in conns:
            ctx = ssl.create_default_context(cafile=self.ca)
            if admin_cert:
                ctx.load_cert_chain(self.cert, self.key)
            conns[admin_cert] = http.client.HTTPSConnection(self.host, self.port, context=ctx, timeout=120)
        return conns[admin_cert]

    def request(self, who: Identity, method: str, path: str, body: dict | None = None) -> tuple[Answer, bytes]:
        headers = dict(who.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self._conn(who.admin_cert)
        start = time.monotonic()
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            content = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self.local.conns.pop(who.admin_cert, None)
            raise
        return Answer(who.user, start, time.monotonic(), resp.status, resp.getheader(PF_PRIORITY_LEVEL)), content

    def headers_of(self, who: Identity, path: str) -> tuple[int, str | None, str | None]:
        conn = self._conn(who.admin_cert)
        conn.request("GET", path, headers=dict(who.headers))
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader(PF_FLOW_SCHEMA), resp.getheader(PF_PRIORITY_LEVEL)


def _pod() -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "held-"},
            "spec": {"containers": [{"name": "c", "image": "example.invalid/none"}]}}


class Flood:
    """``depth`` pod creations of each identity in flight at once, in ``namespace``, from start
    to stop: each is held by the webhook and refused, so it holds a seat HOLD seconds."""

    def __init__(self, api: Api, namespace: str, identities: list[Identity], depth: int):
        self.api, self.path = api, f"/api/v1/namespaces/{namespace}/pods"
        self.stopping = threading.Event()
        self.answers: list[Answer] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(who,), daemon=True)
                        for who in identities for _ in range(depth)]

    def _run(self, who: Identity) -> None:
        while not self.stopping.is_set():
            try:
                answer, _ = self.api.request(who, "POST", self.path, _pod())
            except BaseException as e:  # noqa: BLE001 - reported by stop()
                self.errors.append(e)
                return
            self.answers.append(answer)

    def start(self) -> Flood:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> list[Answer]:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, f"a flood request failed: {self.errors[:3]}"
        return self.answers


@dataclass
class Served:
    """What one side got in the measured window."""

    answers: list[Answer]
    window: float

    @property
    def per_second(self) -> float:
        return len(self.answers) / self.window

    @property
    def p95(self) -> float:
        return statistics.quantiles([a.seconds for a in self.answers], n=20)[-1] if len(self.answers) > 1 else float("inf")

    def statuses(self) -> set[int]:
        return {a.status for a in self.answers}

    def levels(self) -> set[str | None]:
        return {a.priority_level for a in self.answers}

    def __str__(self) -> str:
        return (f"{len(self.answers)} answers ({self.per_second:.1f}/s), p95 {self.p95:.2f} s, "
                f"max {max((a.seconds for a in self.answers), default=0):.2f} s, statuses {sorted(self.statuses())}")


def served(answers: list[Answer], users: set[str], start: float, end: float) -> Served:
    return Served([a for a in answers if a.user in users and start <= a.end <= end], end - start)


# ---- fixtures --------------------------------------------------------------------------------------

@dataclass
class Setup:
    cluster: KubeCluster
    api: Api
    holder: Holder
    namespace: str
    release: str
    objects: list[dict]
    controller: Identity
    gateway: Identity
    others_namespace: str

    def other(self, i: int) -> Identity:
        user = f"system:serviceaccount:{self.others_namespace}:client-{i}"
        return Identity(user, (("Impersonate-User", user),), admin_cert=True)

    def uid(self, kind: str, name: str) -> str:
        return self.cluster.kubectl("get", kind, name, "-o", "jsonpath={.metadata.uid}").stdout


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("apf")
    holder = _start_holder(tmp)
    with start_cluster(CONTROL_PLANE.built(), tmp / "cluster", SEATS) as cluster:
        uid = secrets.token_hex(3)
        namespace, release, others = f"apf-{uid}", f"pr-{uid}", f"others-{uid}"
        for ns in (namespace, others):
            cluster.create_namespace(ns)
            cluster.kubectl("label", "namespace", ns, f"{HOLD_LABEL}=true")
        # The chart's identities, their RBAC and its flowcontrol objects: what these tests need of it.
        objs = render(release=release, namespace=namespace, extra=("--skip-tests",))
        kinds = ("ServiceAccount", "Role", "RoleBinding", "FlowSchema", "PriorityLevelConfiguration")
        cluster.apply([o for o in objs if o["kind"] in kinds])
        # The other clients may create pods in their namespace (which the webhook holds, as ours).
        cluster.apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "create-pods", "namespace": others},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "create-pods", "namespace": others},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "create-pods"},
             "subjects": [{"kind": "Group", "name": f"system:serviceaccounts:{others}",
                           "apiGroup": "rbac.authorization.k8s.io"}]},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": f"hold-{uid}"},
             "webhooks": [{"name": "hold.probe-runner.test", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                           "failurePolicy": "Fail", "timeoutSeconds": 10, "matchPolicy": "Equivalent",
                           "clientConfig": {"url": holder.url, "caBundle": base64.b64encode(holder.ca_pem).decode()},
                           "namespaceSelector": {"matchLabels": {HOLD_LABEL: "true"}},
                           "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                      "resources": ["pods"]}]}]},
        ])

        def token(account: str) -> Identity:
            t = cluster.kubectl("-n", namespace, "create", "token", account, "--duration=1h").stdout.strip()
            return Identity(f"system:serviceaccount:{namespace}:{account}", (("Authorization", f"Bearer {t}"),),
                            admin_cert=False)

        s = Setup(cluster, Api(cluster), holder, namespace, release, objs, token(f"{release}-controller"),
                  token(f"{release}-gateway"), others)
        # the webhook is in force once a creation is held and refused by it
        until(lambda: s.api.request(s.controller, "POST", f"/api/v1/namespaces/{namespace}/pods", _pod())[0].status == 403
              and holder.most[s.controller.user] > 0, 30, "the hold webhook in force")
        yield s
        holder.server.shutdown()


def _metric(setup: Setup, name: str) -> dict[str, float]:
    """{priority_level: value} of one apiserver_flowcontrol_* gauge."""
    out = {}
    for line in setup.cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            level = dict(kv.split("=", 1) for kv in labels.split(","))["priority_level"].strip('"')
            out[level] = float(value)
    return out


def _report(setup: Setup, nominal: dict[str, float], ours: Served, theirs: Served) -> None:
    """The figures, shown with -s and with a failure."""
    others = max(n for u, n in setup.holder.most.items() if u != setup.controller.user)
    print(f"\nnominal seats: {nominal}\ncontroller: {ours}, at most {setup.holder.most[setup.controller.user]} held at once"
          f"\nothers: {theirs}, at most {others} of one client held at once")


# ---- tests -----------------------------------------------------------------------------------------

def test_the_controller_and_gateway_identities_are_classified_into_the_install_s_priority_level(setup):
    """The API server answers each request with the UIDs of the FlowSchema and the priority level
    it was classified into: the chart's for the controller's and the gateway's tokens; the cluster's
    service-accounts and workload-low for another account of the same namespace (session pods'),
    and for another namespace's."""
    (schema,) = [o for o in setup.objects if o["kind"] == "FlowSchema"]
    name = schema["metadata"]["name"]
    ours = (setup.uid("flowschema", name), setup.uid("prioritylevelconfiguration", name))
    theirs = (setup.uid("flowschema", "service-accounts"), setup.uid("prioritylevelconfiguration", "workload-low"))
    assert all(ours) and all(theirs) and ours != theirs
    pods = f"/api/v1/namespaces/{setup.namespace}/pods"
    for who in (setup.controller, setup.gateway):
        assert setup.api.headers_of(who, pods) == (200, *ours), who.user
    session = f"system:serviceaccount:{setup.namespace}:{setup.release}-session"
    for user in (session, setup.other(0).user):
        _, *classified = setup.api.headers_of(Identity(user, (("Impersonate-User", user),), True), pods)
        assert tuple(classified) == theirs, user
    # a request that its Role does not allow is classified all the same (APF runs before authorization)
    status, *classified = setup.api.headers_of(setup.controller, "/api/v1/namespaces/kube-system/secrets")
    assert status == 403 and tuple(classified) == ours


def _flood_both(setup: Setup, ours_depth: int, others: int, others_depth: int) -> tuple[Served, Served]:
    """The controller's identity (``ours_depth`` requests in flight) and ``others`` other
    ServiceAccounts (``others_depth`` each) flood at once; what each side got in the window."""
    other_ids = [setup.other(i) for i in range(others)]
    setup.holder.reset()
    theirs = Flood(setup.api, setup.others_namespace, other_ids, others_depth).start()
    ours = Flood(setup.api, setup.namespace, [setup.controller], ours_depth).start()
    time.sleep(WARMUP)
    start = time.monotonic()
    setup.holder.reset()
    time.sleep(WINDOW)
    end = time.monotonic()
    answers = ours.stop() + theirs.stop()
    return (served(answers, {setup.controller.user}, start, end),
            served(answers, {o.user for o in other_ids}, start, end))


def test_a_flood_of_other_clients_does_not_starve_the_controller(setup):
    """48 other ServiceAccounts keep 2 held requests each in flight (96: four times the seats of
    the API server's workload-low level) while the controller's identity keeps 8, a campaign's
    pod creations. In the install's level the controller is served at about its seats' rate (each
    held HOLD); in workload-low it is one flow of 49, with a 49th of the seats (measured without
    the chart's objects: 2.7 answers/s against 8.7, p95 5.3 s against 1.8, some turned away)."""
    name = [o for o in setup.objects if o["kind"] == "FlowSchema"][0]["metadata"]["name"]
    nominal = _metric(setup, "apiserver_flowcontrol_nominal_limit_seats")
    ours, theirs = _flood_both(setup, ours_depth=8, others=48, others_depth=2)
    _report(setup, nominal, ours, theirs)
    assert ours.levels() == {setup.uid("prioritylevelconfiguration", name)}
    assert theirs.levels() == {setup.uid("prioritylevelconfiguration", "workload-low")}
    assert ours.statuses() == {403} and theirs.statuses() == {403}  # held and refused by the webhook, none turned away (429)
    # The controller gets at least half its nominal seats' rate, and 95% of its requests within 4 s.
    assert ours.per_second >= 0.5 * nominal[name] / HOLD, ours
    assert ours.p95 <= 4.0, ours
    # The flood was real: the other clients had every seat of workload-low and more.
    assert theirs.per_second >= nominal["workload-low"] / HOLD * 0.8, theirs


def test_a_flood_from_the_controller_does_not_starve_other_clients(setup):
    """The controller's identity keeps 60 held requests in flight, twelve times its level's
    nominal seats, while 4 other ServiceAccounts keep 2 each: the others are served as fast as
    their holds allow, and the controller never holds more seats than its level's nominal plus
    borrowingLimitPercent of it. (Without the chart's objects the others are served too, by
    workload-low's fair queuing between users, but the controller's one identity takes some 30
    of the level's seats: the cap below is what the install's level adds.)"""
    (level,) = [o for o in setup.objects if o["kind"] == "PriorityLevelConfiguration"]
    name, limited = level["metadata"]["name"], level["spec"]["limited"]
    nominal = _metric(setup, "apiserver_flowcontrol_nominal_limit_seats")
    ours, theirs = _flood_both(setup, ours_depth=60, others=4, others_depth=2)
    _report(setup, nominal, ours, theirs)
    assert ours.levels() == {setup.uid("prioritylevelconfiguration", name)}
    assert theirs.levels() == {setup.uid("prioritylevelconfiguration", "workload-low")}
    assert ours.statuses() == {403} and theirs.statuses() == {403}
    # Each other client's 2 requests in flight are served at about 2 per HOLD: at least half that.
    assert theirs.per_second >= 0.5 * 8 / HOLD, theirs
    assert theirs.p95 <= 5.0, theirs
    # The controller was served, and held at most its level's seats with what it may borrow.
    cap = nominal[name] * (1 + limited["borrowingLimitPercent"] / 100)
    assert 0 < setup.holder.most[setup.controller.user] <= cap, dict(setup.holder.most)
    assert ours.per_second >= 0.5 * nominal[name] / HOLD, ours
