"""The pod watch against the real API server: a controller whose ServiceAccount may not list
pods (a chart installed without its Role, a token for the wrong account) is told so at once,
with the API server's own reason, instead of looping on the refusal in the background and
failing 120 s later with a generic error (issue 13, item 4)."""

from __future__ import annotations

import secrets
import time

import pytest
from kubernetes import client

from runner.errors import UserError
from runner.k8s.api import Kube
from runner.k8s.podcache import PodCache
from runner.settings import KubeSettings


def test_a_controller_without_rights_on_pods_is_refused_at_once_with_the_reason(kube_cluster):
    ns = f"no-rbac-{secrets.token_hex(3)}"
    kube_cluster.kubectl("create", "namespace", ns)
    kube_cluster.kubectl("-n", ns, "create", "serviceaccount", "controller")
    token = kube_cluster.kubectl("-n", ns, "create", "token", "controller", "--duration=1h").stdout.strip()
    admin = kube_cluster.api_client().configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = admin.host, admin.ssl_ca_cert, admin.verify_ssl
    cfg.api_key = {"authorization": f"Bearer {token}"}
    api = client.ApiClient(cfg)
    cache = PodCache(Kube(KubeSettings(namespace=ns), api_client=api, exec_client=api), "app=x")
    t0 = time.monotonic()
    with pytest.raises(UserError) as refused:
        cache.start()
    assert time.monotonic() - t0 < 10
    assert f'403 Forbidden: pods is forbidden: User "system:serviceaccount:{ns}:controller" cannot list resource ' \
           f'"pods" in API group "" in the namespace "{ns}"' in str(refused.value)
