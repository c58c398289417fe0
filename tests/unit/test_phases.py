"""Start phases (issue 31, item 2): the pure builders. A session's milestones make its phases
(runner/phases.py), a campaign's sessions their percentiles and the slowest of them; the pod
watch's states make the pod's milestones, in order only (runner/k8s/podstate.py); the entry
point's termination message is read strictly; the first reply is the first byte after the
stream's first line."""

from __future__ import annotations

import json

import pytest

from runner.entrypoints.pod import harness_report
from runner.executors.base import Phases
from runner.executors.kubernetes import PodMilestones
from runner.k8s import podstate
from runner.phases import ORDER, PHASES, FirstReply, PhaseStats, PhaseSummary, Slow, durations, percentile, summary


def at(seconds: float) -> str:
    """A stamp ``seconds`` after midnight, as runner.clock.now() writes one."""
    whole, ms = divmod(round(seconds * 1000), 1000)
    return f"2026-01-01T00:{whole // 60:02d}:{whole % 60:02d}.{ms:03d}Z"


def test_the_milestones_are_the_capture_records_phases_and_every_phase_ends_at_one():
    assert [k for k in Phases.__annotations__ if k != "policy_wait_seconds"] == list(ORDER)
    assert PHASES == ORDER[1:] and "queued" not in PHASES
    assert set(podstate.POD_MILESTONES) <= set(ORDER)
    assert [m for m in ORDER if m in podstate.POD_MILESTONES] == list(podstate.POD_MILESTONES)  # the same order


def test_a_phase_lasts_from_the_milestone_before_it_that_is_there():
    """The local executor has no pod: from the slot to the harness's start is one phase, the
    harness's; a duration that is not a milestone is no phase; a negative one is kept."""
    local = {"queued": at(0), "slot_held": at(0.25), "harness_started": at(1.5), "first_reply": at(4),
             "harness_exited": at(30), "stream_collected": at(30.1), "artifacts_collected": at(30.35),
             "outcome_journaled": at(30.4)}
    assert durations(local) == {"slot_held": 0.25, "harness_started": 1.25, "first_reply": 2.5, "harness_exited": 26.0,
                                "stream_collected": 0.1, "artifacts_collected": 0.25, "outcome_journaled": 0.05}
    pod: Phases = {"queued": at(0), "budget_held": at(1), "slot_held": at(1), "pod_created": at(1.1), "scheduled": at(1.2),
                   "image_pulled": at(3.2), "containers_started": at(3.2), "workspace_delivered": at(3.5),
                   "harness_started": at(3.4), "policy_wait_seconds": 0.9, "harness_exited": at(10)}
    assert durations(pod) == {"budget_held": 1.0, "slot_held": 0.0, "pod_created": 0.1, "scheduled": 0.1, "image_pulled": 2.0,
                              "containers_started": 0.0, "workspace_delivered": 0.3, "harness_started": -0.1,
                              "harness_exited": 6.6}
    assert durations({"queued": at(0)}) == {} and durations({}) == {}


def test_percentiles_are_by_the_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert [percentile(values, p) for p in (50, 95, 99, 100)] == [50.0, 95.0, 99.0, 100.0]
    assert [percentile([3.0, 1.0, 2.0], p) for p in (50, 95, 99)] == [2.0, 3.0, 3.0]
    assert percentile([7.0], 99) == 7.0


def test_a_campaigns_summary_has_each_phases_percentiles_and_its_slowest_sessions():
    sessions = {
        "P-1/present-001": {"queued": at(0), "slot_held": at(0), "harness_started": at(1), "harness_exited": at(11),
                            "outcome_journaled": at(11.5)},
        "P-1/absent-001": {"queued": at(0), "slot_held": at(5), "harness_started": at(6), "harness_exited": at(9),
                           "outcome_journaled": at(9.5)},
        "P-2/present-001": {"queued": at(0), "slot_held": at(0), "harness_started": at(3), "harness_exited": at(6),
                            "outcome_journaled": at(6.25)},
        "P-2/absent-001": {"queued": at(0)},  # refused before it ran: no phase
    }
    assert summary(sessions, slowest=2) == PhaseSummary(
        phases={"slot_held": PhaseStats(3, 0.0, 5.0, 5.0), "harness_started": PhaseStats(3, 1.0, 3.0, 3.0),
                "harness_exited": PhaseStats(3, 3.0, 10.0, 10.0), "outcome_journaled": PhaseStats(3, 0.5, 0.5, 0.5)},
        slowest=[Slow("P-1/present-001", 11.5, "harness_exited", 10.0), Slow("P-1/absent-001", 9.5, "slot_held", 5.0)])
    assert summary({}) == PhaseSummary({}, [])


@pytest.mark.parametrize(("chunks", "at_chunk"), [
    ([b'{"type":"system"}\n{"type":"assistant"}\n'], 0),   # the init line and the reply in one read
    ([b'{"type":"sys', b'tem"}\n', b'{"type":"assistant"'], 2),  # the init line split; the reply after it
    ([b'{"type":"system"}\n', b'', b'{'], 2),                # an empty read is no byte
    ([b'{"type":"system"}'], None),                          # no line ended: no reply
    ([b'{"type":"system"}\n'], None),                        # the init line alone
])
def test_the_first_reply_is_the_first_byte_after_the_first_line(chunks, at_chunk):
    reply = FirstReply()
    seen = [reply.saw(c) for c in chunks]
    assert seen == [i == at_chunk for i in range(len(chunks))]
    # a line's end and bytes after it: the reply where none came yet, and never a second one
    assert reply.saw(b"}\n{}\n") is (at_chunk is None)


