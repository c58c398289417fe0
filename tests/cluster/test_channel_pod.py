"""Issue 6, part 1, in the pod layout: the session's Bash calls try every route into the stream
(tests/integration/channel_attack.py: reopen fd 1 of every ancestor, write every descriptor
under /proc/*/fd, pidfd_getfd, ptrace with an injected write, process_vm_writev,
/proc/PID/mem) while the real CLI runs in the harness container of a session pod on the
simulated cluster, and the reader in the other container keeps the stream. Not one forged
byte may reach the stored stream, and the session must still complete."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runner import layout
from runner.campaign import run_sessions
from runner.demo.provider import ScriptedProvider
from runner.executors.kubernetes import KubernetesExecutor
from runner.k8s.api import Kube
from runner.ledger import Ledger
from runner.store import open_store

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from simnode import SimNode  # noqa: E402
from test_channel import MARKER, PROBE, REPORT_LINE, ROUTES, SCENARIOS, channel_corpus, channel_plan  # noqa: E402
from test_kubernetes_executor import _env, _settings, _uid, _wait_no_pods, claude_path, namespace, nodes, sim_root  # noqa: E402,F401


def test_no_route_of_the_session_reaches_the_stream_in_a_pod(kube_cluster, nodes, namespace, sim_root, tmp_path,  # noqa: F811
                                                             claude_path):  # noqa: F811  (fixtures, imported above)
    corpus = channel_corpus(tmp_path / "corpus")
    campaign = f"channel-{_uid()}"
    plan = channel_plan(campaign)
    store_uri = (tmp_path / "store").as_uri()
    with ScriptedProvider(SCENARIOS) as provider, \
            SimNode(kube_cluster.api_client(), namespace, sim_root, [claude_path]) as sim:
        settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__BASE_URL=provider.base_url,
                                  RUNNER_PROVIDER__API_KEY="demo-key"))
        store = open_store(store_uri, settings)
        executor = KubernetesExecutor(settings, Kube(settings.kube))
        try:
            run_sessions(plan, corpus, store, executor, tmp_path / "work", 1, [])
        finally:
            executor.close()
        assert not sim.errors, sim.errors
    (state,) = Ledger(store, campaign).sessions().values()
    assert state.status == "succeeded", (state.detail, sim.logs())
    raw = store.get(layout.SessionKeys(campaign, PROBE["id"], "present-001").stream)
    assert MARKER not in raw
    lines = [json.loads(line) for line in raw.splitlines()]
    assert lines[-1]["type"] == "result" and not lines[-1]["is_error"]
    results = [b["content"] for o in lines if o.get("type") == "user"
               for b in o["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    reports = [m.groupdict() for text in results for line in (text if isinstance(text, str) else "").splitlines()
               if (m := REPORT_LINE.match(line))]
    assert {r["route"] for r in reports} == set(ROUTES), results
    for r in reports:  # no route yielded a descriptor or a tracee that could write
        assert "WROTE" not in r["outcome"] and "ATTACHED" not in r["outcome"], r
    # The reader (another uid, outside the container's PID namespace) is not among what the session saw.
    seen = " ".join(r["outcome"] for r in reports if r["route"] == "processes")
    assert "runner.entrypoints.pod reader" not in seen, seen
    _wait_no_pods(kube_cluster, namespace)
