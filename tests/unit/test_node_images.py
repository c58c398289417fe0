"""runner/k8s/images.py (issue 31, item 5): an image reference matched against what a node
reports (by tag, or by digest where the reference names one, both sides normalised as the
runtime does), and the nodes session pods may land on (their nodeSelector and tolerations, as
the scheduler decides), so that `doctor --cluster` names the session nodes that lack an image;
and doctor's line from them."""

from __future__ import annotations

import pytest

from runner.doctor import Caveat, images_on_nodes
from runner.k8s.images import Reference, lacking, parse, present, session_nodes, tolerates
from runner.settings import KubeSettings

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


@pytest.mark.parametrize("ref, expected", [
    ("python:3.12", Reference("docker.io/library/python", "3.12", None)),
    ("python", Reference("docker.io/library/python", "latest", None)),
    ("team/harness:1", Reference("docker.io/team/harness", "1", None)),
    ("docker.io/python:3.12", Reference("docker.io/library/python", "3.12", None)),
    ("index.docker.io/team/harness", Reference("docker.io/team/harness", "latest", None)),
    ("ghcr.io/probe-runner/harness:0.1.0", Reference("ghcr.io/probe-runner/harness", "0.1.0", None)),
    ("localhost/harness", Reference("localhost/harness", "latest", None)),
    ("registry:5000/team/harness", Reference("registry:5000/team/harness", "latest", None)),  # a port, not a tag
    ("registry:5000/team/harness:2", Reference("registry:5000/team/harness", "2", None)),
    (f"ghcr.io/probe-runner/harness@{D1}", Reference("ghcr.io/probe-runner/harness", None, D1)),
    (f"harness:0.1.0@{D1}", Reference("docker.io/library/harness", "0.1.0", D1)),
])
def test_a_reference_is_read_as_the_runtime_reads_it(ref, expected):
    assert parse(ref) == expected


# What containerd reports for one image: its name by tag and by digest, fully qualified.
PYTHON = ["docker.io/library/python:3.12.8-slim-bookworm", f"docker.io/library/python@{D1}"]
HARNESS = ["ghcr.io/probe-runner/harness:0.1.0", f"ghcr.io/probe-runner/harness@{D2}"]


@pytest.mark.parametrize("ref, names, expected", [
    ("python:3.12.8-slim-bookworm", PYTHON, True),  # short, against the runtime's full name
    ("docker.io/library/python:3.12.8-slim-bookworm", PYTHON, True),
    ("python:3.13", PYTHON, False),  # another tag of the same repository
    (f"python@{D1}", PYTHON, True),
    (f"python@{D2}", PYTHON, False),  # another digest
    (f"python:3.12.8-slim-bookworm@{D2}", PYTHON, False),  # the tag is there, the digest asked for is not
    (f"python:3.13@{D1}", PYTHON, True),  # pulled by the digest: the tag does not count
    ("ghcr.io/probe-runner/harness:0.1.0", HARNESS, True),
    ("ghcr.io/probe-runner/harness", HARNESS, False),  # latest
    (f"ghcr.io/probe-runner/harness@{D2}", HARNESS, True),
    (f"docker.io/probe-runner/harness@{D2}", HARNESS, False),  # the same path at another registry
    ("ghcr.io/probe-runner/harness:0.1.0", [], False),
])
def test_an_image_is_present_by_its_tag_or_by_its_digest(ref, names, expected):
    assert present(ref, names) is expected


@pytest.mark.parametrize("toleration, taint, expected", [
    ({"key": "probes", "operator": "Exists", "effect": "NoSchedule"}, {"key": "probes", "value": "x", "effect": "NoSchedule"}, True),
    ({"key": "probes", "operator": "Exists"}, {"key": "probes", "effect": "NoExecute"}, True),  # no effect: every effect
    ({"key": "probes", "operator": "Exists", "effect": "NoExecute"}, {"key": "probes", "effect": "NoSchedule"}, False),
    ({"key": "probes", "value": "yes"}, {"key": "probes", "value": "yes", "effect": "NoSchedule"}, True),  # Equal by default
    ({"key": "probes", "operator": "Equal", "value": "yes"}, {"key": "probes", "value": "no", "effect": "NoSchedule"}, False),
    ({"key": "probes", "operator": "Equal"}, {"key": "probes", "effect": "NoSchedule"}, True),  # both values empty
    ({"key": "other", "operator": "Exists"}, {"key": "probes", "effect": "NoSchedule"}, False),
    ({"operator": "Exists"}, {"key": "anything", "value": "v", "effect": "NoExecute"}, True),  # tolerates every taint
    ({"operator": "Equal", "value": "v"}, {"key": "anything", "value": "v", "effect": "NoExecute"}, False),  # no key needs Exists
])
def test_a_toleration_tolerates_a_taint_as_the_scheduler_decides(toleration, taint, expected):
    assert tolerates(toleration, taint) is expected