def pod(node: str | None = None, ready: str | None = None, **containers: dict) -> dict:
    status: dict = {"containerStatuses": [{"name": n, **cs} for n, cs in containers.items()]}
    if ready is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}, {"type": "PodReadyToStartContainers", "status": ready}]
    return {"metadata": {"name": "p"}, "spec": {"nodeName": node} if node else {}, "status": status}


CREATING = {"state": {"waiting": {"reason": "ContainerCreating"}}, "imageID": ""}
RUNNING = {"state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}, "imageID": "docker.io/x@sha256:ab"}


@pytest.mark.parametrize(("state", "shown", "waits_in"), [
    (pod(), ["pod_created"], "scheduled"),
    (pod("n-0"), ["pod_created", "scheduled"], "image_pulled"),  # a kubelet that reports no sandbox condition
    (pod("n-0", "False", reader=CREATING, harness=CREATING), ["pod_created", "scheduled"], "sandbox_ready"),
    (pod("n-0", "True", reader=CREATING, harness=CREATING), ["pod_created", "scheduled", "sandbox_ready"], "image_pulled"),
    # the reader made (its imageID) but not running yet: its image was pulled
    (pod("n-0", "True", reader={"state": {"waiting": {"reason": "ContainerCreating"}}, "imageID": "sha256:ab"}, harness=CREATING),
     ["pod_created", "scheduled", "sandbox_ready", "image_pulled"], "containers_started"),
    (pod("n-0", "True", reader=RUNNING, harness=CREATING),
     ["pod_created", "scheduled", "sandbox_ready", "image_pulled", "containers_started"], "containers_started"),
    (pod("n-0", reader=CREATING, harness={"state": {"terminated": {"exitCode": 0}}}),  # the harness ended, the reader not up
     ["pod_created", "scheduled", "image_pulled"], "containers_started"),
])
def test_a_pods_state_shows_its_milestones_and_the_phase_it_waits_in(state, shown, waits_in):
    assert podstate.reached(state) == shown
    assert podstate.waiting_phase(state) == waits_in


def test_a_pod_not_yet_seen_waits_to_be_created():
    assert podstate.waiting_phase(None) == "pod_created"


def test_a_milestone_seen_after_a_later_one_stays_unstamped():
    assert podstate.unstamped({}, ["pod_created", "scheduled"]) == ["pod_created", "scheduled"]
    assert podstate.unstamped({"pod_created", "scheduled"}, ["pod_created", "scheduled", "image_pulled"]) == ["image_pulled"]
    # a kubelet that set PodReadyToStartContainers only after the reader ran: too late to be that phase's end
    assert podstate.unstamped({"pod_created", "containers_started"}, ["pod_created", "sandbox_ready", "containers_started"]) == []


def test_the_watch_stamps_only_the_pods_it_tracks_from_before_their_create():
    seen = PodMilestones()
    seen.saw("adopted", pod("n-0", reader=RUNNING))  # a pod first seen running (a restart): nothing
    assert seen.take("adopted") == {}
    seen.track("p")
    seen.saw("p", pod())
    seen.stamp("p", "pod_created")  # the create returned after the watch told of the pod: already stamped
    seen.saw("p", pod("n-0", reader=CREATING, harness=CREATING))
    seen.saw("p", pod("n-0", reader=RUNNING, harness=CREATING))
    seen.saw("p", pod("n-0", "True", reader=RUNNING, harness=RUNNING))  # the sandbox condition, late: not stamped
    stamps = seen.take("p")
    assert list(stamps) == ["pod_created", "scheduled", "image_pulled", "containers_started"]
    assert stamps["pod_created"] <= stamps["scheduled"] <= stamps["image_pulled"] == stamps["containers_started"]
    seen.track("p")  # created again: from nothing
    assert seen.take("p") == {}
    seen.forget("p")
    seen.saw("p", pod())
    assert seen.take("p") == {}


def test_the_entry_points_report_is_read_strictly():
    good = {"harness_started": "2026-01-01T00:00:03.250Z", "policy_wait_seconds": 1.25}
    assert harness_report(json.dumps(good)) == good
    assert harness_report(json.dumps({**good, "policy_wait_seconds": 0})) == {**good, "policy_wait_seconds": 0.0}
    for bad in (None, "", "not json", "[]", json.dumps({**good, "extra": 1}), json.dumps({"harness_started": good["harness_started"]}),
                json.dumps({**good, "harness_started": "yesterday"}), json.dumps({**good, "harness_started": 5}),
                json.dumps({**good, "policy_wait_seconds": True}), json.dumps({**good, "policy_wait_seconds": -1}),
                json.dumps({**good, "policy_wait_seconds": "1"})):
        assert harness_report(bad) is None, bad
