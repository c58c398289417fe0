"""doctor --cluster's runtime line (issue 31, item 4: "doctor --cluster reports the session
runtime"): the nodes' default, a RuntimeClass that is missing (every session pod would be
refused), one that exists with its handler, and gVisor's, which asks for the harness image's
gVisor variant."""

from __future__ import annotations

import pytest

from runner.doctor import session_runtime
from runner.errors import UserError

GVISOR_NOTE = (": gVisor's sandbox; the harness image must be its gVisor variant (images.harness "
               "ghcr.io/probe-runner/harness:<version>-gvisor: gVisor loads only readable executables)")


@pytest.mark.parametrize(("name", "runtime_class", "expected"), [
    (None, None, "session pods run under each node's default runtime (kube.runtime_class unset: runc where containerd's "
                 "default is); session.runtimeClassName: gvisor runs them in gVisor's sandbox"),
    ("gvisor", {"handler": "runsc"}, "session pods run under RuntimeClass gvisor (handler runsc)" + GVISOR_NOTE),
    ("sandboxed", {"handler": "runsc-kvm"}, "session pods run under RuntimeClass sandboxed (handler runsc-kvm)" + GVISOR_NOTE),
    ("gv", {"handler": "gvisor"}, "session pods run under RuntimeClass gv (handler gvisor)" + GVISOR_NOTE),
    ("kata", {"handler": "kata-qemu"}, "session pods run under RuntimeClass kata (handler kata-qemu)"),
])
def test_the_runtime_line_names_the_runtime_class_and_its_handler(name, runtime_class, expected):
    assert session_runtime(name, runtime_class) == expected


def test_a_runtime_class_that_does_not_exist_fails_with_what_to_do():
    with pytest.raises(UserError) as e:
        session_runtime("gvisor", None)
    assert str(e.value) == ("RuntimeClass gvisor does not exist: the API server refuses every session pod naming it "
                            "(create it, or set session.runtimeClassName to one that exists: kubectl get runtimeclass)")