def node(name: str, labels: dict | None = None, taints: list | None = None, images: list | None = None,
         unschedulable: bool = False) -> dict:
    spec: dict = {"taints": taints} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}, "spec": spec,
            "status": {"images": [{"names": n, "sizeBytes": 1} for n in images or []]}}


PROBES = {"key": "probes", "operator": "Exists", "effect": "NoSchedule"}
NODES = [
    node("plain"),
    node("pool-b", {"pool": "probes"}, images=[HARNESS]),
    node("pool-a", {"pool": "probes"}, [{"key": "probes", "value": "true", "effect": "NoSchedule"}]),
    node("pool-prefer", {"pool": "probes"}, [{"key": "busy", "effect": "PreferNoSchedule"}]),  # only discourages
    node("pool-gpu", {"pool": "probes"}, [{"key": "gpu", "effect": "NoSchedule"}]),
    node("pool-evict", {"pool": "probes"}, [{"key": "probes", "effect": "NoExecute"}]),  # PROBES is NoSchedule only
    node("pool-cordoned", {"pool": "probes"}, unschedulable=True),
    node("other-pool", {"pool": "batch"}),
]


@pytest.mark.parametrize("selector, tolerations, expected", [
    ({}, [], ["other-pool", "plain", "pool-b", "pool-prefer"]),
    ({"pool": "probes"}, [], ["pool-b", "pool-prefer"]),
    ({"pool": "probes"}, [PROBES], ["pool-a", "pool-b", "pool-prefer"]),
    ({"pool": "probes"}, [{"operator": "Exists"}], ["pool-a", "pool-b", "pool-evict", "pool-gpu", "pool-prefer"]),
    ({"pool": "probes", "zone": "a"}, [PROBES], []),
])
def test_session_nodes_are_those_the_session_pods_selector_and_tolerations_admit(selector, tolerations, expected):
    assert [n["metadata"]["name"] for n in session_nodes(NODES, selector, tolerations)] == sorted(expected)


def test_lacking_names_the_nodes_whose_reported_images_miss_the_reference():
    nodes = [node("a", images=[HARNESS, PYTHON]), node("b", images=[PYTHON]), node("c"),
             {"metadata": {"name": "d"}}]  # a node that reports no status yet
    assert lacking(nodes, "ghcr.io/probe-runner/harness:0.1.0") == ["b", "c", "d"]
    assert lacking(nodes, f"python@{D1}") == ["c", "d"]


HARNESS_REF, RUNNER_REF = f"ghcr.io/probe-runner/harness@{D2}", "ghcr.io/probe-runner/runner:0.1.0"
RUNNER = ["ghcr.io/probe-runner/runner:0.1.0"]
SETTINGS = KubeSettings(harness_image=HARNESS_REF, reader_image=RUNNER_REF, node_selector={"pool": "probes"},
                        tolerations=[PROBES])


def test_doctor_says_all_session_nodes_have_both_images():
    nodes = [node("p-0", {"pool": "probes"}, images=[HARNESS, RUNNER]), node("elsewhere")]
    assert images_on_nodes(SETTINGS, nodes) == (
        f"all 1 session nodes report the harness image {HARNESS_REF} and the runner image {RUNNER_REF}")


def test_doctor_warns_naming_the_session_nodes_that_lack_an_image():
    nodes = [node("p-0", {"pool": "probes"}, images=[HARNESS, RUNNER]),
             node("p-1", {"pool": "probes"}, [{"key": "probes", "effect": "NoSchedule"}], images=[RUNNER]),
             node("p-2", {"pool": "probes"}),
             node("elsewhere")]  # no session pod lands here: not named
    with pytest.raises(Caveat) as e:
        images_on_nodes(SETTINGS, nodes)
    assert str(e.value) == (
        f"of 3 session nodes, 2 lack the harness image {HARNESS_REF} (p-1, p-2) and 1 lacks the runner image "
        f"{RUNNER_REF} (p-2): the first session pods there wait for the pull (images.prePull.enabled pulls them "
        "ahead); a node reports at most 50 images, its largest (the kubelet's nodeStatusMaxImages), so one it does "
        "not report may still be there")


def test_doctor_names_ten_nodes_and_counts_the_rest():
    nodes = [node(f"p-{i:02}", {"pool": "probes"}, images=[RUNNER]) for i in range(13)]
    with pytest.raises(Caveat) as e:
        images_on_nodes(SETTINGS, nodes)
    assert str(e.value).startswith(
        f"of 13 session nodes, 13 lack the harness image {HARNESS_REF} "
        "(p-00, p-01, p-02, p-03, p-04, p-05, p-06, p-07, p-08, p-09 and 3 more): ")


def test_doctor_warns_when_no_node_admits_session_pods():
    with pytest.raises(Caveat) as e:
        images_on_nodes(SETTINGS, [node("elsewhere"), node("p-0", {"pool": "probes"}, unschedulable=True)])
    assert str(e.value) == ('none of the 2 nodes admits session pods (nodeSelector {"pool": "probes"}, 1 tolerations, '
                            "cordoned nodes left out): session pods wait until one does")
