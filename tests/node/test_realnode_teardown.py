"""The real node's teardown (tests/node/realnode.py) on this host's own cgroup file systems.

Issue 29: "the node tier leaves cgroups behind: each run leaves an empty unified/prn-* cgroup
(the teardown skips the cgroup2 unified hierarchy)". runc makes each container's group in the
cgroup2 hierarchy too, under the kubelet's cgroupRoot; the teardown now removes the node's tree
from every hierarchy: a tree shaped as the kubelet's, made here for real."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import realnode  # noqa: E402

UNIFIED = realnode.CGROUP_ROOT / "unified"


def _rmtree(top: Path) -> None:
    for d in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        d.rmdir()
    top.rmdir()


def test_the_teardown_removes_the_nodes_cgroups_from_the_unified_hierarchy_too():
    # the node tier's hosts mount cgroup v1 for the kubelet and cgroup2 beside it (env: machines/)
    assert (UNIFIED / "cgroup.controllers").exists() and UNIFIED in realnode._all_hierarchies()
    name = f"prn-t{secrets.token_hex(3)}"
    tops = [UNIFIED / name, *(h / name for h in realnode._cgroup_hierarchies())]
    (UNIFIED / name / "kubepods" / "besteffort" / "pod-x").mkdir(parents=True)
    for top in tops[1:]:
        (top / "kubepods").mkdir(parents=True)
    try:
        assert realnode._remove_cgroup_tree(name) == []
        assert [top for top in tops if top.exists()] == []
    finally:
        for top in tops:
            if top.exists():
                _rmtree(top)
