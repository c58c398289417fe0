"""A real Prometheus (Debian's package, installed by .ci/setup) for the tiers that check the
metrics as an operator's monitoring would see them (issue 31, item 1): started with a config of
the test's own, waited for until it is ready and has tried every target it discovered once,
queried with PromQL through its HTTP API, stopped at the end.

``prefix`` runs it elsewhere than this process's namespaces: the node tier starts it with
``nsenter --net=<the node's namespace>``, on the node itself, as a monitoring agent on a node
would scrape pods there."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ports import free_port  # tests/ is on the path (tests/conftest.py)

from support.waiting import stopped, until

PROMETHEUS = "/usr/bin/prometheus"


@dataclass
class Prometheus:
    base: str     # http://host:port
    log: Path

    def get(self, path: str, **params: Any) -> Any:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (at ``at``, a Unix time, or now)."""
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=promql, **({"time": at} if at else {}))["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        active: list[dict[str, Any]] = self.get("/api/v1/targets")["activeTargets"]
        return active

    def seen(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


def by(result: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    """A PromQL vector as {label values: value}."""
    return {tuple(r["metric"].get(label, "") for label in labels): float(r["value"][1]) for r in result}


@contextlib.contextmanager
def prometheus(config: dict[str, Any], work: Path, host: str = "127.0.0.1", port: int | None = None,
               prefix: Sequence[str] = (), targets: int | None = None) -> Iterator[Prometheus]:
    """Prometheus with ``config`` listening on ``host``:``port`` (a free one of this machine's
    if not given: where ``prefix`` moves it elsewhere, give one); ready, and (``targets``
    given) once that many targets are active and each was scraped once, up or not."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = port or free_port(host)
    log = work / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*prefix, PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address={host}:{port}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    served = Prometheus(f"http://{host}:{port}", log)
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"Prometheus exited {proc.returncode}:\n{served.seen()}"
            try:
                with urllib.request.urlopen(f"{served.base}/-/ready", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        until(ready, 60, "Prometheus ready", interval=0.2, seen=served.seen)
        if targets is not None:  # its targets are applied some seconds after its start
            until(lambda: len(active := served.targets()) == targets and all(t["health"] != "unknown" for t in active),
                  60, f"Prometheus scraping {targets} target(s)", interval=0.2, seen=lambda: served.targets())
        yield served
    finally:
        stopped(proc, 30)
