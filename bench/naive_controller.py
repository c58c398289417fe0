"""The baseline of bench/controller.py: the obvious way to run sessions as pods.

For each session, in a pool of CONCURRENCY threads: seal the workspace (as the controller
does), create the same session pod, deliver the workspace by exec (again after a refused
exec), poll the pod with a GET
every POLL seconds until its harness container has terminated, read the harness container's
log in one request, store it, delete the pod. No watch, no ledger, no verification: what the
controller adds is measured against this.

    python bench/naive_controller.py PLAN CORPUS STORE_DIR CONCURRENCY   (settings from RUNNER_*)
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runner.entrypoints.pod import deliver_argv
from runner.executors.kubernetes import _workspace_tar
from runner.k8s import manifests, podstate
from runner.k8s.api import ExecError, Kube
from runner.k8s.policy import route_service_name, session_route_url
from runner.plan import load_plan
from runner.seal import seal
from runner.settings import load_settings

POLL = 0.5


def main(plan_path: str, corpus: str, store_dir: str, concurrency: str) -> int:
    settings = load_settings()
    plan = load_plan(Path(plan_path))
    kube = Kube(settings.kube)
    proxy = manifests.Route(settings.provider.base_url,
                            proxy=session_route_url(settings, kube.service_address(route_service_name(settings))[0]))
    out = Path(store_dir)
    out.mkdir(parents=True, exist_ok=True)

    def one(spec) -> int:
        probe = plan.probe(spec.probe)
        sealed = seal(Path(corpus), plan, probe, spec.arm, out / "work" / spec.probe / spec.name)
        pod = manifests.session_pod(settings, plan, spec.probe, spec.name, 1, probe.task, proxy)
        name = pod["metadata"]["name"]
        kube.create_pod(pod)
        while not podstate.running(kube.api_client.sanitize_for_serialization(
                kube.core.read_namespaced_pod(name, kube.namespace)), "reader"):
            time.sleep(POLL)
        tar = _workspace_tar(sealed.path, settings.kube.harness_uid)
        while True:  # a new pod's exec can be refused for a moment: try again, as anyone would
            try:
                kube.exec(name, "reader", deliver_argv(), stdin=tar)
                break
            except ExecError:
                time.sleep(POLL)
        while podstate.terminated(kube.api_client.sanitize_for_serialization(
                kube.core.read_namespaced_pod(name, kube.namespace)), "harness") is None:
            time.sleep(POLL)
        log = kube.core.read_namespaced_pod_log(name, kube.namespace, container="harness", _preload_content=False).data
        (out / f"{name}.jsonl").write_bytes(log)
        kube.delete_pod(name)
        return len(log)

    with ThreadPoolExecutor(max_workers=int(concurrency)) as pool:
        sizes = list(pool.map(one, plan.sessions()))
    print(f"naive: {len(sizes)} sessions, {sum(sizes)} log bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
