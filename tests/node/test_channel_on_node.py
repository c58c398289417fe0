"""The recorder contract: "The standard output of the harness process is such a channel, because
the session holds no handle on the parent's pipe." The channel attacks of
tests/integration/channel_attack.py in a real session pod: submitted
with ``probe-runner submit`` into the installed chart, the real Claude Code CLI in the harness
image on the real node (containerd, runc, the RuntimeDefault seccomp profile, the restricted
Pod Security Standard), the reader in the other container. Each Bash call of the session
tries one route into the stream: reopen fd 1 of every ancestor, write every descriptor under
/proc/*/fd, pidfd_getfd, ptrace with an injected write, process_vm_writev, /proc/PID/mem,
and the same calls against the attacker itself. Not one forged byte may reach the stored
stream, the session must still complete, and each route must be closed by what the pod
actually enforces: the kernel's answers here are real, not a simulation's. The same session
runs under runc and in gVisor's sandbox (issue 31, item 4), whose kernel answers otherwise."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys

import pytest
import test_channel as channel

from runner import layout
from runner.k8s import jobs

pytestmark = pytest.mark.timeout(900)


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module", params=["runc", "gvisor"])
def session(request, provider, bucket, tmp_path_factory):
    """The channel session, in the node's default runtime (runc) and in gVisor's sandbox."""
    install = request.getfixturevalue("install" if request.param == "runc" else "gvisor_install")
    tmp = tmp_path_factory.mktemp("channel")
    user = install.settings_env(tmp)
    campaign = f"channel-{secrets.token_hex(3)}"
    (tmp / "plan.json").write_text(json.dumps(channel.channel_plan_data(campaign)))
    corpus = channel.channel_corpus(tmp / "corpus")
    submitted = _cli(user, "submit", str(tmp / "plan.json"), "--corpus", str(corpus))
    assert submitted.returncode == 0, submitted.stderr
    watched = _cli(user, "status", campaign, "--watch", "--interval", "2", timeout=600)
    job_logs = install.node.kubectl("-n", install.namespace, "logs", f"job/{jobs.job_name(campaign)}",
                                    check=False).stdout
    assert watched.returncode == 0, watched.stderr + job_logs
    status = json.loads(_cli(user, "status", campaign, "--json").stdout)
    _, s3 = bucket
    keys = layout.SessionKeys(campaign, channel.PROBE["id"], "present-001")
    raw = s3.get_object(Bucket="probes", Key=keys.stream)["Body"].read()
    lines = [json.loads(line) for line in raw.splitlines()]
    results = [b["content"] for o in lines if o.get("type") == "user"
               for b in o["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    reports = [m.groupdict() for text in results for line in (text if isinstance(text, str) else "").splitlines()
               if (m := channel.REPORT_LINE.match(line))]
    capture = json.loads(s3.get_object(Bucket="probes", Key=keys.capture)["Body"].read())
    return {"status": status, "raw": raw, "lines": lines, "results": results, "reports": reports,
            "capture": capture, "job_logs": job_logs, "runtime": request.param}


def outcomes(session, route: str, comm: str | None = None) -> list[str]:
    return [r["outcome"] for r in session["reports"] if r["route"] == route and (comm is None or r["comm"] == comm)]


def test_no_forged_byte_reaches_the_stream_and_the_session_completes(session):
    assert session["status"]["sessions"] == {"succeeded": 1}, (session["status"], session["job_logs"])
    assert channel.MARKER not in session["raw"]
    assert {o["type"] for o in session["lines"]} <= {"system", "assistant", "user", "result", "rate_limit_event"}
    last = session["lines"][-1]
    assert last["type"] == "result" and last["subtype"] == "success" and not last["is_error"]
    assert session["capture"]["exit_code"] == 0
    assert len(session["results"]) == len(channel.ROUTES), session["results"]
    assert {r["route"] for r in session["reports"]} == set(channel.ROUTES)


def test_no_process_of_the_pod_yields_a_writable_descriptor(session):
    # Under runc the CLI and the entry point are not dumpable: /proc refuses every route. Under
    # gVisor every process is dumpable (its loader cannot keep an execute-only one) and /proc/PID/fd
    # is open to a process's descendants, so a descriptor of the CLI that is a pipe may be written
    # (its standard input, read to its end before any tool ran; the pipes its tools answer on,
    # which carry what the session itself writes): the stream is a socket, which /proc never
    # reopens (ENXIO), and no process can be attached or have its memory opened
    # (docs/security.md, "The stream under runc and under gVisor").
    holes = "WROTE|ATTACHED|OPEN" if session["runtime"] == "runc" else "ATTACHED|OPEN"
    for route in ("reopen-fd1", "any-fd", "pidfd-getfd", "ptrace", "vm-write", "proc-mem"):
        for outcome in outcomes(session, route):
            assert not re.search(holes, outcome), (route, outcome, session["reports"])
    if session["runtime"] == "gvisor":
        (cli,) = outcomes(session, "any-fd", "claude")
        assert "1=ENXIO" in cli.split(", "), cli


def test_the_harness_refuses_every_route(session):
    # The CLI (comm "claude") is the attacker's ancestor and holds the stream's socket.
    expected = {
        "runc": {"reopen-fd1": "EACCES", "proc-mem": "EACCES",  # not dumpable: /proc refuses
                 "pidfd-getfd": "EPERM", "ptrace": "EPERM", "vm-write": "EPERM"},  # seccomp (and the access check)
        # gVisor: the stream is a socket (ENXIO); Yama's relational scope keeps an ancestor's
        # memory from its descendants; gVisor has no pidfd_open (ENOSYS), seccomp refuses the rest
        "gvisor": {"reopen-fd1": "ENXIO", "proc-mem": "EACCES",
                   "pidfd-getfd": "pidfd_open ENOSYS", "ptrace": "EPERM", "vm-write": "EPERM"},
    }[session["runtime"]]
    for route, errno_name in expected.items():
        assert outcomes(session, route, "claude") == [errno_name], (route, session["reports"])


def test_seccomp_refuses_the_calls_where_no_access_check_would(session):
    pidfd = "pidfd_getfd(self) EPERM" if session["runtime"] == "runc" else "pidfd_getfd(self) pidfd_open ENOSYS"
    assert outcomes(session, "controls") == [pidfd, "process_vm_writev(self) EPERM", "ptrace(TRACEME) EPERM",
                                             "Seccomp:\t2"]


def test_the_session_sees_only_its_own_container(session):
    # The reader runs in the other container, under another uid: not in the session's PID
    # namespace. What the session sees is the entry point, the CLI and its own calls.
    visible = {r["pid"]: r["outcome"] for r in session["reports"] if r["route"] == "processes"}
    assert not any("runner.entrypoints.pod reader" in cmd for cmd in visible.values()), visible
    programs = {cmd.split()[0] for cmd in visible.values()}
    assert programs <= {"python3", "/opt/runner/bin/python3", "claude", "/bin/sh", "/bin/bash"}, visible
