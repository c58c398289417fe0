"""A local image registry the node can pull from (issue 31, item 5): a cold first wave needs
the kubelet to really pull the harness image, and this machine reaches no image registry.

Debian's registry (distribution 2.8, `docker-registry`, installed by .ci/setup) serves plain
HTTP on an address of this machine; `Registry.push` copies an OCI archive of images.sh into it
with Debian's skopeo, under the repository path and tag of the image's own reference;
`containerd_mirror` is the containerd 1.6 configuration that sends the node's pulls of
ghcr.io and registry.k8s.io images there, so the pod specs keep their real references.

Imported by tests/node/conftest.py (through its ``_load``) and by
tests/integration/test_node_registry.py, which shows it working without a node."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ports import free_port  # tests/ is on the path (tests/conftest.py)
from support.waiting import stopped, until

log = logging.getLogger(__name__)

REGISTRY = "/usr/bin/docker-registry"
SKOPEO = "/usr/bin/skopeo"
# What a HEAD of a manifest accepts: the OCI manifest images.sh writes, and the others a
# registry may hold under a tag (else distribution answers with a converted schema 1 manifest).
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json"])


def split_reference(reference: str) -> tuple[str, str, str]:
    """(registry host, repository path, tag) of an image reference with a tag:
    ghcr.io/probe-runner/harness:0.1.0 -> (ghcr.io, probe-runner/harness, 0.1.0); a reference
    without a host is Docker Hub's, as containerd reads it (busybox:1 -> docker.io, library/busybox)."""
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag or "@" in reference or not name:
        raise ValueError(f"{reference!r}: an image reference with a tag and no digest is needed (host/path:tag)")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return "docker.io", name if slash else f"library/{name}", tag


def archive_manifest(archive: Path) -> str:
    """The digest of the one manifest in an OCI archive (as `buildah push ref oci-archive:...`
    writes it), read from its index.json without unpacking its layers."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            index = json.load(member) if member else {}
    except (OSError, KeyError, tarfile.TarError, json.JSONDecodeError) as exc:
        raise ValueError(f"{archive}: not an OCI archive ({exc})") from exc
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise ValueError(f"{archive}: one image per archive is expected, found {len(manifests)} manifests")
    return str(manifests[0]["digest"])


@dataclass
class Registry:
    url: str      # host:port, plain HTTP
    work: Path    # its configuration, storage (work/storage) and log
    log: Path

    def manifest_digest(self, repository: str, tag: str) -> str | None:
        """The digest of the manifest ``repository:tag`` names here, None if it names none."""
        req = urllib.request.Request(f"http://{self.url}/v2/{repository}/manifests/{tag}", method="HEAD",
                                     headers={"Accept": MANIFEST_TYPES})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return str(r.headers["Docker-Content-Digest"])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def push(self, archive: Path, reference: str) -> str:
        """Copy the image of ``archive`` here as ``reference``'s repository path and tag
        (ghcr.io/probe-runner/harness:0.1.0 -> <url>/probe-runner/harness:0.1.0), digests
        preserved: the manifest digest. Nothing is copied when the tag already names that
        manifest (skopeo would still unpack the whole archive to compare its blobs)."""
        _, repository, tag = split_reference(reference)
        digest = archive_manifest(archive)
        if self.manifest_digest(repository, tag) == digest:
            log.info("%s: %s already at %s", self.url, reference, digest)
            return digest
        if not Path(SKOPEO).exists():
            raise RuntimeError(f"{SKOPEO} is missing: apt-get install skopeo (.ci/setup installs it)")
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            digestfile = Path(tmp) / "digest"
            done = subprocess.run(
                [SKOPEO, "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false",
                 "--digestfile", str(digestfile), f"oci-archive:{archive}", f"docker://{self.url}/{repository}:{tag}"],
                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=1800)
            if done.returncode != 0:
                raise RuntimeError(f"skopeo copy of {archive} to {self.url} failed ({done.returncode}): "
                                   f"{done.stderr.strip()[-2000:]}")
            pushed = digestfile.read_text().strip()
        log.info("%s: pushed %s as %s in %.1f s", self.url, reference, pushed, time.monotonic() - start)
        return pushed

    def seen(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


@contextlib.contextmanager
def serve_registry(host: str, work: Path) -> Iterator[Registry]:
    """Debian's registry on ``host`` (an address of this machine) and a free port, plain
    HTTP, its blobs under ``work``/storage (a ``work`` kept between runs keeps them, and a
    push of an image already there copies nothing); ready (GET /v2/ answers 200) when
    yielded, stopped at exit."""
    if not Path(REGISTRY).exists():
        raise RuntimeError(f"{REGISTRY} is missing: apt-get install docker-registry (.ci/setup installs it)")
    work.mkdir(parents=True, exist_ok=True)
    port = free_port(host)
    url = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    config = {  # JSON is YAML
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(work / "storage")}, "delete": {"enabled": False}},
        # A secret of its own, or it makes one and warns; no debug server, no auth.
        "http": {"addr": url, "secret": secrets.token_hex(16)},
    }
    (work / "registry.yml").write_text(json.dumps(config, indent=1))
    served = Registry(url, work, work / "registry.log")
    with served.log.open("ab") as out:
        proc = subprocess.Popen([REGISTRY, "serve", str(work / "registry.yml")],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"the registry exited {proc.returncode}:\n{served.seen()}"
            try:
                with urllib.request.urlopen(f"http://{url}/v2/", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        until(ready, 30, f"the registry answering on http://{url}/v2/", interval=0.1, seen=served.seen)
        log.info("registry on http://%s, storage %s", url, work / "storage")
        yield served
    finally:
        stopped(proc)


def containerd_mirror(registry_url: str, registries: Sequence[str] = ("ghcr.io", "registry.k8s.io")) -> str:
    """The lines to append to containerd 1.6's config (version 2) that make its CRI plugin
    pull every image of ``registries`` from ``registry_url`` (host:port) over plain HTTP; the
    kubelet keeps asking for ghcr.io/probe-runner/harness:0.1.0.

    The CRI plugin's ``registry.mirrors`` (docs/cri/registry.md of containerd 1.6) rather than
    its newer ``config_path``: these lines are all it takes, where config_path needs a
    hosts.toml per registry in a directory the node's containerd reads. 1.6 reads mirrors with
    a deprecation warning, and refuses a config with both (the node's sets neither). A pull the
    mirror cannot serve goes on to the registry itself (https://ghcr.io), which this machine
    cannot reach."""
    endpoint = json.dumps(f"http://{registry_url}")
    return "".join(f'[plugins."io.containerd.grpc.v1.cri".registry.mirrors.{json.dumps(r)}]\n'
                   f"  endpoint = [{endpoint}]\n" for r in registries)
