"""The node tier's local registry (tests/node/registry.py), shown without a node: Debian's
registry on loopback, images pushed from OCI archives as images.sh writes them, and a throwaway
containerd 1.6 (Debian's, the node's) whose CRI plugin has only ``containerd_mirror``'s lines
for registries.

What this shows: a CRI PullImage of the image's real reference (ghcr.io/..., registry.k8s.io/...),
the call the kubelet makes for a pod's image (tests/support/cri.py), is served by the local
registry over plain HTTP (its access log has containerd's requests, ``ns=`` the mirrored
registry) and yields the pushed image's ID; a push of an image already there uploads nothing;
a new image pushed under the same tag replaces the old one for the next pull. The pulls go
nowhere else: this machine reaches no image registry, and containerd's root starts empty.

What only the node tier shows: the kubelet pulling through these lines in the node's own
containerd (its network namespace reaching the registry on the host-side address) for a pod
whose image is not imported, and the time that takes for the ~1 GB harness image."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import cri
from support.containerd import config_head
from support.waiting import stopped, until

from tests.node.registry import containerd_mirror, serve_registry, split_reference


def tiny_archive(work: Path, reference: str, content: str) -> tuple[Path, str]:
    """An OCI archive of one image (one file, ``content``) written as images.sh writes its
    archives (`buildah push ref oci-archive:path:ref`), with a buildah storage of its own
    (nothing shared with images.sh's): (archive, image ID)."""
    work.mkdir(parents=True)
    buildah = ["buildah", "--root", str(work / "storage"), "--runroot", str(work / "run"), "--storage-driver", "vfs"]

    def run(*args: str) -> str:
        return subprocess.run([*buildah, *args], check=True, capture_output=True, text=True).stdout.strip()

    (work / "file").write_text(content)
    container = run("from", "scratch")
    run("copy", container, str(work / "file"), "/file")
    image_id = run("commit", "--quiet", container, reference)
    archive = work / "image.oci.tar"
    run("push", "--quiet", reference, f"oci-archive:{archive}:{reference}")
    return archive, f"sha256:{image_id}"


@contextlib.contextmanager
def containerd(mirror: str) -> Iterator[Path]:
    """Debian's containerd with its CRI plugin and ``mirror`` appended to its config, its
    root, state and socket in a directory of its own (short: a unix socket's path has at
    most 107 bytes): its socket, once it answers."""
    work = Path(tempfile.mkdtemp(prefix="prn-ctrd-"))
    sock = work / "containerd.sock"
    (work / "config.toml").write_text(config_head(work / "root", work / "state", sock) + f"""\
[plugins."io.containerd.internal.v1.opt"]
  path = "{work / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
""" + mirror)
    log = work / "containerd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["containerd", "--config", str(work / "config.toml")],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def seen() -> str:
            return log.read_text(errors="replace")[-3000:]

        def up() -> bool:
            assert proc.poll() is None, f"containerd exited {proc.returncode}:\n{seen()}"
            return sock.exists()

        until(up, 30, "containerd's socket", seen=seen)
        yield sock
    finally:
        stopped(proc)
        shutil.rmtree(work, ignore_errors=True)


def pull(sock: Path, reference: str) -> str:
    try:
        return cri.pull_image(sock, reference, timeout=120)
    except cri.CriError as exc:
        log = (sock.parent / "containerd.log").read_text(errors="replace")
        raise AssertionError(f"{exc}\n{[line for line in log.splitlines() if 'PullImage' in line][-3:]}") from exc


def uploads(log: Path) -> int:
    """Blob uploads the registry's access log records (a push of a new blob starts with one)."""
    return sum('"POST /v2/' in line and "/blobs/uploads/" in line for line in log.read_text().splitlines())


@pytest.mark.parametrize("reference", ["ghcr.io/probe-runner/registry-test:0.1.0",
                                       "registry.k8s.io/registry-test/pause:3.10"])
def test_the_cri_pulls_an_image_by_its_real_reference_from_the_local_registry(tmp_path: Path, reference: str) -> None:
    archive, image_id = tiny_archive(tmp_path / "image", reference, f"{reference} {time.time_ns()}\n")
    manifest = json.load(tarfile.open(archive).extractfile("index.json"))["manifests"][0]["digest"]
    with serve_registry("127.0.0.1", tmp_path / "registry") as registry:
        start = time.monotonic()
        assert registry.push(archive, reference) == manifest  # digests preserved
        pushed = time.monotonic() - start
        before = uploads(registry.log)
        assert before >= 1
        start = time.monotonic()
        assert registry.push(archive, reference) == manifest
        pushed_again = time.monotonic() - start
        assert uploads(registry.log) == before  # nothing copied the second time
        with containerd(containerd_mirror(registry.url)) as sock:
            start = time.monotonic()
            assert pull(sock, reference) == image_id
            pulled = time.monotonic() - start
        host, repository, tag = split_reference(reference)
        access = registry.log.read_text()
        assert f'"GET /v2/{repository}/manifests/{manifest}?ns={host} HTTP/1.1" 200' in access, registry.seen()
        assert f'"HEAD /v2/{repository}/manifests/{tag}?ns={host} HTTP/1.1" 200' in access, registry.seen()
    print(f"{reference}: push {pushed:.2f} s, again {pushed_again:.3f} s, CRI pull {pulled:.2f} s "
          f"({archive.stat().st_size} bytes)")


def test_a_new_image_pushed_under_the_same_tag_is_the_one_pulled(tmp_path: Path) -> None:
    """images.sh rebuilds the harness under the same reference when runner/ changes: the
    registry must not keep serving the old one."""
    reference = "ghcr.io/probe-runner/registry-test:0.1.0"
    old, _ = tiny_archive(tmp_path / "old", reference, "old\n")
    new, new_id = tiny_archive(tmp_path / "new", reference, "new\n")
    with serve_registry("127.0.0.1", tmp_path / "registry") as registry:
        first = registry.push(old, reference)
        second = registry.push(new, reference)
        assert second != first
        assert registry.manifest_digest("probe-runner/registry-test", "0.1.0") == second
        with containerd(containerd_mirror(registry.url)) as sock:
            assert pull(sock, reference) == new_id


def test_the_registry_keeps_its_images_across_restarts(tmp_path: Path) -> None:
    """A ``work`` kept between runs (the node tier's cache) keeps the images: a push then
    uploads nothing."""
    reference = "ghcr.io/probe-runner/registry-test:0.1.0"
    archive, _ = tiny_archive(tmp_path / "image", reference, "kept\n")
    with serve_registry("127.0.0.1", tmp_path / "registry") as registry:
        digest = registry.push(archive, reference)
        before = uploads(registry.log)
    with serve_registry("127.0.0.1", tmp_path / "registry") as registry:
        assert registry.push(archive, reference) == digest
        assert uploads(registry.log) == before


def test_the_mirror_lines_and_references() -> None:
    assert containerd_mirror("10.0.0.1:5000") == (
        '[plugins."io.containerd.grpc.v1.cri".registry.mirrors."ghcr.io"]\n'
        '  endpoint = ["http://10.0.0.1:5000"]\n'
        '[plugins."io.containerd.grpc.v1.cri".registry.mirrors."registry.k8s.io"]\n'
        '  endpoint = ["http://10.0.0.1:5000"]\n')
    assert split_reference("ghcr.io/probe-runner/harness:0.1.0") == ("ghcr.io", "probe-runner/harness", "0.1.0")
    assert split_reference("registry.k8s.io/coredns/coredns:v1.15.0") == ("registry.k8s.io", "coredns/coredns", "v1.15.0")
    assert split_reference("localhost:5000/x:1") == ("localhost:5000", "x", "1")
    assert split_reference("busybox:1") == ("docker.io", "library/busybox", "1")
    for bad in ("ghcr.io/probe-runner/harness", "ghcr.io/x@sha256:00", "localhost:5000/x"):
        with pytest.raises(ValueError, match="with a tag"):
            split_reference(bad)
